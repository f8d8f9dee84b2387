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
	c := controlplane.NewClient(a.cfg.ControlPlane, a.cfg.RegistryTimeout)
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
		if v.Source != "" {
			return
		}
		a.putFromControlPlane(ctx, v.Name, Intent{Snapshot: v.Snapshot})
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
	case v.Source == me && !cur.Intent.Hibernate:
		a.putFromControlPlane(ctx, v.Name, Intent{Snapshot: cur.Intent.Snapshot, Hibernate: true})
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

// putFromControlPlane applies the control plane's intent for name when it
// differs from the record's. An unchanged intent is never re-PUT: a
// failed record is retried by the agent's own backoff, not by a new
// generation on every sync.
func (a *Agent) putFromControlPlane(ctx context.Context, name string, in Intent) {
	a.mu.Lock()
	rec := a.store.get(name)
	same := rec != nil && !rec.Deleted && rec.Intent == in
	a.mu.Unlock()
	if same {
		return
	}
	if code, _, msg := a.putIntent(a.ctx, name, in); msg != "" {
		a.log.Warn("applying the control plane's intent", "vm", name, "code", code, "err", msg)
		return
	}
	if err := failpoint.Hit(ctx, "agent.migrate.applied", failpoint.Attrs{"vm": name}); err != nil {
		a.log.Warn("failpoint", "point", "agent.migrate.applied", "err", err)
	}
}

// controlPlaneTickFloor keeps a tiny time scale from spinning the sync.
const controlPlaneTickFloor = 20 * time.Millisecond
