package reports

import (
	"bytes"
	"strings"
	"testing"
)

// detRun is a case run with a verdict and the invariants it violated.
func detRun(id, verdict string, violated ...string) Case {
	c := Case{ID: id, Verdict: verdict}
	for _, v := range violated {
		c.Invariants = append(c.Invariants, Invariant{Name: v})
	}
	c.Invariants = append(c.Invariants, Invariant{Name: "one-vm-per-name", OK: true})
	return c
}

func passes(n int) []Case {
	out := make([]Case, n)
	for i := range out {
		out[i] = detRun("c", Pass)
	}
	return out
}

func TestMeasureDetection(t *testing.T) {
	with := []Case{
		detRun("c", Pass),                    // 1: not detected
		detRun("c", Fail, "intent-goal"),     // 2: caught
		detRun("c", Fail, "events-observed"), // 3: failed, but not on the bug's invariant
		detRun("c", Fail, "intent-goal", "no-failed-write"),
		detRun("c", Inconclusive), // 5: a harness timeout is no detection
	}
	d := MeasureDetection("intent-goal", with, passes(5), 5, false, false)
	if d.Runs != 5 || d.Caught != 2 || d.FirstCatch != 2 || d.CleanRuns != 5 || d.FalsePositives != 0 || d.StoppedEarly {
		t.Fatalf("rate = %+v; want runs 5, caught 2, first 2, clean 5, fp 0", d)
	}
	if got := d.RateLabel(); got != "2/5 (40 %)" {
		t.Errorf("RateLabel = %q", got)
	}
	if ok, note := d.Judge(); !ok {
		t.Errorf("a timed row caught 2/5 without false positives must hold (reported under 100 %%), got %q", note)
	}
	if d.Full() {
		t.Error("2/5 reported as full")
	}
	// the same runs parked at an exact phase: must be 5/5
	d.Exact = true
	if ok, note := d.Judge(); ok || !strings.Contains(note, "2/5: must be 5/5") {
		t.Errorf("park row 2/5: ok=%v note=%q; want a failure naming 2/5 and 5/5", ok, note)
	}

	none := MeasureDetection("intent-goal", []Case{detRun("c", Pass), detRun("c", Fail, "x")}, passes(2), 2, false, false)
	if none.Caught != 0 || none.FirstLabel() != "—" {
		t.Errorf("no catch: %+v first %q", none, none.FirstLabel())
	}
	if ok, _ := none.Judge(); ok {
		t.Error("a row caught 0/2 holds")
	}
}

func TestDetectionFalsePositive(t *testing.T) {
	with := []Case{detRun("c", Fail, "intent-goal"), detRun("c", Fail, "intent-goal")}
	without := []Case{detRun("c", Pass), detRun("c", Fail, "intent-goal")}
	d := MeasureDetection("intent-goal", with, without, 2, false, true)
	if d.FalsePositives != 1 || d.FalsePositiveLabel() != "1/2" {
		t.Fatalf("false positives = %+v (%s); want 1/2", d, d.FalsePositiveLabel())
	}
	if ok, note := d.Judge(); ok || !strings.Contains(note, "false positive") {
		t.Errorf("a false positive must fail the row: ok=%v note=%q", ok, note)
	}
	// an inconclusive run without the bug proves nothing clean either
	d = MeasureDetection("intent-goal", with, []Case{detRun("c", Pass), detRun("c", Inconclusive)}, 2, false, false)
	if ok, _ := d.Judge(); ok || d.FalsePositives != 1 {
		t.Errorf("inconclusive bug-off run: %+v ok=%v", d, ok)
	}
	// an interrupted row (fewer runs than asked, no --failfast) does not hold
	d = MeasureDetection("intent-goal", []Case{detRun("c", Fail, "intent-goal"), {}}, passes(2), 2, false, false)
	if ok, note := d.Judge(); ok || d.RateLabel() != "1/1 (100 %), 1 of 2 runs done" {
		t.Errorf("interrupted row: ok=%v %q %q", ok, note, d.RateLabel())
	}
	// missing data never passes
	d = MeasureDetection("intent-goal", with, []Case{{}, {}}, 2, false, false)
	if ok, _ := d.Judge(); ok {
		t.Error("a row without any bug-off run holds")
	}
}

