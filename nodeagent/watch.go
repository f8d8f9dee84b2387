package nodeagent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/timescale"
)

// watch runs `vm status --event --format json` as a long-lived child and
// reacts to a VM that died: the owning worker re-inspects it and starts it.
// The child is restarted if it exits.
func (a *Agent) watch(ctx context.Context) {
	for ctx.Err() == nil {
		if err := a.watchOnce(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("watcher child ended", "err", err)
		}
		if timescale.SleepRaw(ctx, a.cfg.WatchInterval+a.cfg.ReadyTick) != nil {
			return
		}
	}
}

func (a *Agent) watchOnce(ctx context.Context) error {
	ad := a.adapter()
	argv, err := ad.Command(manager.Call{Verb: manager.VerbEvents, Interval: fmt.Sprintf("%g", a.watchN)})
	if err != nil {
		return fmt.Errorf("watcher: %w", err)
	}
	if len(argv) == 0 || argv[0] != a.cfg.VMCtl {
		return fmt.Errorf("watcher: the adapter's argv %q does not run %s", argv, a.cfg.VMCtl)
	}
	args := argv[1:]
	cmd := exec.CommandContext(ctx, a.cfg.VMCtl, args...)
	// Unlike operation children, the watcher writes only when a VM changes,
	// so after a SIGKILL of the agent it could wait forever for the write
	// that would kill it, and every restart would add one. It is a pure
	// observer, so it dies with the agent: PR_SET_PDEATHSIG fires when the
	// forking thread exits, hence the thread stays locked for its lifetime.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = io.Discard // a pipe (Go copies it), so an orphan dies on EPIPE
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("watcher: %w", err)
	}
	pid := cmd.Process.Pid
	a.children.add(pid, args)
	_ = failpoint.Hit(ctx, "agent.child.exec", failpoint.Attrs{"child_pid": pid, "argv": append([]string{a.cfg.VMCtl}, args...)})
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	for sc.Scan() {
		ev, err := ad.ParseEvent(sc.Bytes())
		if err != nil {
			continue // a line that is no event (a log line of an old cocoon; vmctl prints none)
		}
		a.onEvent(ctx, ev)
	}
	err = cmd.Wait()
	a.children.remove(pid)
	_ = failpoint.Hit(ctx, "agent.child.exit", failpoint.Attrs{"child_pid": pid, "code": cmd.ProcessState.ExitCode()})
	return err
}

// onEvent kicks the worker of a ready VM that the event shows dead. A VM
// with an operation in flight belongs to that operation: its death is only
// noted (by VM id), and the worker verifies the VM once the operation made
// it ready — a wake whose VMM died after its readiness check would
// otherwise report ready over a dead VM, and the event is not sent again.
func (a *Agent) onEvent(ctx context.Context, ev manager.Event) {
	rec := a.store.get(ev.Name)
	if rec == nil || rec.Deleted {
		return
	}
	dead := ev.Type == "DELETED"
	switch ev.State {
	case manager.StateStopped, manager.StateStale, manager.StateError:
		dead = true
	}
	if !dead {
		return
	}
	_ = failpoint.Hit(ctx, "agent.child.vm-died", failpoint.Attrs{"vm": rec.Name, "id": ev.ID, "op": rec.Op})
	ready := rec.Op == "" && rec.Status.Lifecycle == LifecycleReady && rec.Status.VMID == ev.ID
	// died-in-flight-dropped: the historical watcher ignored a death while
	// an operation owned the VM, so a wake could end ready over a dead VMM
	if !ready && regress.On("died-in-flight-dropped") {
		return
	}
	a.log.Warn("watcher: VM died", "vm", rec.Name, "id", ev.ID, "event", ev.Type, "state", ev.State, "op_in_flight", rec.Op)
	a.mu.Lock()
	a.died[rec.Name] = ev.ID
	a.mu.Unlock()
	if ready {
		a.kick(ctx, rec.Name, false, nil)
	}
}
