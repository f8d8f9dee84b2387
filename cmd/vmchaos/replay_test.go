package main

import (
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// TestParkSuggestion: a timed case's failure is pinned by the catalogue
// case that parks its fault kind at the phase the failing runs landed in
// most; a phase without such a case is suggested as a trigger; a phase no
// failpoint names has none; a park case needs none.
func TestParkSuggestion(t *testing.T) {
	timed := scenarios.Case{ID: "t@5ms", Scenario: &scenarios.Scenario{ID: "t", Faults: []scenarios.Fault{{Kind: "sigkill-main", Trigger: "at vm.clone.vmm-launched"}}}}
	fail := func(phase string) reports.Case {
		return reports.Case{Verdict: reports.Fail, LandedPhase: phase, Invariants: []reports.Invariant{{Name: "intent-goal"}}}
	}
	pass := reports.Case{Verdict: reports.Pass, LandedPhase: "vm.clone.restored"}
	got := parkSuggestion(timed, fail("vm.clone.reserved"), []reports.Case{pass, fail("vm.clone.reserved"), fail("vm.clone.files-copied"), pass})
	if !strings.Contains(got, "park vm.clone.reserved (2 failing run(s) landed there)") || !strings.Contains(got, "--scenario park-vm-clone-reserved-sigkill-main") {
		t.Fatalf("want the catalogue park case at vm.clone.reserved, got %q", got)
	}
	direct := timed
	direct.Scenario = &scenarios.Scenario{ID: "t", Faults: []scenarios.Fault{{Kind: "sigkill-vmm", Trigger: "at vm.clone.vmm-launched"}}}
	if got := parkSuggestion(direct, fail("vm.clone.reserved"), nil); !strings.Contains(got, `trigger "park vm.clone.reserved" with fault sigkill-vmm; no catalogue case`) {
		t.Fatalf("want a trigger suggestion, got %q", got)
	}
	if got := parkSuggestion(timed, fail("steady state"), nil); !strings.HasPrefix(got, "none:") {
		t.Fatalf("a phase no failpoint names has no park point: %q", got)
	}
	parked := scenarios.Case{Scenario: &scenarios.Scenario{Faults: []scenarios.Fault{{Kind: "stop", Trigger: "park snapshot.save.paused"}}}}
	if got := parkSuggestion(parked, fail("snapshot.save.paused"), nil); !strings.Contains(got, "already parks at snapshot.save.paused") {
		t.Fatalf("a park case: %q", got)
	}
}

// TestReplayRefusesWhatTheScheduleDecides: --replay takes the seed, scale,
// filter and the rest from the schedule, so giving one beside it is an
// error; results without a schedule cannot be replayed; a negative
// --repro-check is refused.
func TestReplayRefusesWhatTheScheduleDecides(t *testing.T) {
	dir := t.TempDir()
	res := &reports.Results{RunID: "r", Backend: "fake", TimeScale: 0.05, Cases: []reports.Case{{ID: "c", Scenario: "c", Verdict: reports.Pass, Attempts: 1}}}
	if err := reports.WriteAll(dir, res); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--replay", dir, "--seed", "3"}, "--replay takes --seed from the recorded schedule"},
		{[]string{"--replay", dir, "--label-filter", "speed:fast"}, "--replay takes --label-filter"},
		{[]string{"--replay", dir}, "the results record no schedule"},
		{[]string{"--replay", dir + "/missing"}, "--replay"},
	} {
		c := newRunCmd()
		c.SetArgs(tc.args)
		c.SetOut(&strings.Builder{})
		c.SetErr(&strings.Builder{})
		err := c.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: want an error naming %q, got %v", tc.args, tc.want, err)
		}
	}
}
