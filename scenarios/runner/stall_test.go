package runner

import (
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// TestStalledAgentFailsAsProduct is the end-to-end proof of issue #31 item 1
// on a real fake-backend stack. The test-only double is a failpoint the
// test adds to the case's own VMCHAOS_FAILPOINTS: the agent pauses at
// agent.create.begin, before the fault's point agent.create.cloned, and never
// goes on. The case must fail as the product's (the missing phase named),
// not come out inconclusive as a fault that did not land. The same case
// whose trigger point is simply not on the operation's path (the create
// reaches ready without it) stays inconclusive.
func TestStalledAgentFailsAsProduct(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts the whole stack; run without -short")
	}
	t.Parallel() // waits out budgets, see runSideBySide
	c, err := scenarios.CaseFor("s001-h-post-clone-running", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	const trigger = "agent.create.cloned"
	if len(c.Scenario.Faults) != 1 || !strings.Contains(c.Scenario.Faults[0].Trigger, trigger) {
		t.Fatalf("the case changed: faults %+v, want one parked at %s", c.Scenario.Faults, trigger)
	}

	stalled := withScenario(c, func(s *scenarios.Scenario) { s.Env.Failpoints = "agent.create.begin=pause@vm=vm-a" })
	otherPath := withScenario(c, func(s *scenarios.Scenario) {
		s.Faults = append([]scenarios.Fault(nil), s.Faults...)
		s.Faults[0].Trigger = "park agent.wake.begin" // never on a create's path
	})
	otherPath.ID += "-other-path" // its own case dir beside the stalled run's
	// both wait out the 20 s budget: side by side (park triggers, no clock)
	ctx, r := newTestRunner(t, 5*time.Minute)
	rcs := runSideBySide(ctx, r, []caseRunArgs{{c: stalled}, {c: otherPath}})

	rc := rcs[0]
	inv, ok := invariant(rc, OperationProgressed)
	if rc.Verdict != reports.Fail || rc.Culprit != "product" || !strings.HasPrefix(rc.Reason, "product: ") ||
		!ok || inv.OK || !strings.Contains(inv.Evidence, trigger) || !strings.Contains(inv.Evidence, "creating") {
		t.Fatalf("stalled agent: %s [%s] (%s), %s %+v; want fail (product) naming %s and the create in flight",
			rc.Verdict, rc.Culprit, rc.Reason, OperationProgressed, inv, trigger)
	}
	t.Logf("stalled: %s", rc.Reason)

	rc = rcs[1]
	if rc.Verdict != reports.Inconclusive || rc.Culprit != "landing" || !strings.Contains(rc.Reason, "agent.wake.begin") {
		t.Fatalf("goal reached without the trigger point: %s [%s] (%s), want inconclusive (landing)", rc.Verdict, rc.Culprit, rc.Reason)
	}
	t.Logf("other path: %s", rc.Reason)
}

// withScenario is c with a changed copy of its scenario (the catalogue's
// stays as it is).
func withScenario(c scenarios.Case, change func(*scenarios.Scenario)) scenarios.Case {
	s := *c.Scenario
	change(&s)
	c.Scenario = &s
	return c
}

func invariant(rc reports.Case, name string) (reports.Invariant, bool) {
	for _, inv := range rc.Invariants {
		if inv.Name == name {
			return inv, true
		}
	}
	return reports.Invariant{}, false
}
