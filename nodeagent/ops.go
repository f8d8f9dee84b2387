package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/timescale"
)

// doCreate runs create (clone from the intent's snapshot) or wake (clone from
// the VM's hibernate snapshot), resuming at the durable step.
func (a *Agent) doCreate(ctx context.Context, rec *record) error {
	isWake := rec.Op == opWake
	var err error
	if rec, err = a.enterCreating(ctx, rec, isWake); err != nil {
		return err
	}
	if !isWake {
		var becameWake bool
		if rec, becameWake, err = a.checkHibernateEvidence(ctx, rec); err != nil || becameWake {
			return err
		}
	}
	if isWake && rec.Step == stepNone {
		if rec, err = a.pullWakeSnapshot(ctx, rec); err != nil {
			return err
		}
	}
	if rec.Step == stepNone || rec.Step == stepPulled {
		if rec, err = a.cloneForCreate(ctx, rec, isWake); err != nil {
			return err
		}
	}
	if rec.Deleted {
		return nil // the delete takes over; advance dispatches it
	}
	return a.finishCreate(ctx, rec, isWake)
}

// createReason is the failure and failpoint reason of create step s; a
// wake's carry the wake_ prefix.
func createReason(isWake bool, s string) string {
	if isWake {
		return "wake_" + s
	}
	return s
}

// enterCreating sets the lifecycle to creating and hits the begin failpoint
// of an operation that has not started a step yet.
func (a *Agent) enterCreating(ctx context.Context, rec *record, isWake bool) (*record, error) {
	if rec.Status.Lifecycle == LifecycleCreating && rec.Step != stepNone {
		return rec, nil
	}
	name := rec.Name
	begin := "agent.create.begin"
	if isWake {
		begin = "agent.wake.begin"
	}
	rec, err := a.setStatus(name, func(r *record) {
		r.Status.Lifecycle = LifecycleCreating
		if r.Step == stepCloned && r.Status.PostClone == PostCloneDone {
			r.Status.Message = "verifying the VM after it died"
		} else {
			r.Status.Message = ""
		}
	})
	if err != nil {
		return rec, err
	}
	if rec.Step == stepNone {
		if err := hit(ctx, begin, name, createReason(isWake, "begin")); err != nil {
			return rec, err
		}
	}
	return rec, nil
}

// checkHibernateEvidence makes sure a fresh create never boots over a
// hibernate snapshot (seed 001 coverage gap): a create that finds hibernate
// evidence for its name becomes a wake (becameWake), and a lookup that fails
// refuses the fresh boot. The lookup runs once per operation.
func (a *Agent) checkHibernateEvidence(ctx context.Context, rec *record) (_ *record, becameWake bool, _ error) {
	if rec.Step != stepNone || rec.Status.VMID != "" || rec.EvidenceChecked {
		return rec, false, nil
	}
	name := rec.Name
	if a.cfg.ControlPlane != "" && regress.On("migrate-target-skips-evidence") {
		return rec, false, nil // the planted bug: a cluster node's create never looks
	}
	found, err := a.lookupEvidence(ctx, name)
	if err != nil {
		return rec, false, opErr("evidence", fmt.Errorf("hibernate evidence lookup for %s failed (refusing fresh boot): %w", name, err))
	}
	if rec, err = a.store.update(name, func(r *record) error {
		r.EvidenceChecked = true
		if found {
			r.Op = opWake
		}
		return nil
	}); err != nil {
		return rec, false, err
	}
	if found {
		a.log.Warn("hibernate snapshot found for a fresh create; waking from it instead", "vm", name)
		return rec, true, nil
	}
	return rec, false, nil
}

// pullWakeSnapshot makes the VM's hibernate snapshot local: step pulled.
func (a *Agent) pullWakeSnapshot(ctx context.Context, rec *record) (*record, error) {
	name := rec.Name
	id, err := a.ensureLocalSnapshot(ctx, rec)
	if errors.Is(err, ErrImageChanged) {
		return rec, err // its own reason: image_changed
	}
	if err != nil {
		return rec, opErr("pull", err)
	}
	if rec, err = a.store.update(name, func(r *record) error {
		r.SnapshotID, r.Step = id, stepPulled
		return nil
	}); err != nil {
		return rec, err
	}
	if err := hit(ctx, "agent.wake.pulled", name, "pull"); err != nil {
		return rec, err
	}
	return rec, nil
}