func TestDetectionFailfast(t *testing.T) {
	with := []Case{detRun("c", Pass), detRun("c", Fail, "intent-goal"), {}, {}, {}}
	d := MeasureDetection("intent-goal", with, passes(5), 5, true, false)
	if d.Runs != 2 || d.Caught != 1 || d.FirstCatch != 2 || !d.StoppedEarly {
		t.Fatalf("failfast: %+v", d)
	}
	if got := d.RateLabel(); got != "1/2 (50 %), stopped early after run 2 of 5" {
		t.Errorf("RateLabel = %q", got)
	}
	first := MeasureDetection("intent-goal", []Case{detRun("c", Fail, "intent-goal"), {}, {}}, passes(3), 3, true, true)
	if ok, note := first.Judge(); !ok || !first.Full() || first.RateLabel() != "1/1 (100 %), stopped early after run 1 of 3" {
		t.Errorf("failfast park row caught at run 1: ok=%v %q %q", ok, note, first.RateLabel())
	}
}

func TestPercentNeverRoundsUp(t *testing.T) {
	for _, c := range []struct {
		k, n int
		want string
	}{{19, 20, "95 %"}, {199, 200, "99 %"}, {20, 20, "100 %"}, {0, 3, "0 %"}, {0, 0, "-"}} {
		if got := percent(c.k, c.n); got != c.want {
			t.Errorf("percent(%d, %d) = %q, want %q", c.k, c.n, got, c.want)
		}
	}
}

// rateRow is a selftest row judged from its rate, as cmd/vmchaos does.
func rateRow(bug, scenario string, d DetectionRate) SelftestRow {
	r := SelftestRow{Bug: bug, Scenario: scenario, WithBugVerdict: Fail, WithBugInvariant: expectedInvariant(bug), WithoutBugVerdict: Pass, Rate: &d}
	r.OK, r.Note = d.Judge()
	return r
}

func TestFormatSelftestRates(t *testing.T) {
	rows := []SelftestRow{
		rateRow("save-rm-by-name", "s001-3-pending-holder", DetectionRate{Count: 5, Runs: 5, Caught: 5, FirstCatch: 1, CleanRuns: 5, Exact: true}),
		rateRow("failed-sticky", "s001-5-transient-failed", DetectionRate{Count: 5, Runs: 5, Caught: 3, FirstCatch: 2, CleanRuns: 5}),
		rateRow("event-stream-pointer-snapshot", "s000-vmm-kill-event", DetectionRate{Count: 5, Runs: 5, Caught: 5, FirstCatch: 1, CleanRuns: 5, FalsePositives: 1}),
		rateRow("net-refuses-paused", "s001-2-owed-nic-drop-on-paused-vm", DetectionRate{Count: 5, Runs: 5, Caught: 4, FirstCatch: 1, CleanRuns: 5, Exact: true}),
	}
	var buf bytes.Buffer
	if err := FormatSelftest(&buf, rows); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	line := func(bug string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, bug+" ") {
				return l
			}
		}
		t.Fatalf("no line for %s in\n%s", bug, out)
		return ""
	}
	if l := line("save-rm-by-name"); !strings.Contains(l, "5/5 (100 %)") || !strings.HasSuffix(strings.TrimSpace(l), "caught") || !strings.Contains(l, "park") {
		t.Errorf("full park row: %q", l)
	}
	if l := line("failed-sticky"); strings.Contains(l, "caught") || !strings.Contains(l, "3/5 (60 %)") || !strings.Contains(l, "UNDER 100 %") {
		t.Errorf("a row under 100 %% must show its rate and not read caught: %q", l)
	}
	if l := line("event-stream-pointer-snapshot"); !strings.Contains(l, "1/5") || !strings.Contains(l, "MISSED: false positive") {
		t.Errorf("false-positive row: %q", l)
	}
	if l := line("net-refuses-paused"); !strings.Contains(l, "MISSED: exact-phase (park) detection 4/5") {
		t.Errorf("park row under N/N: %q", l)
	}
	tally := TallySelftest(rows)
	if tally.OK() || tally.BugsCaught != 1 || len(tally.Partial) != 1 || len(tally.Missed) != 2 {
		t.Errorf("tally = %+v; want not OK, 1 caught in every run, 1 partial, 2 missed", tally)
	}
	if s := tally.String(); !strings.Contains(s, "caught in some runs only: failed-sticky/s001-5-transient-failed 3/5") ||
		!strings.Contains(s, "MISSED: event-stream-pointer-snapshot, net-refuses-paused") {
		t.Errorf("tally string %q", s)
	}
	md := SelftestMarkdown(rows)
	if !strings.Contains(md, "## Detection rates") || !strings.Contains(md, "| `failed-sticky` | `s001-5-transient-failed` | timed | 3/5 (60 %) | 2 | 0/5 | UNDER 100 % |") {
		t.Errorf("markdown rates section:\n%s", md)
	}
	if !strings.Contains(md, "`s001-5-transient-failed` 3/5 (60 %)") {
		t.Errorf("track record must give the rate of a row under 100 %%:\n%s", md)
	}
}

