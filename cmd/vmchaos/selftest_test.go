package main

import (
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

func TestParkScenario(t *testing.T) {
	if !parkScenario("s001-3-pending-holder") {
		t.Error("s001-3-pending-holder parks its faults at snapshot.save.pending: want exact")
	}
	if parkScenario("s000-vmm-kill-event") || parkScenario("no-such-scenario") {
		t.Error("a \"now\" fault, or an unknown scenario, read as exact")
	}
}

func TestNthRun(t *testing.T) {
	c := scenarios.Case{ID: "s001-3-pending-holder"}
	if got := nthRun(c, 0, 1).ID; got != c.ID {
		t.Errorf("--count 1 renamed the case: %q", got)
	}
	if got := nthRun(c, 2, 5).ID; got != "s001-3-pending-holder.run3" {
		t.Errorf("run 3 of 5: %q", got)
	}
}

func TestSelftestRow(t *testing.T) {
	b := *regress.Lookup("save-rm-by-name")
	failed := reports.Case{ID: "x", Verdict: reports.Fail, Invariants: []reports.Invariant{{Name: "intent-goal"}}}
	other := reports.Case{ID: "x", Verdict: reports.Fail, Invariants: []reports.Invariant{{Name: "no-failed-write"}}}
	pass := reports.Case{ID: "x", Verdict: reports.Pass}
	rowOf := func(with, without []reports.Case, count int) reports.SelftestRow {
		d := reports.MeasureDetection(b.Invariant, with, without, count, false, true)
		return selftestRow(b, "s001-3-pending-holder", with, without, d)
	}
	// one run each: today's notes
	if r := rowOf([]reports.Case{other}, []reports.Case{pass}, 1); r.OK || !strings.Contains(r.Note, "not on intent-goal") {
		t.Errorf("wrong invariant: %+v", r)
	}
	if r := rowOf([]reports.Case{failed}, []reports.Case{failed}, 1); r.OK || !strings.HasPrefix(r.Note, "without the bug the case was fail") {
		t.Errorf("false positive: %+v", r)
	}
	// several runs: the representative is the first that caught the bug
	r := rowOf([]reports.Case{other, failed, failed}, []reports.Case{pass, pass, pass}, 3)
	if r.OK || r.WithBugInvariant != "intent-goal" || r.Rate.Caught != 2 || r.Rate.FirstCatch != 2 || !strings.Contains(r.Note, "2/3: must be 3/3") {
		t.Errorf("park row 2/3: %+v (rate %+v)", r, *r.Rate)
	}
}

// TestOnlyBugsKeepsTheNamedRows: --bug keeps exactly the named bugs' rows
// and refuses an unknown name rather than run an empty plan that passes.
func TestOnlyBugsKeepsTheNamedRows(t *testing.T) {
	plan, err := selftestPlan(false)
	if err != nil {
		t.Fatal(err)
	}
	got, err := onlyBugs(plan, "net-skips-eject-wait")
	if err != nil || len(got) == 0 {
		t.Fatalf("onlyBugs = %v, %v", got, err)
	}
	for _, it := range got {
		if it.bug.Name != "net-skips-eject-wait" {
			t.Fatalf("row of %s kept", it.bug.Name)
		}
	}
	if all, _ := onlyBugs(plan, ""); len(all) != len(plan) {
		t.Fatalf("no --bug kept %d of %d rows", len(all), len(plan))
	}
	if _, err := onlyBugs(plan, "no-such-bug"); err == nil {
		t.Fatal("an unknown bug name was accepted")
	}
}
