package runner

import (
	"context"
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
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r, err := New(ctx, Options{ReportDir: t.TempDir(), Supervisor: "builtin", Scale: 0.05, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, id := range []string{"reg-image-changed", "reg-evidence-registry-unreachable", "reg-hibernated-in-registry",
		"reg-push-registry-storage-full"} {
		c, err := scenarios.CaseFor(id, 0, false, "fake")
		if err != nil {
			t.Fatal(err)
		}
		for _, bug := range c.Scenario.Targets {
			with := r.RunCaseWith(ctx, c, []string{bug})
			inv := regress.Lookup(bug).Invariant
			if with.Verdict != reports.Fail || !violates(with, inv) {
				t.Errorf("%s with %s: %s (%s), want a fail on %s; invariants %+v", id, bug, with.Verdict, with.Reason, inv, with.Invariants)
			}
		}
		without := r.RunCaseWith(ctx, c, nil)
		if without.Verdict != reports.Pass {
			t.Errorf("%s without a bug: %s (%s)", id, without.Verdict, without.Reason)
		}
		if hasFault(c.Scenario, injector.FaultRegistryStorageFull) && without.ConvergeAfterHealMs == nil {
			t.Errorf("%s: no converge_after_heal_ms", id)
		}
	}
	if left := leftovers(r); len(left) > 0 {
		t.Fatalf("processes left: %v", left)
	}
}
