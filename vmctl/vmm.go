package vmctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/timescale"
	"golang.org/x/sys/unix"
)

// readCmdline returns the argv of pid, or nil when it is gone (or a zombie).
func readCmdline(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// argsHaveSocket reports whether argv names sock as its API socket.
func argsHaveSocket(argv []string, sock string) bool {
	for _, a := range argv[1:] {
		if a == sock || a == "path="+sock || strings.HasPrefix(a, "path="+sock+",") {
			return true
		}
	}
	return false
}

// isOurVMM is the VMM identity rule: argv[0]'s basename is the CH binary's
// name and the arguments name this VM's api.sock. A PID failing it is never
// signalled, whatever the record says (PIDs get reused).
func (m *Manager) isOurVMM(pid int, id string) bool {
	if pid <= 0 {
		return false
	}
	argv := readCmdline(pid)
	if len(argv) == 0 || filepath.Base(argv[0]) != m.chName {
		return false
	}
	return argsHaveSocket(argv, m.apiSocket(id))
}

// vmmAlive reports whether the recorded VMM of v is alive.
func (m *Manager) vmmAlive(v *VM) bool { return m.isOurVMM(v.Pid, v.ID) }

// findVMMs scans /proc for every live VMM process of ours, keyed by VM id
// (taken from the api.sock path under the run dir). It finds VMMs a crashed
// verb launched but never recorded.
func (m *Manager) findVMMs() map[string][]int {
	out := map[string][]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	prefix := m.cfg.RunDir + string(os.PathSeparator)
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		argv := readCmdline(pid)
		if len(argv) < 2 || filepath.Base(argv[0]) != m.chName {
			continue
		}
		for _, a := range argv[1:] {
			p := strings.TrimPrefix(a, "path=")
			if i := strings.IndexByte(p, ','); i >= 0 {
				p = p[:i]
			}
			if strings.HasPrefix(p, prefix) && strings.HasSuffix(p, "/api.sock") {
				id := filepath.Base(filepath.Dir(p))
				if filepath.Dir(filepath.Dir(p)) == m.cfg.RunDir {
					out[id] = append(out[id], pid)
				}
				break
			}
		}
	}
	return out
}

// vmmPids returns every live VMM of VM id: the recorded one and any found by scan.
func (m *Manager) vmmPids(id string, recorded int) []int {
	var pids []int
	if m.isOurVMM(recorded, id) {
		pids = append(pids, recorded)
	}
	for _, p := range m.findVMMs()[id] {
		if p != recorded {
			pids = append(pids, p)
		}
	}
	return pids
}

// killVMM SIGKILLs pid through a pidfd opened before the identity check, so a
// reused PID is never hit, and waits for it to exit.
func (m *Manager) killVMM(ctx context.Context, pid int, id string) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if !m.isOurVMM(pid, id) {
		return nil // gone, or the PID now belongs to something else
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill VMM %d: %w", pid, err)
	}
	return waitPidfd(ctx, fd, pid)
}

// waitPidfd waits until the process behind fd has exited.
func waitPidfd(ctx context.Context, fd, pid int) error {
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 50)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait VMM %d: %w", pid, err)
		}
		if n > 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("wait VMM %d: %w", pid, ctx.Err())
		}
	}
}

// stopVMMs makes sure no VMM of VM id is alive (recorded pid and any found by
// scan), and removes its stale api.sock (CH ≤v52 refuses to bind over it).
func (m *Manager) stopVMMs(ctx context.Context, id string, recorded int) error {
	for _, pid := range m.vmmPids(id, recorded) {
		if err := m.killVMM(ctx, pid, id); err != nil {
			return err
		}
	}
	if err := os.Remove(m.apiSocket(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

// launchVMM starts a VMM for VM id with extra args after --api-socket. The
// VMM gets its own session and a log file for stdout/stderr, never our
// pipes: it must outlive this short-lived process and its parent.
func (m *Manager) launchVMM(ctx context.Context, id string, extra []string) (int, *chapi.Client, error) {
	run := m.vmRunDir(id)
	if err := os.MkdirAll(run, 0o755); err != nil {
		return 0, nil, fmt.Errorf("launch VMM: %w", err)
	}
	sock := m.apiSocket(id)
	// A stale socket (SIGKILLed VMM) would make CH ≤v52 fail to bind.
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, nil, fmt.Errorf("launch VMM: remove stale socket: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(run, "vmm.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, nil, fmt.Errorf("launch VMM: log: %w", err)
	}
	defer logf.Close()
	cg, err := m.openVMMCgroup(id)
	if err != nil {
		return 0, nil, fmt.Errorf("launch VMM: %w", err)
	}
	defer cg.close()
	args := append([]string{"--api-socket", "path=" + sock}, extra...)
	cmd := exec.Command(m.chPath, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = run
	cmd.Env = vmmEnv(cg)
	cmd.SysProcAttr = vmmSysProcAttr(cg)
	if err := cmd.Start(); err != nil {
		return 0, nil, fmt.Errorf("launch VMM %s: %w", m.chPath, err)
	}
	pid := cmd.Process.Pid
	c := chapi.New(sock)
	wctx, cancel := context.WithTimeout(ctx, vmmReadyTimeout())
	defer cancel()
	// Reap it if it exits while we still run (in the CLI we exit long
	// before); a VMM that dies before it answered ends the wait at once
	// instead of at the deadline.
	dctx, died := context.WithCancelCause(wctx)
	defer died(nil)
	go func() {
		werr := cmd.Wait()
		died(fmt.Errorf("the VMM (pid %d) exited before it answered: %v", pid, werr))
	}()
	if err := c.WaitReady(dctx); err != nil {
		if cause := context.Cause(dctx); cause != nil && wctx.Err() == nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
		m.dropFailedVMM(context.WithoutCancel(ctx), pid, id)
		return 0, nil, fmt.Errorf("launch VMM: %w%s", err, logTail(filepath.Join(run, "vmm.log")))
	}
	return pid, c, nil
}

// dropFailedVMM kills the VMM a failed launch or boot started and removes
// its api.sock: a VMM that died on its own (after binding the socket) left
// it behind, and the failed verb commits nothing a later pass would clean
// it up for. The socket stays while the pid is still our live VMM.
func (m *Manager) dropFailedVMM(ctx context.Context, pid int, id string) {
	if err := m.killVMM(ctx, pid, id); err == nil || !m.isOurVMM(pid, id) {
		_ = os.Remove(m.apiSocket(id))
	}
}

func vmmReadyTimeout() time.Duration { return 10*time.Second + timescale.D(10*time.Second) }

// apiTimeout bounds one VMM request; snapshot and restore of big guests take
// long at scale 1, so it scales with the time scale and is generous.
func apiTimeout() time.Duration { return 30*time.Second + timescale.D(5*time.Minute) }

func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return " (VMM log: " + string(bytes.TrimSpace(b)) + ")"
}

// waitState polls vm.info until the VMM reports want; a VMM that is no
// longer alive (alive false) ends the wait at once, not at its deadline.
func waitState(ctx context.Context, c *chapi.Client, want string, alive func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, vmmReadyTimeout())
	defer cancel()
	var last string
	for {
		if !alive() {
			return fmt.Errorf("wait for VMM state %s (last %s): the VMM died", want, orNone(last))
		}
		info, err := c.Info(ctx)
		if err == nil && info.State == want {
			return nil
		}
		if err == nil {
			last = info.State
		} else {
			last = err.Error()
		}
		if err := timescale.SleepRaw(ctx, 2*time.Millisecond); err != nil {
			return fmt.Errorf("wait for VMM state %s (last %s): %w", want, last, err)
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