// cloneForCreate clones (or adopts) the VM from the intent's snapshot, or a
// wake's hibernate snapshot, and binds it: step cloned.
func (a *Agent) cloneForCreate(ctx context.Context, rec *record, isWake bool) (*record, error) {
	name := rec.Name
	source := rec.Intent.Snapshot
	if isWake {
		source = rec.SnapshotID
	}
	vm, err := a.cloneOrAdopt(ctx, name, source)
	if err != nil {
		return rec, opErr(createReason(isWake, "clone"), err)
	}
	if rec, err = a.setStatus(name, func(r *record) {
		r.Status.VMID = vm.ID
		r.Status.Address = vm.Address
		r.Status.PostClone = PostCloneRunning
		r.Step = stepCloned
		r.NICDropped = false
	}); err != nil {
		return rec, err
	}
	point := "agent.create.cloned"
	if isWake {
		point = "agent.wake.cloned"
	}
	if err := hit(ctx, point, name, createReason(isWake, "clone")); err != nil {
		return rec, err
	}
	return rec, nil
}

// finishCreate is step cloned: the bound VM must be running and ready, then
// a wake drops its hibernate snapshot and the VM is reported ready.
func (a *Agent) finishCreate(ctx context.Context, rec *record, isWake bool) error {
	name := rec.Name
	vm, err := a.ensureRunning(ctx, name, rec.Status.VMID)
	if err != nil {
		return opErr(createReason(isWake, "start"), err)
	}
	if vm == nil {
		// The bound VM is gone: clone again from the step before.
		back := stepNone
		if isWake {
			back = stepPulled
		}
		a.log.Warn("bound VM is gone; cloning again", "vm", name, "id", rec.Status.VMID)
		_, err := a.setStatus(name, func(r *record) {
			r.Status.VMID, r.Status.Address, r.Status.PostClone, r.Step = "", "", "", back
		})
		return err
	}
	if rec, err = a.checkPostClone(ctx, rec, vm, isWake); err != nil {
		return err
	}
	if isWake {
		// The hibernate snapshot has served its purpose; keeping it would
		// make a later re-create of this name restore stale memory.
		if err := a.dropHibernateSnapshot(ctx, name, rec.SnapshotID); err != nil {
			return opErr("wake_cleanup", err)
		}
	}
	if _, err = a.setStatus(name, func(r *record) {
		r.Status.Lifecycle = LifecycleReady
		r.Status.Message = ""
		r.Status.FailedAttempts, r.Status.FailedReason = 0, ""
		if r.goal() == LifecycleReady {
			r.Status.ObservedGeneration = r.Generation
		}
		r.Op, r.Step, r.SnapshotID, r.EvidenceChecked = "", "", "", false
	}); err != nil {
		return err
	}
	if isWake {
		a.metrics.inc(mWake, "ok")
		return hit(ctx, "agent.wake.ready", name, "wake_ready")
	}
	return hit(ctx, "agent.create.ready", name, "ready")
}

// checkPostClone waits for the running VM's guest to answer and records the
// post_clone outcome.
func (a *Agent) checkPostClone(ctx context.Context, rec *record, vm *manager.VM, isWake bool) (*record, error) {
	name := rec.Name
	// Readiness is checked on every pass through this step, even with a
	// post_clone done marker: the marker belongs to one VM incarnation, and a
	// VM that was restarted since is a new one.
	if rec.Status.PostClone != PostCloneRunning {
		if _, err := a.setStatus(name, func(r *record) { r.Status.PostClone = PostCloneRunning }); err != nil {
			return rec, err
		}
	}
	if err := a.waitReady(ctx, name, vm.ID); err != nil {
		_, _ = a.setStatus(name, func(r *record) { r.Status.PostClone = PostCloneFailed })
		return rec, opErr(createReason(isWake, "post_clone"), err)
	}
	return a.setStatus(name, func(r *record) {
		r.Status.PostClone = PostCloneDone
		r.Status.Address = vm.Address
	})
}

