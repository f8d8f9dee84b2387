package runner

import (
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/stack"
)

// TestRegistryCasesCatchTheirBugs runs each real-registry case that targets a
// bug twice against a real distribution server: with the bug switched on it
// must fail on the invariant the bug breaks (the image guard off, a fresh
// boot while the evidence is unreadable, a push reported done before its
// manifest was committed, a push the full registry answered with a 500
// taken as done), and pass without it. The storage-full case must also say
// how long the node took to converge after the heal.
func TestRegistryCasesCatchTheirBugs(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts the whole stack and a registry; run without -short")
	}
	if err := stack.RegistryAvailable(); err != nil {
		t.Skip(err.Error())
	}
	t.Parallel() // waits out budgets, see runSideBySide
	// The runs without a bug go one at a time first (they must pass, and
	// their timing is the catalogue's), then every run with a bug side by
	// side: each waits out its 20 s convergence budget, as in `vmchaos
	// selftest` (issue 37: one after the other they made this test 66 s).
	ctx, r := newTestRunner(t, 8*time.Minute)
	var withBug []caseRunArgs
	for _, id := range []string{"reg-image-changed", "reg-evidence-registry-unreachable", "reg-hibernated-in-registry",
		"reg-push-registry-storage-full"} {
		c, err := scenarios.CaseFor(id, 0, false, "fake")
		if err != nil {
			t.Fatal(err)
		}
		without := r.RunCaseWith(ctx, c, nil)
		if without.Verdict != reports.Pass {
			t.Errorf("%s without a bug: %s (%s)", id, without.Verdict, without.Reason)
		}
		if hasFault(c.Scenario, injector.FaultRegistryStorageFull) && without.ConvergeAfterHealMs == nil {
			t.Errorf("%s: no converge_after_heal_ms", id)
		}
		for _, bug := range c.Scenario.Targets {
			withBug = append(withBug, caseRunArgs{c: c, bugs: []string{bug}})
		}
	}
	if len(withBug) < 4 {
		t.Fatalf("%d runs with a bug, want one per targeted bug of the four cases (at least 4)", len(withBug))
	}
	for i, with := range runSideBySide(ctx, r, withBug) {
		id, bug := withBug[i].c.ID, withBug[i].bugs[0]
		inv := regress.Lookup(bug).Invariant
		if with.Verdict != reports.Fail || !violates(with, inv) {
			t.Errorf("%s with %s: %s (%s), want a fail on %s; invariants %+v", id, bug, with.Verdict, with.Reason, inv, with.Invariants)
		}
	}
}
