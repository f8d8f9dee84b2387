package nodeagent

import (
	"context"
	"os"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/regress"
)

// dropStaleMarker enforces, at startup, that a post_clone marker belongs to
// one VM incarnation (seed 001 held: "a hand-injected stale done was gone
// after the hibernate"): a record with no VM bound carries none. A marker
// there was left by a VM that no longer exists (hand-edited, or written by
// an older agent); trusting it would let the next incarnation skip its own
// post-clone check. It returns the record as it now is.
func (a *Agent) dropStaleMarker(rec *record) *record {
	if rec.Status.VMID != "" || rec.Status.PostClone == "" || regress.On("post-clone-marker-outlives-incarnation") {
		return rec
	}
	a.log.Warn("startup: dropping a post_clone marker of a VM incarnation that is gone", "vm", rec.Name, "post_clone", rec.Status.PostClone)
	out, err := a.setStatus(rec.Name, func(r *record) {
		if r.Status.VMID == "" {
			r.Status.PostClone = ""
		}
	})
	if err != nil {
		a.log.Error("startup: cannot drop a stale post_clone marker", "vm", rec.Name, "err", err)
		return rec
	}
	return out
}

// lookupEvidence is the hibernate-evidence lookup of a create, resumed or
// not: hibernateEvidence counts every lookup by verdict (seed 001: the
// field's resume path called the lookup directly and was never counted).
// agent.evidence.lookup is hit after the lookup was counted, so the trace
// tells a checker how many lookups the counter must hold.
func (a *Agent) lookupEvidence(ctx context.Context, name string) (bool, error) {
	var found bool
	var err error
	if regress.On("evidence-lookup-uncounted") && a.claimed(name) {
		found, err = a.rawEvidence(ctx, name)
	} else {
		found, err = a.hibernateEvidence(ctx, name)
	}
	verdict := "none"
	switch {
	case err != nil:
		verdict = "error"
	case found:
		verdict = "found"
	}
	_ = failpoint.Hit(ctx, "agent.evidence.lookup", failpoint.Attrs{"vm": name, "verdict": verdict})
	return found, err
}

// rawEvidence is the planted bug's lookup (evidence-lookup-uncounted): the
// same look at the registry and the local snapshots, uncounted, as the
// field's classifyNICRecovery did on the resume path.
func (a *Agent) rawEvidence(ctx context.Context, name string) (bool, error) {
	if _, err := os.Stat(a.manifestPath(name)); err == nil {
		return true, nil
	} else if !os.IsNotExist(err) {
		return false, err
	}
	s, err := a.snapshotByName(ctx, name)
	return s != nil, err
}

// claimed reports whether name's operation is the one resumed at startup
// (its resume claim is held).
func (a *Agent) claimed(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.claims[name]
}
