package nodeagent

import (
	"context"
	"time"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/timescale"
)

// startup converges after a restart, in the order of docs/architecture.md §6:
// list VMs; reconcile every creating record with reconcile-stale-create
// (collected/not-found dropped, busy watched by the owning worker); adopt VMs
// by id/name; derive owed work from the durable markers only and dispatch it
// with a bounded fan-out under resume claims.
func (a *Agent) startup(ctx context.Context, sem chan struct{}) error {
	vms, haveListing, err := a.startupListing(ctx)
	if err != nil {
		return err
	}
	names := map[string]bool{}
	for _, n := range a.store.names() {
		names[n] = true
	}
	for _, vm := range vms {
		a.startupReconcile(ctx, vm, names)
	}
	start := time.Now()
	dispatched := a.startupResume(ctx, vms, haveListing, sem)
	a.log.Info("startup: reconciled", "vms", len(vms), "intents", len(names), "resumed", dispatched, "took", time.Since(start))
	return nil
}

// startupListing lists the VMs, with retries. A listing that still fails is
// no error (haveListing false): workers inspect by name themselves, so a
// broken listing only loses the adoption shortcut, never an intent.
func (a *Agent) startupListing(ctx context.Context) (vms []manager.VM, haveListing bool, _ error) {
	var err error
	for i := 0; i < 3; i++ {
		if vms, err = a.listVMs(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		a.log.Warn("startup: vm list failed; retrying", "err", err)
		if err := timescale.SleepRaw(ctx, a.cfg.ReadyTick); err != nil {
			return nil, false, err
		}
	}
	haveListing = err == nil
	if err != nil {
		a.log.Error("startup: vm list failed; continuing without a listing", "err", err)
	}
	return vms, haveListing, nil
}

// startupReconcile records a listed VM's state, reports a VM no intent owns,
// and resolves a creating record with reconcile-stale-create; a busy one
// nobody here owns is watched until its owner is gone.
func (a *Agent) startupReconcile(ctx context.Context, vm manager.VM, names map[string]bool) {
	a.mu.Lock()
	a.listed[vm.ID] = vm.State
	a.mu.Unlock()
	if vm.State != manager.StateCreating {
		if !names[vm.Name] {
			a.metrics.orphan(vm.ID)
			a.log.Warn("startup: VM owned by no intent (left alone)", "vm", vm.Name, "id", vm.ID)
		}
		return
	}
	outcome, err := a.reconcileStaleCreate(ctx, vm.Name, vm.ID)
	if err != nil {
		a.log.Error("startup: reconcile-stale-create failed", "vm", vm.Name, "id", vm.ID, "err", err)
		return
	}
	a.log.Info("startup: reconcile-stale-create", "vm", vm.Name, "id", vm.ID, "outcome", outcome)
	if outcome != manager.StaleBusy {
		return
	}
	a.mu.Lock()
	a.busy[vm.ID] = true
	a.mu.Unlock()
	if !names[vm.Name] {
		// Nobody here owns it; still watch it so a dead owner's
		// placeholder does not hold the name forever.
		a.wg.Add(1)
		go func(name, id string) {
			defer a.wg.Done()
			if _, err := a.watchStaleCreate(ctx, name, id); err != nil && ctx.Err() == nil {
				a.log.Warn("startup: unowned creating record", "vm", name, "id", id, "err", err)
			}
		}(vm.Name, vm.ID)
	}
}

// startupResume derives each intent's owed work from its durable markers and
// dispatches it; it returns how many interrupted operations it resumed.
func (a *Agent) startupResume(ctx context.Context, vms []manager.VM, haveListing bool, sem chan struct{}) int {
	byName := map[string]manager.VM{}
	byID := map[string]manager.VM{}
	for _, vm := range vms {
		byName[vm.Name] = vm
		byID[vm.ID] = vm
	}
	dispatched := 0
	for _, n := range a.store.names() {
		rec := a.store.get(n)
		if rec == nil {
			continue
		}
		if vm, ok := byName[n]; ok && rec.Status.VMID != "" && vm.ID != rec.Status.VMID {
			a.log.Warn("startup: the VM holding the name is not the bound one", "vm", n, "bound", rec.Status.VMID, "found", vm.ID)
		}
		// A ready VM that died or vanished while the agent was down: the
		// watcher reports changes from now on, so check it against the
		// listing once (only when there is a listing to trust).
		if haveListing && rec.Op == "" && !rec.Deleted && rec.Status.Lifecycle == LifecycleReady && rec.Status.VMID != "" {
			if vm, ok := byID[rec.Status.VMID]; !ok || vm.State != manager.StateRunning {
				a.log.Warn("startup: the ready VM is not running; verifying it", "vm", n, "id", rec.Status.VMID, "state", vm.State)
				a.mu.Lock()
				a.died[n] = rec.Status.VMID
				a.mu.Unlock()
			}
		}
		rec = a.dropStaleMarker(rec)
		rec = a.resumeWakeAsCreate(rec)
		if regress.On("empty-lifecycle-not-dispatched") && rec.Status.Lifecycle == "" && rec.Status.PostClone != "" {
			// the historical startup walked records by their lifecycle
			// marker only: one without it was never driven
			continue
		}
		op := resumeOp(rec)
		if op != "" {
			a.metrics.inc(mStartup, op)
			a.log.Warn("startup: resuming interrupted operation", "vm", n, "op", op, "lifecycle", rec.Status.Lifecycle, "step", rec.Step)
			dispatched++
		}
		a.kick(ctx, n, op != "", sem)
	}
	return dispatched
}

// resumeOp names the owed work a record carries across a restart, or "" for
// none (goal reached, or failed: that one is retried by the failed path).
func resumeOp(r *record) string {
	if r.Deleted {
		return opDelete
	}
	// post-clone-failed-dispatched: the historical startup read the
	// post_clone marker before the lifecycle and resumed a failed one.
	if r.Status.PostClone == PostCloneFailed && regress.On("post-clone-failed-dispatched") {
		return "post_clone"
	}
	// A failed record (post_clone=failed included) is parked for startup:
	// zero dispatch; the failed path retries it with its backoff.
	if r.Status.Lifecycle == LifecycleFailed {
		return ""
	}
	switch r.Op {
	case opCreate, opWake:
		// An empty lifecycle with a post_clone marker lands here too: the
		// marker, with the durable op, is the owed work (seed 001 held).
		switch r.Status.PostClone {
		case PostCloneRunning:
			return "post_clone"
		case PostCloneDone:
			// post_clone done, ready not yet written: only the
			// readiness wait is owed (post-clone-done-ignored: the
			// historical derivation redid the whole operation)
			if r.Step == stepCloned && !regress.On("post-clone-done-ignored") {
				return "ready_wait"
			}
		}
		return r.Op
	case opHibernate:
		return opHibernate
	}
	switch {
	case r.Status.Lifecycle == "":
		return opCreate
	case r.goal() == LifecycleHibernated && r.Status.Lifecycle == LifecycleReady:
		return opHibernate
	case r.goal() == LifecycleReady && r.Status.Lifecycle == LifecycleHibernated:
		return opWake
	}
	return ""
}

// resumeWakeAsCreate is the planted bug migrate-wake-resumed-as-create (a
// no-op without it): a cluster node restarted mid-wake, before the VM was
// restored, resumes the create the control plane asked for, not the wake
// its hibernate-evidence lookup made of it; the lookup, already done,
// is skipped, so it boots fresh over the :hibernate snapshot.
func (a *Agent) resumeWakeAsCreate(rec *record) *record {
	if !regress.On("migrate-wake-resumed-as-create") || a.cfg.ControlPlane == "" ||
		rec.Op != opWake || !rec.EvidenceChecked || rec.Step == stepCloned {
		return rec
	}
	out, err := a.store.update(rec.Name, func(r *record) error { r.Op, r.Step = opCreate, stepNone; return nil })
	if err != nil {
		return rec
	}
	return out
}
