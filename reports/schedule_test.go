package reports

import (
	"encoding/json"
	"strings"
	"testing"
)

func sampleSchedule() *Schedule {
	return &Schedule{Version: ScheduleVersion, Backend: "fake", TimeScale: 0.05, Seed: 7, Workers: 2, Cases: []ScheduleCase{
		{ID: "a@28ms", Scenario: "a", Start: 0, Class: "alone", OffsetNs: 28e6, HasOff: true, Seed: 7,
			Faults: []PlannedFault{{Kind: "sigkill-main", Unit: "agent", Trigger: "at x + 1.4ms", Window: [2]string{"x", "y"}}}},
		{ID: "b", Scenario: "b", Start: 1, Class: "shared", Seed: 7,
			Faults: []PlannedFault{{Kind: "stop", Trigger: "park p", Park: "p", StopForNs: 1e9}}},
	}}
}

// TestDiffSchedulesRoundTripAndTamper: a schedule written to JSON and read
// back has no difference; every edited field (a trigger, an order, the
// seed, a dropped case) is named.
func TestDiffSchedulesRoundTripAndTamper(t *testing.T) {
	a := sampleSchedule()
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var back Schedule
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if d := DiffSchedules(a, &back); len(d) != 0 {
		t.Fatalf("a round trip must not differ: %v", d)
	}
	for _, tc := range []struct {
		name string
		edit func(s *Schedule)
		want string
	}{
		{"trigger", func(s *Schedule) { s.Cases[0].Faults[0].Trigger = "at x + 2ms" }, "fault 0 Trigger: at x + 1.4ms → at x + 2ms"},
		{"park", func(s *Schedule) { s.Cases[1].Faults[0].Park = "q" }, "fault 0 Park: p → q"},
		{"order", func(s *Schedule) { s.Cases[0].Start, s.Cases[1].Start = 1, 0 }, "case 0 (a@28ms) start: 0 → 1"},
		{"seed", func(s *Schedule) { s.Seed = 8 }, "seed: 7 → 8"},
		{"case seed", func(s *Schedule) { s.Cases[1].Seed = 8 }, "case 1 (b) seed: 7 → 8"},
		{"offset", func(s *Schedule) { s.Cases[0].OffsetNs = 29e6 }, "offset_ns: 28000000 → 29000000"},
		{"dropped case", func(s *Schedule) { s.Cases = s.Cases[:1] }, "cases: 2 → 1"},
		{"regress", func(s *Schedule) { s.Regress = []string{"failed-sticky"} }, "regress:  → failed-sticky"},
	} {
		c := sampleSchedule()
		tc.edit(c)
		d := DiffSchedules(a, c)
		if len(d) == 0 || !strings.Contains(strings.Join(d, "\n"), tc.want) {
			t.Errorf("%s: want a difference %q, got %q", tc.name, tc.want, d)
		}
	}
	if d := DiffSchedules(a, nil); len(d) != 1 {
		t.Fatalf("a missing schedule is a difference: %v", d)
	}
}

func inj(fault, trigger string, trigNs, reqNs int64) Injection {
	return Injection{Fault: fault, Trigger: trigger, IntendedPhase: "p", TriggerNs: trigNs, RequestedNs: reqNs, ActualNs: reqNs + 5}
}

