package runner

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/reports"
)

// A frozen agent is told apart from a running one by its /proc state: the
// while-down judgement of a double fault rests on it.
func TestProcStateSeesAStoppedProcess(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	if st := procState(pid); st != 'S' && st != 'R' {
		t.Fatalf("running sleep in state %q", st)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for procState(pid) != 'T' {
		if time.Now().After(deadline) {
			t.Fatalf("stopped sleep in state %q", procState(pid))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := procState(1 << 30); st != 0 {
		t.Errorf("state of a pid that does not exist: %q", st)
	}
}

func TestFirstInjectionIsTheEarliestDelivered(t *testing.T) {
	got := firstInjection([]reports.Injection{{Fault: "b", ActualNs: 20}, {Fault: "none", ActualNs: 0}, {Fault: "a", ActualNs: 10}})
	if got.Fault != "a" {
		t.Errorf("first = %q", got.Fault)
	}
	if firstInjection(nil).ActualNs != 0 {
		t.Error("no injection must give the zero record")
	}
}