// cloneOrAdopt returns the running VM named name, cloning it from source if
// no VM holds the name. A creating record is resolved through
// reconcile-stale-create (never a blocking rm: seed 002).
func (a *Agent) cloneOrAdopt(ctx context.Context, name, source string) (*manager.VM, error) {
	var lastErr error
	for i := 0; i < 6; i++ {
		vm, err := a.inspectVM(ctx, name, name)
		if err != nil {
			return nil, err
		}
		if vm != nil {
			switch vm.State {
			case manager.StateRunning:
				a.log.Info("adopting running VM", "vm", name, "id", vm.ID)
				return vm, nil
			case manager.StateStopped, manager.StateStale:
				if _, err := a.call(ctx, name, manager.Call{Verb: manager.VerbStart, VM: vm.ID}); err != nil {
					return nil, err
				}
				continue
			case manager.StateCreating:
				adopted, err := a.watchStaleCreate(ctx, name, vm.ID)
				if err != nil {
					return nil, err
				}
				if adopted != nil {
					return adopted, nil
				}
				continue
			case manager.StateCreated:
				// created is an operation in flight, not debris: a `vm run`
				// commits created, lets the ops lock go and takes it again
				// to start (as the field's manager does). vm start finishes
				// it either way: it waits for a start that holds the lock
				// and adopts its VMM, or boots a create nobody is starting.
				// Removing it would kill the run between its two halves.
				a.log.Info("vm is created (a create in flight); starting it", "vm", name, "id", vm.ID)
				if _, err := a.call(ctx, name, manager.Call{Verb: manager.VerbStart, VM: vm.ID}); err != nil && !isNotFound(err) {
					return nil, err
				}
				continue
			default: // error: not worth adopting
				if _, err := a.call(ctx, name, manager.Call{Verb: manager.VerbRm, VM: vm.ID}); err != nil && !isNotFound(err) {
					return nil, err
				}
				continue
			}
		}
		_, err = a.cloneLeaseWait(ctx, name, source)
		if err == nil {
			vm, err := a.inspectVM(ctx, name, name)
			if err != nil {
				return nil, err
			}
			if vm == nil {
				return nil, fmt.Errorf("vm clone %s: committed VM not found", name)
			}
			return vm, nil
		}
		if _, held := nameHolder(err, manager.ObjectVM); held {
			lastErr = err
			continue // someone holds the name: look at the holder again
		}
		return nil, err
	}
	return nil, fmt.Errorf("vm name %s still held after repeated attempts: %w", name, lastErr)
}

// watchStaleCreate resolves a creating record: it re-invokes
// reconcile-stale-create on every tick of a backoff until the verb says the
// owner is gone (collected/not-found), and adopts a record that reaches
// running whatever the verb answers. Only the verb can tell "owner alive" from
// "owner died" (seed 001 #1). It gives up only at --busy-create-budget.
func (a *Agent) watchStaleCreate(ctx context.Context, name, id string) (*manager.VM, error) {
	deadline := time.Now().Add(a.cfg.BusyCreateBudget)
	tick := a.cfg.BusyCreateTick
	a.mu.Lock()
	verbRan := a.busy[id]
	a.mu.Unlock()
	// watch-busy-inspect-only: the historical watcher ran the verb once and
	// then only inspected the record.
	inspectOnly := regress.On("watch-busy-inspect-only")
	for {
		if !inspectOnly || !verbRan {
			outcome, err := a.reconcileStaleCreate(ctx, name, id)
			verbRan = true
			if err != nil {
				return nil, err
			}
			a.log.Info("reconcile-stale-create", "vm", name, "id", id, "outcome", outcome)
			if outcome == manager.StaleCollected || outcome == manager.StaleNotFound {
				return nil, nil
			}
		}
		vm, err := a.inspectVM(ctx, name, id)
		if err != nil {
			return nil, err
		}
		if vm == nil {
			return nil, nil
		}
		if vm.State == manager.StateRunning {
			a.log.Info("in-flight create committed; adopting", "vm", name, "id", id)
			return vm, nil
		}
		if vm.State != manager.StateCreating {
			return nil, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("vm %s (%s) did not leave creating within %v; giving up", name, id, a.cfg.BusyCreateBudget)
		}
		if err := timescale.SleepRaw(ctx, tick); err != nil {
			return nil, err
		}
		if tick *= 2; tick > 8*a.cfg.BusyCreateTick {
			tick = 8 * a.cfg.BusyCreateTick
		}
	}
}