// TestCompareRunsFindsHarnessDecisions: two runs whose injections were
// armed alike, set to fire alike and landed at different times are
// equal; a different trigger, a different delay after the trigger hit,
// or a fault armed in one run only is a harness defect; a differing
// verdict is an outcome difference, not a defect. A product VM id in the
// fault text is not a decision, nor is a frac case's measured offset.
func TestCompareRunsFindsHarnessDecisions(t *testing.T) {
	s := sampleSchedule()
	c1 := Case{ID: "a@28ms", Verdict: Pass, Injections: []Injection{inj("sigkill-main", "at x + 1.4ms", 1000, 1001400), inj("sigkill-vmm vm=2TAUCBRY4OOVUOHZGDAQHXKMJU", "now", 0, 50)}}
	c2 := Case{ID: "a@28ms", Verdict: Pass, Injections: []Injection{inj("sigkill-vmm vm=6XJGWDY5WH7DKEMN3E4X5AV5MQ", "now", 0, 90), inj("sigkill-main", "at x + 1.4ms", 7000, 1007400)}}
	if d := CompareRuns(s, s, []Case{c1}, []Case{c2}, nil); d.Defects() != 0 || len(d.Outcomes) != 0 {
		t.Fatalf("equal decisions at other times must not differ:\n%s", d)
	}
	late := c2
	late.Injections = []Injection{inj("sigkill-vmm vm=6XJGWDY5WH7DKEMN3E4X5AV5MQ", "now", 0, 90), inj("sigkill-main", "at x + 1.4ms", 7000, 1007500)}
	d := CompareRuns(s, s, []Case{c1}, []Case{late}, nil)
	if d.Defects() != 1 || !strings.Contains(d.String(), "set to fire 1000400ns after its trigger hit; run 2:") {
		t.Fatalf("a different delay after the trigger is a defect:\n%s", d)
	}
	if d := CompareRuns(s, s, []Case{c1}, []Case{late}, map[string]bool{"a@28ms": true}); d.Defects() != 0 {
		t.Fatalf("a frac case's offset is measured, not decided:\n%s", d)
	}
	other := c2
	other.Injections = []Injection{c2.Injections[0], inj("sigkill-main", "at y + 1.4ms", 7000, 1007400)}
	if d := CompareRuns(s, s, []Case{c1}, []Case{other}, nil); d.Defects() != 1 {
		t.Fatalf("a different trigger is a defect:\n%s", d)
	}
	one := c2
	one.Injections = c2.Injections[:1]
	if d := CompareRuns(s, s, []Case{c1}, []Case{one}, nil); d.Defects() == 0 || !strings.Contains(d.String(), "armed 2 fault(s) in run 1, 1 in run 2") {
		t.Fatalf("a fault armed in one run only is a defect:\n%s", d)
	}
	failed := c2
	failed.Verdict = Fail
	failed.Invariants = []Invariant{{Name: "intent-goal"}}
	if d := CompareRuns(s, s, []Case{c1}, []Case{failed}, nil); d.Defects() != 0 || len(d.Outcomes) != 1 {
		t.Fatalf("a verdict difference is an outcome difference only:\n%s", d)
	}
	tampered := sampleSchedule()
	tampered.Cases[1].Faults[0].Trigger = "park other"
	if d := CompareRuns(s, tampered, []Case{c1}, []Case{c2}, nil); d.Defects() != 1 {
		t.Fatalf("a schedule difference is a defect:\n%s", d)
	}
	if d := CompareRuns(s, s, []Case{c1}, nil, nil); d.Defects() != 1 {
		t.Fatalf("a case missing from pass 2 is a defect:\n%s", d)
	}
}

// TestMeasureRepro: the rate counts reruns with the run's own outcome (the
// same verdict and the same failed invariants); under 95 % it says what
// varied; the report shows the rate, the variation and the suggestion.
func TestMeasureRepro(t *testing.T) {
	fail := func(phase string, invs ...string) Case {
		c := Case{ID: "x", Verdict: Fail, LandedPhase: phase}
		for _, n := range invs {
			c.Invariants = append(c.Invariants, Invariant{Name: n})
		}
		return c
	}
	orig := fail("vm.clone.reserved", "intent-goal")
	all := []Case{fail("vm.clone.reserved", "intent-goal"), fail("vm.clone.reserved", "intent-goal")}
	r := MeasureRepro(orig, all, 2)
	if r.Reproduced != 2 || r.Low() || r.Varied != "" || r.Label() != "2/2 (100 %)" {
		t.Fatalf("every rerun reproduced: %+v %s", r, r.Label())
	}
	mixed := []Case{fail("vm.clone.reserved", "intent-goal"), fail("vm.clone.reserved", "intent-goal", "stable"),
		{ID: "x", Verdict: Pass, LandedPhase: "vm.clone.files-copied"}, fail("vm.clone.reserved", "intent-goal")}
	r = MeasureRepro(orig, mixed, 5)
	if r.Reproduced != 2 || !r.Low() || !strings.Contains(r.Varied, "landed phase (vm.clone.reserved ×4, vm.clone.files-copied ×1)") {
		t.Fatalf("2 of 4 reproduced, another invariant set is not a reproduction: %+v", r)
	}
	if !strings.Contains(r.Label(), "2/4 (50 %), 4 of 5 rerun(s) done (interrupted)") {
		t.Fatalf("label: %s", r.Label())
	}
	orig.ReproRate = r
	r.Suggest = "park vm.clone.reserved (3 failing run(s) landed there)"
	res := &Results{RunID: "r", Backend: "fake", TimeScale: 0.05, Cases: []Case{orig}}
	md, err := Markdown(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Reproduction rate (`--repro-check 5`): **2/4 (50 %", "Under 95 %, what varied", "Park point that pins it: park vm.clone.reserved"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	html, err := HTML(res)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(html), "Reproduction rate") || !strings.Contains(string(html), "Park point that pins it") {
		t.Error("report.html lacks the reproduction rate")
	}
}
