package nodeagent_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/vmctl"
)

// TestCreatedIsInFlightNotRemoved: a `vm run` parked between its created
// commit and its start (ops lock free, as in the field's manager) holds the
// name the agent wants. The agent must treat created as an operation in
// flight: vm start finishes it and the agent adopts that VM; the run, once
// released, completes too (its start adopts the live VMM). Removing the
// record (the old default) would make the run fail and bind another id.
func TestCreatedIsInFlightNotRemoved(t *testing.T) {
	s := newStack(t)
	_ = os.Remove(filepath.Join(s.ctl, "vm.create.created.release"))
	cmd := exec.Command(filepath.Join(s.bin, "vmctl"), "vm", "run", "--name", "web", filepath.Join(s.dir, "guest.img"))
	cmd.Env = append(append(os.Environ(), s.env...), fp("vm.create.created=pause")...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var runErr error
	go func() { runErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	if pid := s.parked("vm.create.created"); pid != cmd.Process.Pid {
		t.Fatalf("parked pid %d is not our run %d", pid, cmd.Process.Pid)
	}
	run := s.vmByName("web")
	if run == nil || run.State != vmctl.StateCreated {
		t.Fatalf("want web created while parked: %+v", run)
	}
	s.startAgent(nil)
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	v := s.waitGoal("web", nodeagent.LifecycleReady, budget)
	if v.Status.VMID != run.ID {
		t.Fatalf("agent bound %s, want the in-flight run's %s (it removed the created record)", v.Status.VMID, run.ID)
	}
	s.release("vm.create.created")
	<-done
	if runErr != nil {
		t.Fatalf("the run after the agent finished it: %v\n%s", runErr, errb.String())
	}
	if got := strings.TrimSpace(out.String()); got != run.ID {
		t.Fatalf("run printed %q, want %s", got, run.ID)
	}
	if now := s.vmByName("web"); now == nil || now.ID != run.ID || now.State != vmctl.StateRunning {
		t.Fatalf("after both: %+v", now)
	}
	s.checkStore()
}