// ensureRunning returns the VM id running (starting it if stopped), or nil
// when the VM no longer exists.
func (a *Agent) ensureRunning(ctx context.Context, name, id string) (*manager.VM, error) {
	if id == "" {
		return nil, nil
	}
	for i := 0; i < 3; i++ {
		vm, err := a.inspectVM(ctx, name, id)
		if err != nil || vm == nil {
			return nil, err
		}
		switch vm.State {
		case manager.StateRunning:
			return vm, nil
		case manager.StateCreating:
			adopted, err := a.watchStaleCreate(ctx, name, id)
			if err != nil || adopted == nil {
				return nil, err
			}
			return adopted, nil
		default:
			a.log.Warn("bound VM is not running; starting it", "vm", name, "id", id, "state", vm.State)
			if _, err := a.call(ctx, name, manager.Call{Verb: manager.VerbStart, VM: id}); err != nil {
				return nil, err
			}
		}
	}
	return nil, fmt.Errorf("vm %s (%s) did not reach running after vm start", name, id)
}

// guestExec runs argv in the guest, retrying until the readiness budget: the
// guest may still be booting or restoring.
func (a *Agent) guestExec(ctx context.Context, name, id string, argv ...string) error {
	deadline := time.Now().Add(a.cfg.ReadyBudget)
	c := manager.Call{Verb: manager.VerbExec, VM: id, Argv: argv}
	for {
		_, err := a.call(ctx, name, c)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("guest %v on %s not done within %v: %w", argv, id, a.cfg.ReadyBudget, err)
		}
		if err := timescale.SleepRaw(ctx, a.cfg.ReadyTick); err != nil {
			return err
		}
	}
}

// waitReady is the post-clone readiness check: the guest answers a command.
// A manager without guest exec is trusted on its own state instead (the
// plan's insteadNoGuestExec): the VM must still be listed running.
func (a *Agent) waitReady(ctx context.Context, name, id string) error {
	if ok, why := a.plan.has(manager.FeatureGuestExec); !ok {
		a.log.Info("readiness from the manager's state", "vm", name, "id", id, "reason", why)
		vm, err := a.inspectVM(ctx, name, id)
		switch {
		case err != nil:
			return err
		case vm == nil:
			return fmt.Errorf("vm %s (%s) gone before it was ready", name, id)
		case vm.State != manager.StateRunning:
			return fmt.Errorf("vm %s (%s) is %s, not running, after the clone", name, id, vm.State)
		}
		return nil
	}
	return a.guestExec(ctx, name, id, "hostname")
}

// doHibernate: DHCP release, NIC drop, snapshot save (with name-held
// recovery), push, clear id, vm rm. The DHCP release runs first because after
// the NIC drop the guest is unreachable over SSH.
func (a *Agent) doHibernate(ctx context.Context, rec *record, resumed bool) error {
	name := rec.Name
	var err error
	if rec, err = a.enterHibernating(ctx, rec); err != nil {
		return err
	}
	if hibernateOrder[rec.Step] < hibernateOrder[stepSaved] {
		if rec, err = a.hibernateSave(ctx, rec, resumed); err != nil {
			return err
		}
	}
	if hibernateOrder[rec.Step] < hibernateOrder[stepPushed] {
		if rec, err = a.hibernatePush(ctx, rec); err != nil {
			return err
		}
	}
	if hibernateOrder[rec.Step] < hibernateOrder[stepRemoved] {
		if err := a.hibernateRemove(ctx, rec); err != nil {
			return err
		}
	}
	// hibernated is written only here: the snapshot is saved and pushed and
	// the VM is gone, so it is never reported while an unsaved VM is alive.
	if _, err := a.setStatus(name, func(r *record) {
		r.Status.Lifecycle = LifecycleHibernated
		r.Status.Message = ""
		r.Status.FailedAttempts, r.Status.FailedReason = 0, ""
		if r.goal() == LifecycleHibernated {
			r.Status.ObservedGeneration = r.Generation
		}
		r.Op, r.Step, r.NICDropped = "", "", false
	}); err != nil {
		return err
	}
	return hit(ctx, "agent.hibernate.done", name, "hibernate_done")
}

