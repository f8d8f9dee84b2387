package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/reports"
)

// TestReportGateNotRun: a run with a case the host could not run exits 2
// naming it, and 0 with --allow-not-run (the case still listed).
func TestReportGateNotRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nr")
	r := &reports.Results{RunID: "run-1", Backend: "real", TimeScale: 0.05, Cases: []reports.Case{
		{ID: "a@0", Scenario: "a", Verdict: reports.Pass, Attempts: 1, Invariants: []reports.Invariant{{Name: "intent-goal", OK: true}}},
		{ID: "b@0", Scenario: "b", Verdict: reports.Inconclusive, Culprit: "precondition", Attempts: 1, ConvergeMs: -1, Reason: "real backend unavailable: absent: no /dev/kvm"},
	}, NotRun: []reports.NotRun{{Case: "b@0", Reason: "real backend unavailable: absent: no /dev/kvm", Missing: "KVM (/dev/kvm: absent)", Kind: reports.MissingHostFeature}}}
	if err := reports.WriteAll(dir, r); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"gate", dir}, 2},
		{[]string{"gate", "--allow-not-run", dir}, 0},
	} {
		out, code := runReport(t, tc.args...)
		if code != tc.code || !strings.Contains(out, "NOT RUN b@0: missing host-feature KVM (/dev/kvm: absent)") {
			t.Errorf("report %v: exit %d (want %d) or no NOT RUN line:\n%s", tc.args, code, tc.code, out)
		}
	}
}
