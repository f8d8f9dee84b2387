package reports

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"
)

func runsOf(verdicts ...string) []Case {
	var out []Case
	for i, v := range verdicts {
		out = append(out, Case{ID: "sweep-save-stop@80%", Scenario: "sweep-save-stop", Verdict: v, DurationMs: 1000,
			Reason: map[bool]string{true: "", false: "fault did not land: after its window closed"}[v == Pass], Repro: "vmchaos repro r" + string(rune('1'+i)),
			Window: &WindowMargin{Open: "a", Close: "b", EndMs: 100, Fired: true, MarginStartMs: 80, MarginEndMs: float64(20 - 30*i), EndObserved: i > 0}})
	}
	return out
}

func TestJoinRunsMakesDifferingVerdictsFlaky(t *testing.T) {
	c := JoinRuns(runsOf(Pass, Inconclusive, Pass))
	if c.Verdict != Flaky || len(c.Runs) != 3 {
		t.Fatalf("verdict %s with %d runs, want flaky with 3", c.Verdict, len(c.Runs))
	}
	if c.Repro != "vmchaos repro r2" {
		t.Errorf("shown run is %q, want the first that did not pass (r2)", c.Repro)
	}
	if got := RunTally(c.Runs); got != "pass×2, inconclusive×1" {
		t.Errorf("tally %q", got)
	}
	if c.Window.MinMs() != -40 || c.DurationMs != 3000 {
		t.Errorf("worst margin %v, duration %v: want -40 and 3000", c.Window.MinMs(), c.DurationMs)
	}
	if same := JoinRuns(runsOf(Inconclusive, Inconclusive)); same.Verdict != Inconclusive {
		t.Errorf("agreeing runs gave %s", same.Verdict)
	}
}

func TestGateTreatsFlakyAsNotPass(t *testing.T) {
	for _, tc := range []struct {
		runs []string
		want int
	}{
		{[]string{Pass, Inconclusive}, GateInconclusive},
		{[]string{Pass, Fail, Pass}, GateFail},
		{[]string{Pass, Error}, GateInfra},
	} {
		r := &Results{RunID: "r", Cases: []Case{JoinRuns(runsOf(tc.runs...))}}
		g := Gate(r, nil, DefaultGateOptions())
		if g.Code != tc.want || !strings.Contains(g.String(), "FLAKY sweep-save-stop@80%") {
			t.Errorf("%v: code %d, want %d:\n%s", tc.runs, g.Code, tc.want, g)
		}
		if err := Validate(r); err != nil {
			t.Errorf("flaky results do not validate: %v", err)
		}
	}
}

func TestFlakyInJUnitMarkdownAndHTML(t *testing.T) {
	r := &Results{RunID: "r", Cases: []Case{JoinRuns(runsOf(Pass, Inconclusive, Pass)), JoinRuns(runsOf(Pass, Pass))}}
	b, err := JUnit(r)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Failures int `xml:"failures,attr"`
			Cases    []struct {
				Failure *struct {
					Type string `xml:"type,attr"`
				} `xml:"failure"`
				Flaky []struct {
					Type    string `xml:"type,attr"`
					Message string `xml:"message,attr"`
				} `xml:"flakyFailure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	s := doc.Suites[0]
	if s.Failures != 1 || s.Cases[0].Failure == nil || s.Cases[0].Failure.Type != "flaky" || len(s.Cases[0].Flaky) != 1 ||
		s.Cases[0].Flaky[0].Type != Inconclusive || !strings.HasPrefix(s.Cases[0].Flaky[0].Message, "run 2:") {
		t.Errorf("flaky case in junit: %+v", s)
	}
	if s.Cases[1].Failure != nil || len(s.Cases[1].Flaky) != 0 {
		t.Errorf("stable pass carries failure/flaky records: %+v", s.Cases[1])
	}
	md, _ := Markdown(r)
	for _, want := range []string{"pass×2, inconclusive×1", "window margin", "start +80 ms / end −10 ms", "1 flaky"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	html, err := HTML(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"v-flaky", "pass×2, inconclusive×1", "/ end −10 ms"} {
		if !bytes.Contains(html, []byte(want)) {
			t.Errorf("report.html lacks %q", want)
		}
	}
}

func TestStabilityCountsFlipsAcrossRunDirs(t *testing.T) {
	idle := &Results{Cases: []Case{JoinRuns(runsOf(Pass, Pass)), {ID: "park-x", Verdict: Pass}}}
	loaded := &Results{Cases: []Case{JoinRuns(runsOf(Pass, Pass)), {ID: "park-x", Verdict: Inconclusive}}}
	f := Stability(idle, loaded)
	if f.Cases != 2 || f.Runs != 6 || len(f.Flipped) != 1 || !strings.HasPrefix(f.Flipped[0], "park-x: ") {
		t.Fatalf("figures %+v: want 2 cases, 6 runs, park-x flipped", f)
	}
	if f.WorstMarginMs != -10 || f.WorstCase != "sweep-save-stop@80%" {
		t.Errorf("worst margin %v at %s, want -10 at sweep-save-stop@80%%", f.WorstMarginMs, f.WorstCase)
	}
	var out bytes.Buffer
	f.Write(&out)
	if !strings.Contains(out.String(), "2 cases, 6 case runs, 1 flipped") || !strings.Contains(out.String(), "FLIPPED park-x") {
		t.Errorf("printed:\n%s", out.String())
	}
	if g := Stability(idle); len(g.Flipped) != 0 || len(g.NotPass) != 0 {
		t.Errorf("a stable all-pass run: %+v", g)
	}
}

// TestRepeatComposesWithShards: shards run with --repeat merge into one run
// that keeps each case's runs and its flaky verdict; shards of different
// --repeat or --load do not merge.
func TestRepeatComposesWithShards(t *testing.T) {
	a := &Results{RunID: "s1", Shard: "1/2", Repeat: 2, Load: "cpu=1", Cases: []Case{JoinRuns(runsOf(Pass, Inconclusive))}}
	b := &Results{RunID: "s2", Shard: "2/2", Repeat: 2, Load: "cpu=1", Cases: []Case{{ID: "park-x", Verdict: Pass,
		Runs: []RunOutcome{{Verdict: Pass}, {Verdict: Pass}}}}}
	m, err := Merge(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if m.Repeat != 2 || m.Load != "cpu=1" || len(m.Cases) != 2 || len(m.MissingShards) != 0 {
		t.Fatalf("merged: repeat %d, load %q, %d cases, missing %v", m.Repeat, m.Load, len(m.Cases), m.MissingShards)
	}
	if g := Gate(m, nil, DefaultGateOptions()); g.Code != GateInconclusive || !strings.Contains(g.String(), "FLAKY") {
		t.Errorf("gate of the merge: %d\n%s", g.Code, g)
	}
	b.Repeat = 3
	if _, err := Merge(a, b); err == nil || !strings.Contains(err.Error(), "--repeat") {
		t.Errorf("merging --repeat 2 with --repeat 3: %v", err)
	}
}