// enterHibernating sets the lifecycle to hibernating and hits the begin
// failpoint of a hibernate that starts from ready or from no step.
func (a *Agent) enterHibernating(ctx context.Context, rec *record) (*record, error) {
	if rec.Status.Lifecycle == LifecycleHibernating {
		return rec, nil
	}
	name := rec.Name
	fromReady := rec.Status.Lifecycle == LifecycleReady
	var err error
	if rec, err = a.setStatus(name, func(r *record) {
		r.Status.Lifecycle = LifecycleHibernating
		r.Status.Message = ""
	}); err != nil {
		return rec, err
	}
	if fromReady || rec.Step == stepNone {
		a.metrics.inc(mHibernate, "begin", "ok")
		if err := hit(ctx, "agent.hibernate.begin", name, "hibernate_begin"); err != nil {
			return rec, err
		}
	}
	return rec, nil
}

// hibernateSave boots the bound VM, releases its DHCP lease, drops its NIC
// and saves its snapshot: step saved.
func (a *Agent) hibernateSave(ctx context.Context, rec *record, resumed bool) (*record, error) {
	name := rec.Name
	vmID := rec.Status.VMID
	order := hibernateOrder[rec.Step]
	if vmID == "" {
		return rec, opErr("hibernate_begin", fmt.Errorf("hibernate %s: no VM bound", name))
	}
	if err := a.hibernateStart(ctx, rec, resumed); err != nil {
		return rec, err
	}
	if err := a.hibernateDetach(ctx, name, vmID, order); err != nil {
		return rec, err
	}
	id, err := a.saveSnapshot(ctx, name, vmID)
	if err != nil {
		a.metrics.inc(mHibernate, "snapshot", "failed")
		return rec, opErr("snapshot", err)
	}
	a.metrics.inc(mHibernate, "snapshot", "ok")
	if rec, err = a.store.update(name, func(r *record) error {
		r.SnapshotID, r.Step = id, stepSaved
		return nil
	}); err != nil {
		return rec, err
	}
	if err := hit(ctx, "agent.hibernate.saved", name, "snapshot"); err != nil {
		return rec, err
	}
	return rec, nil
}

// hibernateStart boots the bound VM before it is saved.
func (a *Agent) hibernateStart(ctx context.Context, rec *record, resumed bool) error {
	name, vmID := rec.Name, rec.Status.VMID
	// Every hibernate boots the VM first: start is idempotent, converges
	// a crashed VMM (seed 001 #4) and, under the ops lock, a VMM left
	// Paused by a dead save (seed 001 #2), which could not answer the
	// DHCP release over SSH. Gating it on a stored state buys nothing and
	// a state that lies strands the VM.
	needStart := true
	if regress.On("resume-start-gated-on-listed-state") {
		// The historical agent started only a resumed (or retried)
		// hibernate, and only when its VM was listed stopped.
		a.mu.Lock()
		listed := a.listed[vmID]
		a.mu.Unlock()
		needStart = (resumed || rec.Status.FailedAttempts > 0) && listed == manager.StateStopped
	}
	if needStart {
		if _, err := a.call(ctx, name, manager.Call{Verb: manager.VerbStart, VM: vmID}); err != nil {
			a.metrics.inc(mHibernate, "start", "failed")
			return opErr("start", err)
		}
	}
	return nil
}

// hibernateDetach releases the guest's DHCP lease (step dhcp-released) and
// drops its NIC (step nic-dropped), each unless the operation's step at
// entry (order) is already past it.
func (a *Agent) hibernateDetach(ctx context.Context, name, vmID string, order int) error {
	if ok, why := a.plan.has(manager.FeatureNIC); !ok {
		// Without a NIC change an embedder keeps the NIC: releasing the
		// lease of a NIC that stays would only strand the guest (issue 33
		// item 2; recorded in PlanFile).
		a.log.Warn("hibernate: no NIC drop or DHCP release", "vm", name, "reason", why, "instead", insteadNoNIC)
		return nil
	}
	release := true
	if ok, why := a.plan.has(manager.FeatureGuestExec); !ok {
		// The NIC still goes; only the lease is not released, as an
		// embedder without a guest channel does.
		a.log.Warn("hibernate: no DHCP release", "vm", name, "reason", why, "instead", insteadNoGuestExec)
		release = false
	}
	if release && order < hibernateOrder[stepDHCPReleased] {
		if err := a.guestExec(ctx, name, vmID, "dhclient", "-r"); err != nil {
			a.metrics.inc(mHibernate, "dhcp_release", "failed")
			return opErr("dhcp_release", err)
		}
		a.metrics.inc(mHibernate, "dhcp_release", "ok")
		if _, err := a.store.update(name, func(r *record) error { r.Step = stepDHCPReleased; return nil }); err != nil {
			return err
		}
		if err := hit(ctx, "agent.hibernate.dhcp-released", name, "dhcp_release"); err != nil {
			return err
		}
	}
	if order < hibernateOrder[stepNICDropped] {
		if err := a.netNICs(ctx, name, vmID, 0); err != nil {
			a.metrics.inc(mHibernate, "netresize", "failed")
			return opErr("netresize", err)
		}
		a.metrics.inc(mHibernate, "netresize", "ok")
		if _, err := a.setStatus(name, func(r *record) {
			r.Step, r.NICDropped, r.Status.Address = stepNICDropped, true, ""
		}); err != nil {
			return err
		}
		if err := hit(ctx, "agent.hibernate.nic-dropped", name, "netresize"); err != nil {
			return err
		}
	}
	return nil
}

