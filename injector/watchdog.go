package injector

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// envWatchdog turns a process started from this binary into the watchdog
// of a builtin supervisor; its value is the run tag whose processes it kills.
const envWatchdog = "VMCHAOS_INJECTOR_WATCHDOG"

// Builtin units must die with the harness, also when it is SIGKILLed. Not
// through Pdeathsig: it fires when the forking *thread* exits, which with
// Go's threads (and locked ones) kills units while the harness lives. Each
// builtin supervisor instead starts one watchdog: this binary re-executed,
// holding the read end of a pipe whose write end only the harness holds
// (close-on-exec, so no unit inherits it). When the harness dies, the kernel
// closes the write end, the watchdog reads EOF and SIGKILLs every process
// carrying the run's tag, then exits. A normal Close closes the pipe too,
// after the units are gone, and waits for the watchdog.
func init() {
	if tag := os.Getenv(envWatchdog); tag != "" {
		os.Exit(runWatchdog(os.NewFile(3, "watch"), tag))
	}
}

type watchdog struct {
	w    *os.File
	done chan struct{}
	pid  int
}

// startWatchdog starts the watchdog of rec's run.
func startWatchdog(rec *Record) (*watchdog, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	defer r.Close()
	cmd := &exec.Cmd{
		Path: exe, Args: []string{exe},
		Env:        append(os.Environ(), envWatchdog+"="+rec.Tag()),
		ExtraFiles: []*os.File{r},
		// Its own session: a terminal's SIGINT to the harness's group
		// must not take the watchdog before the units.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	// The reaper leaves it to cmd.Wait.
	reaper.mains.Store(cmd.Process.Pid, true)
	wd := &watchdog{w: w, done: make(chan struct{}), pid: cmd.Process.Pid}
	go func() {
		_ = cmd.Wait()
		reaper.mains.Delete(wd.pid)
		close(wd.done)
	}()
	return wd, nil
}

// stop closes the pipe and waits for the watchdog to exit.
func (wd *watchdog) stop() error {
	if wd == nil {
		return nil
	}
	wd.w.Close()
	select {
	case <-wd.done:
		return nil
	case <-time.After(2 * killWait):
		return fmt.Errorf("watchdog pid %d: still running %v after its pipe closed", wd.pid, 2*killWait)
	}
}

// runWatchdog waits for EOF on watch, then SIGKILLs every process carrying
// tag until none is left (bounded): processes forking meanwhile are caught
// by the next pass. It returns the exit status.
func runWatchdog(watch *os.File, tag string) int {
	_, _ = io.Copy(io.Discard, watch)
	self := os.Getpid()
	deadline := time.Now().Add(killWait)
	for {
		n := 0
		for _, pid := range allPIDs() {
			if pid == self || !environHas(pid, tag) {
				continue
			}
			if st, err := readStat(pid); err == nil && st.state != 'Z' {
				_ = signalProc(Proc{PID: pid, Start: st.start}, syscall.SIGKILL)
				n++
			}
		}
		if n == 0 {
			return 0
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "vmchaos watchdog: %d process(es) of %s survive SIGKILL\n", n, tag)
			return 1
		}
		time.Sleep(10 * time.Millisecond)
	}
}
