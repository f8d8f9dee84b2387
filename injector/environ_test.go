package injector

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestEnvironHasTellsKernelThreadsAndEmptyEnvironments: environHas waits a
// moment on an empty environ only for a process in the middle of execve; a
// kernel thread, and a user process that truly has no environment (its argv
// still reads), are answered at once and read as not holding kv.
func TestEnvironHasTellsKernelThreadsAndEmptyEnvironments(t *testing.T) {
	if st, err := readStat(os.Getpid()); err != nil || st.flags&pfKthread != 0 {
		t.Fatalf("own stat: flags %#x, %v: want a user process", st.flags, err)
	}
	if st, err := readStat(2); err == nil && st.comm == "kthreadd" {
		if st.flags&pfKthread == 0 {
			t.Fatalf("kthreadd flags %#x lack PF_KTHREAD", st.flags)
		}
		if midExec(2) {
			t.Fatal("kthreadd taken for a process in the middle of execve")
		}
	}
	if !environHas(os.Getpid(), "PATH="+os.Getenv("PATH")) {
		t.Fatal("own environment not read")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("no sleep binary: %v", err)
	}
	c := exec.Command(sleep, "30")
	c.Env = []string{} // an empty environment, for good
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Process.Kill(); _ = c.Wait() }()
	// Start returns once the exec closed its close-on-exec pipe, which is
	// before the kernel sets the new argv and env ranges: the window
	// midExec is for. Past it, the argv reads.
	waitFor(t, "the child's argv", 30*time.Second, func() bool { return len(cmdline(c.Process.Pid)) > 0 })
	if midExec(c.Process.Pid) {
		t.Fatal("a process with no environment but its argv taken for one in the middle of execve (scans would wait on it)")
	}
	if environHas(c.Process.Pid, "PATH="+os.Getenv("PATH")) {
		t.Fatal("a process with no environment read as holding PATH")
	}
}
