package runner

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
)

// argvOf is pid's command line (nil when gone).
func argvOf(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// alive reports whether pid is a live, non-zombie process.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	st, err := injector.ReadStat(pid)
	return err == nil && st.State != 'Z'
}

// killPID SIGKILLs a process of a manager case through a pidfd (identified
// by pid and start time, so a reused pid is never hit) and waits until it is
// gone (the one reaper collects a VMM orphaned to the runner). It returns
// the CLOCK_MONOTONIC time right after the signal was sent.
func killPID(pid int) (int64, error) {
	p, err := injector.Identify(pid)
	if err != nil {
		return 0, fmt.Errorf("identify %d: %w", pid, err)
	}
	fd, err := injector.OpenPidFD(p)
	if err != nil {
		return 0, fmt.Errorf("pidfd %d: %w", pid, err)
	}
	defer fd.Close()
	if err := fd.Signal(syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("kill %d: %w", pid, err)
	}
	sent := failpoint.Now()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(pid) {
		return sent, fmt.Errorf("pid %d still alive 10s after SIGKILL", pid)
	}
	return sent, nil
}
