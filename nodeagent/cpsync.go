package nodeagent

import (
	"context"
	"net/http"
	"time"

	"github.com/vmchaos/vmchaos/controlplane"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/timescale"
)

// syncControlPlane reconciles this node against the control plane
// (--control-plane, docs/controlplane.md) every ControlPlaneTick until ctx
// ends: the VMs placed here are run, a VM moved away is hibernated to the
// registry and then released. A control plane that does not answer leaves
// every VM as it is: the node keeps what it runs, and starts and releases
// nothing, until it answers again.
func (a *Agent) syncControlPlane(ctx context.Context) {
	// a release waits for the control plane to record it: not bounded
	// by the scaled registry timeout
	c := controlplane.NewClient(a.cfg.ControlPlane, max(a.cfg.RegistryTimeout, controlPlaneTimeout))
	for {
		vms, err := c.List(ctx)
		if err != nil {
			a.log.Warn("control plane unreachable; nothing placed or released until it answers", "err", err)
		}
		for _, v := range vms {
			a.syncVM(ctx, c, v)
		}
		if timescale.SleepRaw(ctx, max(a.cfg.ControlPlaneTick, controlPlaneTickFloor)) != nil {
			return
		}
	}
}

// syncVM reconciles one VM of the control plane.
func (a *Agent) syncVM(ctx context.Context, c *controlplane.Client, v controlplane.VM) {
	me := a.cfg.Node
	if v.Node == me {
		// The target starts the VM only once its source released it:
		// before that the source may still run it (two live VMs of one
		// name) or its :hibernate snapshot may not be durable yet (a
		// fresh boot where a wake was owed).
		if v.Source != "" && !regress.On("migrate-target-skips-release") {
			return
		}
		a.putFromControlPlane(ctx, v, Intent{Snapshot: v.Snapshot})
		return
	}
	a.mu.Lock()
	rec := a.store.get(v.Name)
	var cur record
	if rec != nil {
		cur = *rec
	}
	a.mu.Unlock()
	switch {
	case rec == nil || cur.Deleted:
		if v.Source == me {
			// nothing of it left here (released before a restart)
			a.release(ctx, c, v.Name)
		}
	case v.Source == me && regress.On("migrate-release-before-push"):
		a.release(ctx, c, v.Name)
		a.deleteReleased(ctx, v.Name)
	case v.Source != me && v.Source != "":
		// another node's migration: nothing of ours
	case hibernatedHere(&cur):
		// The snapshot is committed under :hibernate and the VM removed
		// (the hibernate's own order): only now may the target wake it.
		if v.Source == me && !a.release(ctx, c, v.Name) {
			return
		}
		a.deleteReleased(ctx, v.Name)
	case v.Source == me:
		// hibernate first: the VM leaves this node only through the
		// registry
		a.putFromControlPlane(ctx, v, Intent{Snapshot: cur.Intent.Snapshot, Hibernate: true})
	}
}

// hibernatedHere: the record reached hibernated at its own generation with
// no operation owed.
func hibernatedHere(r *record) bool {
	return r.Intent.Hibernate && r.Op == "" && r.Status.Lifecycle == LifecycleHibernated &&
		r.Status.ObservedGeneration >= r.Generation
}

// release tells the control plane this node gave name up.
func (a *Agent) release(ctx context.Context, c *controlplane.Client, name string) bool {
	if _, err := c.Release(ctx, name, a.cfg.Node); err != nil {
		a.log.Warn("control plane release failed; retried on the next sync", "vm", name, "err", err)
		return false
	}
	if err := failpoint.Hit(ctx, "agent.migrate.released", failpoint.Attrs{"vm": name}); err != nil {
		a.log.Warn("failpoint", "point", "agent.migrate.released", "err", err)
	}
	return true
}

// deleteReleased forgets a released VM here, keeping its :hibernate
// artifact in the registry for the target.
func (a *Agent) deleteReleased(ctx context.Context, name string) {
	if code, _, msg := a.deleteIntent(ctx, name, true); msg != "" && code != http.StatusNotFound {
		a.log.Warn("deleting a released vm", "vm", name, "code", code, "err", msg)
	}
}

// putFromControlPlane applies the control plane's intent for v once per
// control plane generation. A generation already applied is never PUT
// again (a failed record is retried by the agent's own backoff, not by a
// new generation on every sync); a newer one is a new generation here when
// it asks for something else or the record is failed: a leftover failed
// must not turn the placement's move into a no-op (seed 001 #5).
func (a *Agent) putFromControlPlane(ctx context.Context, v controlplane.VM, in Intent) {
	a.mu.Lock()
	rec := a.store.get(v.Name)
	applied := rec != nil && !rec.Deleted && rec.CPGeneration >= v.Generation
	if rec != nil && !rec.Deleted && rec.Intent == in && regress.On("migrate-failed-noop") {
		applied = true // an unchanged intent taken for applied: a parked failed stays parked
	}
	a.mu.Unlock()
	if applied {
		return
	}
	code, _, msg, owed := a.storeIntent(v.Name, in, v.Generation)
	if msg != "" {
		a.log.Warn("applying the control plane's intent", "vm", v.Name, "code", code, "err", msg)
		return
	}
	// The intent is durable and its worker not yet told: a crash here must
	// leave a restarted agent acting on it (its startup pass kicks every
	// record), which is the window this point names.
	if err := failpoint.Hit(ctx, "agent.migrate.applied", failpoint.Attrs{"vm": v.Name}); err != nil {
		a.log.Warn("failpoint", "point", "agent.migrate.applied", "err", err)
	}
	if owed {
		a.kick(a.ctx, v.Name, false, nil)
	}
}

// controlPlaneTickFloor keeps a tiny time scale from spinning the sync.
const controlPlaneTickFloor = 20 * time.Millisecond

// controlPlaneTimeout is the least time one control plane request is
// given.
const controlPlaneTimeout = 5 * time.Second
