package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
)

// The seed-path steps and invariants of issue 34 (items 5 and 6): hand
// edits of the agent's record while it is stopped, the operator's retry of
// a parked intent, and the history invariants wedge-visible and
// evidence-lookups-counted.

// seedPathStep runs the step if it is one of the seed-path steps
// (handled); any other step is left to step.
func (cr *caseRun) seedPathStep(ctx context.Context, step scenarios.Step, budget time.Duration) (handled bool, err error) {
	var edit func(doc, status map[string]any) error
	switch step.Kind {
	case scenarios.StepMarkPostCloneFailed:
		edit = markPostCloneFailed
	case scenarios.StepWipeLifecycle:
		edit = wipeLifecycle
	case scenarios.StepMarkPostCloneDone:
		edit = markStaleDone
	case scenarios.StepOperatorRetry:
		return true, cr.operatorRetry(ctx, step.VM, budget)
	default:
		return false, nil
	}
	if err := editRecord(cr.st.State, step.VM, edit); err != nil {
		return true, harnessErr(err)
	}
	return true, nil
}

// editRecord rewrites the agent's durable record of name (agent stopped)
// through edit, which gets the document and its status object.
func editRecord(stateDir, name string, edit func(doc, status map[string]any) error) error {
	p := filepath.Join(stateDir, "vms", name+".json")
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("edit record: %w", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("edit record %s: %w", p, err)
	}
	status, _ := doc["status"].(map[string]any)
	if status == nil {
		return fmt.Errorf("edit record %s: no status", p)
	}
	if err := edit(doc, status); err != nil {
		return fmt.Errorf("edit record %s: %w", p, err)
	}
	nb, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(p, nb, 0o644)
}

// markPostCloneFailed: what fail() writes after a failed post-clone check
// of a create (nodeagent ops.go checkPostClone), first attempt.
func markPostCloneFailed(doc, status map[string]any) error {
	if id, _ := status["vm_id"].(string); id == "" {
		return fmt.Errorf("no VM bound: a post-clone check needs one")
	}
	doc["op"], doc["step"] = "create", "cloned"
	doc["failed_generation"] = doc["generation"]
	status["lifecycle"], status["post_clone"] = nodeagent.LifecycleFailed, nodeagent.PostCloneFailed
	status["failed_reason"], status["failed_attempts"] = "post_clone", 1
	status["message"] = "create failed (attempt 1): post_clone: guest did not answer (hand-injected); retrying"
	status["updated_at"] = time.Now().UTC().Format(time.RFC3339Nano)
	return nil
}

// wipeLifecycle: the lifecycle marker is gone, the post_clone one stays.
func wipeLifecycle(_, status map[string]any) error {
	if pc, _ := status["post_clone"].(string); pc == "" {
		return fmt.Errorf("no post_clone marker to keep")
	}
	delete(status, "lifecycle")
	return nil
}

// markStaleDone: a post_clone done of an incarnation that is gone.
func markStaleDone(_, status map[string]any) error {
	if id, _ := status["vm_id"].(string); id != "" {
		return fmt.Errorf("vm %s is bound: a marker there is not stale", id)
	}
	status["post_clone"] = nodeagent.PostCloneDone
	return nil
}

// operatorRetry leaves name alone for longer than its operation's budget
// plus the checker's slack (so the stretch is judged by wedge-visible),
// then PUTs its intent again, which starts a new generation of a failed
// intent: the operator's way out of a parked one.
func (cr *caseRun) operatorRetry(ctx context.Context, name string, budget time.Duration) error {
	v, err := cr.st.Agent.Get(ctx, name)
	if err != nil {
		return fmt.Errorf("operator retry: %w", err)
	}
	evs, err := cr.st.Agent.Events(ctx)
	if err != nil {
		return fmt.Errorf("operator retry: agent events: %w", err)
	}
	op := v.Op
	if op == "" {
		op = "create"
	}
	b := time.Duration(evs.Budgets[op] * float64(time.Second))
	if b <= 0 {
		return fmt.Errorf("operator retry: the agent publishes no budget for %s", op)
	}
	wait := b + 2*checker.WedgeSlack(b)
	if wait > budget {
		return harnessErr(fmt.Errorf("operator retry: waiting %v past the %s budget exceeds the case budget %v", wait, op, budget))
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(wait):
	}
	return cr.put(ctx, name, v.Intent)
}

// seedPathInvariants are wedge-visible and evidence-lookups-counted, each
// only where the case gives it something to judge.
func (cr *caseRun) seedPathInvariants(ctx context.Context, in *checker.Input, events []failpoint.Event, samples []checker.Sample) []reports.Invariant {
	var out []reports.Invariant
	var last *checker.Sample
	if len(samples) > 0 {
		last = &samples[len(samples)-1]
	}
	out = append(out, cr.wedgeInvariant(ctx, in, events, last)...)
	if inv, asked := checker.EvidenceLookupsInvariant(in, events, samples); asked {
		out = append(out, inv)
	}
	return out
}

// wedgeInvariant is wedge-visible over the trace so far, read against the
// agent's events and the last scrape.
func (cr *caseRun) wedgeInvariant(ctx context.Context, in *checker.Input, events []failpoint.Event, last *checker.Sample) []reports.Invariant {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	evs, err := cr.st.Agent.Events(actx)
	cancel()
	if inv, asked := checker.WedgeVisibleInvariant(in, events, evs, err, last, failpoint.Now()); asked {
		return []reports.Invariant{inv}
	}
	return nil
}

// stallWedge is wedge-visible for a case judgeStall fails as the product's:
// an operation never reached its next point within the case's budget, so
// the agent must have shown the stuck intent outside the node too.
func (cr *caseRun) stallWedge(ctx context.Context) []reports.Invariant {
	var last *checker.Sample
	if cr.scraper != nil {
		cr.scraper.ScrapeNow(ctx, failpoint.Now)
		if samples := cr.scraper.Samples(); len(samples) > 0 {
			last = &samples[len(samples)-1]
		}
	}
	bad, lastBad := cr.st.Trace.Malformed()
	in := &checker.Input{TraceLoss: checker.TraceLoss(cr.st.Trace.Path(), bad, lastBad, checker.Losses(cr.st.Trace.Lost()))}
	return cr.wedgeInvariant(ctx, in, cr.st.Trace.Sorted(), last)
}