// hibernatePush pushes the saved snapshot: step pushed.
func (a *Agent) hibernatePush(ctx context.Context, rec *record) (*record, error) {
	name := rec.Name
	if err := a.push(ctx, name, rec.SnapshotID, rec.Intent.Snapshot); err != nil {
		a.metrics.inc(mHibernate, "push", "failed")
		return rec, opErr("push", err)
	}
	a.metrics.inc(mHibernate, "push", "ok")
	var err error
	if rec, err = a.store.update(name, func(r *record) error { r.Step = stepPushed; return nil }); err != nil {
		return rec, err
	}
	if err := hit(ctx, "agent.hibernate.pushed", name, "push"); err != nil {
		return rec, err
	}
	return rec, nil
}

// hibernateRemove unbinds the VM and removes it: step removed.
func (a *Agent) hibernateRemove(ctx context.Context, rec *record) error {
	name := rec.Name
	// Clear the id first: from here on the status never points at a VM
	// that is about to disappear; RemoveVMID remembers what to remove.
	var err error
	if rec, err = a.setStatus(name, func(r *record) {
		if r.Status.VMID != "" {
			r.RemoveVMID = r.Status.VMID
		}
		r.Status.VMID, r.Status.Address = "", ""
		// the post_clone marker dies with the VM it describes (seed 001
		// held); post-clone-marker-outlives-incarnation keeps it
		if !regress.On("post-clone-marker-outlives-incarnation") {
			r.Status.PostClone = ""
		}
	}); err != nil {
		return err
	}
	if err := a.removeVM(ctx, name, rec.RemoveVMID); err != nil {
		a.metrics.inc(mHibernate, "remove", "failed")
		return opErr("remove", err)
	}
	a.metrics.inc(mHibernate, "remove", "ok")
	if _, err := a.store.update(name, func(r *record) error { r.Step, r.RemoveVMID = stepRemoved, ""; return nil }); err != nil {
		return err
	}
	return hit(ctx, "agent.hibernate.removed", name, "remove")
}

// removeVM removes the VM by id and whatever VM still holds the name. A
// `vm rm` interrupted after its tombstone leaves no record to inspect, only
// the tombstone (and maybe the VMM); vmctl's rm by id or name finishes that
// delete, so an rm always runs, never skipped on "not found".
func (a *Agent) removeVM(ctx context.Context, name, id string) error {
	if id != "" {
		if _, err := a.call(ctx, name, manager.Call{Verb: manager.VerbRm, VM: id}); err != nil && !isNotFound(err) {
			return err
		}
	}
	vm, err := a.inspectVM(ctx, name, name)
	if err != nil {
		return err
	}
	if vm == nil {
		if id != "" {
			return nil // the rm by id above finished whatever it left
		}
		// No id was bound: the rm by name rolls forward a delete of the
		// name's last VM. A record holding the name is handled below
		// instead (a creating one must never be collected by a blocking rm).
		if _, err := a.call(ctx, name, manager.Call{Verb: manager.VerbRm, VM: name}); err != nil && !isNotFound(err) {
			return err
		}
		return nil
	}
	if vm.State == manager.StateCreating {
		adopted, err := a.watchStaleCreate(ctx, name, vm.ID)
		if err != nil || adopted == nil {
			return err
		}
	}
	if _, err := a.call(ctx, name, manager.Call{Verb: manager.VerbRm, VM: vm.ID}); err != nil && !isNotFound(err) {
		return err
	}
	return nil
}

