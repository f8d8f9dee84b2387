package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/reports"
)

// TestReportGateMaxInjectionError: a passing run whose faults landed 3 ms
// after their request is inconclusive under --max-injection-error 1ms, and
// passes without the flag or under a looser bound.
func TestReportGateMaxInjectionError(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "late")
	r := &reports.Results{RunID: "run-1", Backend: "fake", Supervisor: "builtin", TimeScale: 0.05, Seed: 1}
	for _, id := range []string{"a@0", "b@0"} {
		r.Cases = append(r.Cases, reports.Case{ID: id, Scenario: "a", Verdict: reports.Pass, Attempts: 1, ConvergeMs: 100,
			Repro: "vmchaos repro --scenario a", Invariants: []reports.Invariant{{Name: "intent-goal", OK: true}},
			Injections: []reports.Injection{{Fault: "sigkill-main", Trigger: "at p + 10ms", RequestedNs: 5_000_000, ActualNs: 8_000_000,
				Landed: true, LastPhase: "p", IntendedPhase: "p"}}})
	}
	if err := reports.WriteAll(dir, r); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"gate", dir}, 0, "gate: pass"},
		{[]string{"gate", "--max-injection-error", "10ms", dir}, 0, "gate: pass"},
		{[]string{"gate", "--max-injection-error", "1ms", dir}, 2, "INCONCLUSIVE injection error p99 +3.00 ms over 2 timed injection(s) exceeds --max-injection-error 1ms"},
	} {
		out, code := runReport(t, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("report %v: exit %d (want %d), output lacks %q:\n%s", tc.args, code, tc.code, tc.want, out)
		}
	}
}