func TestFormatSelftestCountOneUnchanged(t *testing.T) {
	rows := []SelftestRow{rateRow("save-rm-by-name", "s001-3-pending-holder", DetectionRate{Count: 1, Runs: 1, Caught: 1, FirstCatch: 1, CleanRuns: 1, Exact: true})}
	var buf bytes.Buffer
	if err := FormatSelftest(&buf, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "BUG  ") || !strings.Contains(buf.String(), "WITH BUG") || strings.Contains(buf.String(), "DETECTED") {
		t.Errorf("--count 1 must print today's table:\n%s", buf.String())
	}
	if md := SelftestMarkdown(rows); strings.Contains(md, "Detection rates") {
		t.Error("--count 1 selftest.md grew a rates section")
	}
}

func TestRepro(t *testing.T) {
	ns := func(v int64) *int64 { return &v }
	runs := []Case{
		detRun("c.run1", Fail, "intent-goal"), detRun("c.run2", Pass), detRun("c.run3", Fail, "intent-goal"), detRun("c.run4", Fail, "intent-goal"),
	}
	for i := range runs {
		runs[i].LandedPhase = "snapshot.save.pending"
		runs[i].Trigger = "park snapshot.save.pending"
		runs[i].Injections = []Injection{{ErrorNs: ns(int64(100_000 * (i + 1)))}}
	}
	runs[1].LandedPhase = "snapshot.save.paused"
	out := TallyOutcomes(runs)
	if len(out) != 2 || out[0].Outcome != "fail [intent-goal]" || joinInts(out[0].Runs) != "1,3,4" || out[1].Outcome != "pass" {
		t.Fatalf("TallyOutcomes = %+v", out)
	}
	var buf bytes.Buffer
	if err := FormatRepro(&buf, runs); err != nil {
		t.Fatal(err)
	}
	s := buf.String()
	for _, want := range []string{"fail [intent-goal]  3/4 (75 %)  1,3,4", "pass                1/4 (25 %)  2",
		"landed phase (snapshot.save.pending ×3, snapshot.save.paused ×1)", "injection error (+0.1 ms .. +0.4 ms over 4 injections)",
		"the same in every run: window margin"} {
		if !strings.Contains(s, want) {
			t.Errorf("repro table lacks %q:\n%s", want, s)
		}
	}
}