// doUnhibernate brings a VM whose hibernate was not saved yet back to ready
// when the intent flipped back: boot it, give it its NICs back, wait ready.
func (a *Agent) doUnhibernate(ctx context.Context, rec *record) error {
	name, vmID := rec.Name, rec.Status.VMID
	if vmID == "" {
		_, err := a.store.update(name, func(r *record) error { r.Op, r.Step, r.EvidenceChecked = opCreate, stepNone, false; return nil })
		return err
	}
	if _, err := a.call(ctx, name, manager.Call{Verb: manager.VerbStart, VM: vmID}); err != nil {
		return opErr("start", err)
	}
	if rec.NICDropped {
		if err := a.netNICs(ctx, name, vmID, a.cfg.NICs); err != nil {
			return opErr("netresize", err)
		}
		if _, err := a.store.update(name, func(r *record) error { r.NICDropped = false; return nil }); err != nil {
			return err
		}
	}
	// From here it is a create resumed at its readiness step.
	_, err := a.setStatus(name, func(r *record) {
		r.Op, r.Step = opCreate, stepCloned
		r.Status.PostClone = PostCloneRunning
	})
	return err
}

// doDelete: vm rm --force, snapshot rm of the hibernate snapshot, registry
// entry removed, intent forgotten. Unrelated snapshots are never touched.
func (a *Agent) doDelete(ctx context.Context, rec *record) error {
	name := rec.Name
	if rec.Op != opDelete || rec.Status.Lifecycle != LifecycleDeleting {
		fresh := rec.Op != opDelete
		var err error
		if rec, err = a.setStatus(name, func(r *record) {
			if r.Op != opDelete {
				r.Op, r.Step = opDelete, stepNone
			}
			r.Status.Lifecycle = LifecycleDeleting
			r.Status.Message = ""
		}); err != nil {
			return err
		}
		if fresh {
			if err := hit(ctx, "agent.delete.begin", name, "delete_begin"); err != nil {
				return err
			}
		}
	}
	if rec.Step != stepRemoved {
		id := rec.Status.VMID
		if id == "" {
			id = rec.RemoveVMID
		}
		if err := a.removeVM(ctx, name, id); err != nil {
			return opErr("delete_rm", err)
		}
		if _, err := a.setStatus(name, func(r *record) {
			r.Step, r.Status.VMID, r.Status.Address, r.Status.PostClone, r.RemoveVMID = stepRemoved, "", "", "", ""
		}); err != nil {
			return err
		}
		if err := hit(ctx, "agent.delete.removed", name, "delete_rm"); err != nil {
			return err
		}
	}
	drop := a.dropHibernateSnapshot
	if rec.KeepRegistry {
		drop = a.dropLocalHibernateSnapshot
	}
	if err := drop(ctx, name, rec.SnapshotID); err != nil {
		return opErr("delete_snapshot", err)
	}
	if err := a.store.forget(name); err != nil {
		return err
	}
	a.mu.Lock()
	delete(a.died, name)
	a.mu.Unlock()
	return hit(ctx, "agent.delete.done", name, "delete_done")
}

// cloneLeaseWait runs vm clone of source under name. vmctl's clone already
// waits for the snapshot's lease; a refusal after that wait is still a live
// holder (an rm, a build finishing), a transient that clears by itself, so it
// is retried until --lease-wait like the save's rm (seed 001 #3).
func (a *Agent) cloneLeaseWait(ctx context.Context, name, source string) (childOutput, error) {
	deadline := time.Now().Add(a.cfg.LeaseWait)
	for {
		out, err := a.call(ctx, name, manager.Call{Verb: manager.VerbClone, Name: name, Snapshot: source, NICs: &a.cfg.NICs})
		if err == nil || !isLeaseHeld(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return out, err
		}
		a.log.Warn("snapshot lease held; retrying the clone", "vm", name, "snapshot", source)
		if err := timescale.SleepRaw(ctx, a.cfg.ReadyTick); err != nil {
			return childOutput{}, err
		}
	}
}
