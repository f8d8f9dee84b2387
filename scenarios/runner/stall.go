package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios/checker"
)

// A fault whose trigger point never came within the operation's budget did
// not land, but that alone proves nothing either way: the product may have
// hung or skipped the phase (a bug), or taken another valid path to its
// goal. The stack is judged at once, before anything else touches it
// (issue #31): off its goal, failed or not answering is a product fail with
// the missing phase named; at its goal, the case stays inconclusive.

// unreachedPoint is the trigger a fault's wait gave up on because the
// operation's budget ran out before its point was hit ("" when the wait
// ended for another reason: it fired, or the harness failed).
func unreachedPoint(trig string, err error) string {
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		return ""
	}
	return trig
}

// delivered reports whether any fault was fired at the stack (landed in its
// window or not): its state may then be the fault's effect, not the
// operation's own, and is not judged here.
func delivered(injs []reports.Injection) bool {
	for _, in := range injs {
		if in.ActualNs > 0 {
			return true
		}
	}
	return false
}

// judgeStall decides a case none of whose faults reached the stack because
// the points they wait for never came (cr.unreached): nil when there is no
// such fault, a product error when the stack is off its goal, else a
// landing error that says the operation reached its goal another way.
func (cr *caseRun) judgeStall(ctx context.Context, budget time.Duration) error {
	if len(cr.unreached) == 0 || delivered(cr.rc.Injections) {
		return nil
	}
	missing := strings.Join(cr.unreached, ", ")
	ev := cr.goalEvidence(ctx)
	if len(ev) == 0 {
		return landingErr(fmt.Errorf("the operation never reached %s within %s but reached every goal another way: nothing proven", missing, budget))
	}
	cr.rc.Invariants = append(cr.rc.Invariants, cr.stallWedge(ctx)...)
	return productErr(OperationProgressed, fmt.Errorf("the operation never reached %s within %s and the stack is off its goal: %s",
		missing, budget, strings.Join(ev, "; ")))
}

// goalEvidence is one look at the stack's goals: checker.IntentGoal (every
// intent at its goal, nothing failed, the agent answering) and
// checker.OneVMPerName (the case's own VMs each running once). It returns
// the evidence of what is wrong, none when every goal holds.
func (cr *caseRun) goalEvidence(ctx context.Context) []string {
	in := &checker.Input{Stack: cr.st, Goals: cr.goals, Generation: cr.gens, DirectVMs: cr.s.Expect.DirectVMs}
	var ev []string
	for _, inv := range checker.Evaluate(in, checker.Collect(ctx, in, failpoint.Now)) {
		if (inv.Name == checker.IntentGoal || inv.Name == checker.OneVMPerName) && !inv.OK {
			ev = append(ev, inv.Name+": "+inv.Evidence)
		}
	}
	return ev
}
