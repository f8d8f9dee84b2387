package runner

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// TestCaseCatchesBugAndPassesWithout runs one real case (nodeagent, vmctl
// and fakech processes, builtin supervisor) twice: with the historical
// save-preflight bug switched on it must fail on the invariant that bug
// breaks, and pass without it. Teardown must leave no process of either case.
func TestCaseCatchesBugAndPassesWithout(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts the whole stack; run without -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := New(ctx, Options{ReportDir: t.TempDir(), Supervisor: "builtin", Scale: 0.05, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := scenarios.CaseFor("s001-3-pending-holder", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	with := r.RunCaseWith(ctx, c, []string{"save-preflight-ignores-pending"})
	if with.Verdict != reports.Fail || !violates(with, "save-rejected-before-capture") {
		t.Fatalf("with the bug: %s (%s), invariants %+v", with.Verdict, with.Reason, with.Invariants)
	}
	if !strings.HasPrefix(with.Repro, "VMCHAOS_REGRESS=save-preflight-ignores-pending vmchaos repro --scenario s001-3-pending-holder") {
		t.Errorf("repro = %q", with.Repro)
	}
	without := r.RunCaseWith(ctx, c, nil)
	if without.Verdict != reports.Pass {
		t.Fatalf("without the bug: %s (%s)", without.Verdict, without.Reason)
	}
	if without.LandedPhase != "snapshot.save.pending" || len(without.Injections) != 2 {
		t.Errorf("landed %q with %d injections", without.LandedPhase, len(without.Injections))
	}
	for _, rc := range []reports.Case{with, without} {
		if _, ok := rc.Logs["nodeagent"]; !ok {
			t.Errorf("%s: no agent log recorded: %v", rc.ID, rc.Logs)
		}
	}
	if left := leftovers(r); len(left) > 0 {
		t.Fatalf("processes left: %v", left)
	}
}

func violates(rc reports.Case, name string) bool {
	for _, inv := range rc.Invariants {
		if inv.Name == name && !inv.OK {
			return true
		}
	}
	return false
}

// leftovers lists processes whose command line names the run's temp dir.
func leftovers(r *Runner) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), r.run.TmpDir+"/") {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}
