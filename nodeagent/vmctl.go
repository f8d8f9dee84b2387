package nodeagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/manager"
)

// ChildError is a manager child that did not exit 0.
type ChildError struct {
	// Manager is the adapter's name ("vmctl", "cocoon"), the word the
	// message starts with.
	Manager string
	Argv    []string
	Code    int    // exit status; -1 when killed by a signal or not started
	Stderr  string // the child's stderr (trimmed)
	Err     error
	// Refusal is the outcome the manager's adapter typed from Stderr
	// (manager.Classifier), nil when it is none the agent branches on. The
	// agent branches on it and never on the text (issue 33 item 1,
	// docs/architecture.md §14).
	Refusal *manager.Refusal
	// Killed: the child died of a signal mid-flight (what it had begun,
	// the manager's own garbage, is left for the manager to collect).
	Killed bool
}

func (e *ChildError) Error() string {
	msg, mgr := lastLine(e.Stderr), e.Manager
	if mgr == "" {
		mgr = "vmctl"
	}
	if msg == "" {
		return fmt.Sprintf("%s %s: %v", mgr, strings.Join(e.Argv, " "), e.Err)
	}
	return fmt.Sprintf("%s %s: %v (output: %s)", mgr, strings.Join(e.Argv, " "), e.Err, msg)
}

// Unwrap exposes both the exit error (context cancellation, signals) and
// the typed refusal, so errors.Is and manager.RefusalOf each find theirs.
func (e *ChildError) Unwrap() []error {
	if e.Refusal == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Refusal}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[i+1:])
	}
	return s
}

// childOutput lets tests and callers see what a child printed.
type childOutput struct {
	Stdout []byte
	Stderr string
}

// vmctl runs one manager child. Every child runs under exec.CommandContext on
// a context derived from the agent's lifecycle context, so SIGTERM (which
// cancels it) kills in-flight children at once, while a SIGKILLed agent leaves
// them running: they hold pipes to the dead agent and die on their next write
// (seed 001, method note). Children get pipes, never files, for that reason,
// and inherit the agent's environment (VMCTL_*, VMCHAOS_*).
func (a *Agent) vmctl(ctx context.Context, vm string, args ...string) (childOutput, error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, a.cfg.VMCtl, args...)
	cmd.Stdout = &out
	cmd.Stderr = &errb
	// A VMM that vmctl spawned could inherit the pipes; never let it keep
	// Wait from returning after vmctl itself exited.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return childOutput{}, &ChildError{Manager: a.adapter().Name(), Argv: args, Code: -1, Err: err}
	}
	pid := cmd.Process.Pid
	a.children.add(pid, args)
	// Both points carry the argv so an injector can tell children apart by
	// kind at their exit too (after-exit CHILD triggers).
	argv := append([]string{a.cfg.VMCtl}, args...)
	_ = failpoint.Hit(ctx, "agent.child.exec", failpoint.Attrs{"vm": vm, "child_pid": pid, "argv": argv})
	err := cmd.Wait()
	a.children.remove(pid)
	code := 0
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	_ = failpoint.Hit(ctx, "agent.child.exit", failpoint.Attrs{"vm": vm, "child_pid": pid, "argv": argv, "code": code})
	res := childOutput{Stdout: out.Bytes(), Stderr: errb.String()}
	if err != nil {
		var ee *exec.ExitError
		killed := false
		if errors.As(err, &ee) && !ee.Exited() {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				err = fmt.Errorf("killed by %v: %w", ws.Signal(), err)
				killed = true
			}
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		stderr := strings.TrimSpace(errb.String())
		ad := a.adapter()
		return res, &ChildError{Manager: ad.Name(), Argv: args, Code: code, Stderr: stderr, Err: err, Refusal: ad.Classify(stderr), Killed: killed}
	}
	return res, nil
}

// isNotFound reports whether the manager said the VM or snapshot does not
// exist.
func isNotFound(err error) bool { return manager.Is(err, manager.OutcomeNotFound) }

// isLeaseHeld reports whether a live reader holds the snapshot.
func isLeaseHeld(err error) bool { return manager.Is(err, manager.OutcomeLeaseHeld) }

// nameHolder returns the refusal of a name held by another record of kind
// object (manager.ObjectVM or ObjectSnapshot).
func nameHolder(err error, object string) (*manager.Refusal, bool) {
	r, ok := manager.RefusalOf(err)
	if !ok || r.Outcome != manager.OutcomeNameHeld || r.Object != object {
		return nil, false
	}
	return r, true
}

// inspectVM returns the VM by id or name, or nil when the manager says not
// found.
func (a *Agent) inspectVM(ctx context.Context, name, ref string) (*manager.VM, error) {
	out, err := a.call(ctx, name, manager.Call{Verb: manager.VerbInspect, VM: ref})
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	vm, err := a.adapter().ParseVM(out.Stdout)
	if err != nil {
		return nil, fmt.Errorf("vm inspect %s: %w", ref, err)
	}
	return &vm, nil
}

func (a *Agent) listVMs(ctx context.Context) ([]manager.VM, error) {
	out, err := a.call(ctx, "", manager.Call{Verb: manager.VerbList})
	if err != nil {
		return nil, err
	}
	return a.adapter().ParseVMs(out.Stdout)
}

func (a *Agent) listSnapshots(ctx context.Context, name string) ([]manager.Snapshot, error) {
	out, err := a.call(ctx, name, manager.Call{Verb: manager.VerbSnapshotList})
	if err != nil {
		return nil, err
	}
	return a.adapter().ParseSnapshots(out.Stdout)
}

// snapshotByName finds the record holding name, pending records included.
func (a *Agent) snapshotByName(ctx context.Context, name string) (*manager.Snapshot, error) {
	snaps, err := a.listSnapshots(ctx, name)
	if err != nil {
		return nil, err
	}
	for i := range snaps {
		if snaps[i].Name == name {
			return &snaps[i], nil
		}
	}
	return nil, nil
}

// reconcileStaleCreate runs the manager's stale-create verb. A manager
// without one fails closed: the agent cannot tell a dead owner from a live
// one, so it neither removes nor adopts the record (issue 33 item 2).
func (a *Agent) reconcileStaleCreate(ctx context.Context, name, id string) (string, error) {
	if ok, why := a.plan.has(string(manager.VerbRecoverStale)); !ok {
		return "", fmt.Errorf("vm %s (%s) is creating and the manager cannot recover it; failing closed: %s", name, id, why)
	}
	out, err := a.call(ctx, name, manager.Call{Verb: manager.VerbRecoverStale, VM: id})
	if err != nil {
		return "", err
	}
	outcome, err := a.adapter().ParseRecoverStale(out.Stdout)
	if err != nil {
		return "", fmt.Errorf("reconcile-stale-create %s: %w", id, err)
	}
	a.metrics.inc(mStaleCreate, outcome)
	return outcome, nil
}
