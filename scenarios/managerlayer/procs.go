package managerlayer

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
)

// reaper makes this process a child subreaper and reaps the zombies of the
// VMMs that were reparented to it when the verb that launched them died: a
// manager's liveness check (kill(pid, 0)) sees an unreaped zombie as alive,
// so without this a killed VMM would never look dead. It reaps only
// zombies whose command name it was told (the VMM's), never a child that
// an exec.Cmd of this process waits for (the verbs, the adapters' tools).
type reaper struct {
	mu    sync.Mutex
	names map[string]bool // /proc/PID/comm of orphans to reap
	stop  chan struct{}
	done  chan struct{}
}

func startReaper(names ...string) (*reaper, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("managerlayer: PR_SET_CHILD_SUBREAPER: %w", err)
	}
	r := &reaper{names: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	for _, n := range names {
		r.names[comm(n)] = true
	}
	go func() {
		defer close(r.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				r.sweep()
				return
			case <-t.C:
				r.sweep()
			}
		}
	}()
	return r, nil
}

// comm is the kernel's 15-byte task name of a binary.
func comm(name string) string {
	name = filepath.Base(name)
	if len(name) > 15 {
		return name[:15]
	}
	return name
}

func (r *reaper) sweep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	self := os.Getpid()
	for _, pid := range childPIDs(self) {
		st, err := injector.ReadStat(pid)
		if err != nil || st.State != 'Z' {
			continue
		}
		c, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || !r.names[strings.TrimSpace(string(c))] {
			continue
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}

func (r *reaper) Close() {
	close(r.stop)
	<-r.done
}

// childPIDs lists the children of pid over all its threads (an orphan is
// attached to any thread of a subreaper).
func childPIDs(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// proc is one live process seen in /proc.
type proc struct {
	PID  int
	Argv []string
}

// tagged lists the live (non-zombie) processes whose environment carries
// tag (KEY=VALUE): every process of a case inherits the case tag, VMMs
// included, so a scan finds them after they were reparented.
func tagged(tag string) []proc {
	var out []proc
	ents, _ := os.ReadDir("/proc")
	want := []byte(tag)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil || !hasEntry(env, want) {
			continue
		}
		if st, err := injector.ReadStat(pid); err != nil || st.State == 'Z' {
			continue
		}
		out = append(out, proc{PID: pid, Argv: argvOf(pid)})
	}
	return out
}

func hasEntry(environ, kv []byte) bool {
	for _, e := range bytes.Split(environ, []byte{0}) {
		if bytes.Equal(e, kv) {
			return true
		}
	}
	return false
}

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

// killPID SIGKILLs a process of the case through a pidfd (identified by pid
// and start time, so a reused pid is never hit) and waits until it is gone.
// It returns the CLOCK_MONOTONIC time right after the signal was sent.
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
