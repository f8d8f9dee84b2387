package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/reports"
)

func benchResults(verdicts ...string) *reports.Results {
	r := &reports.Results{}
	for i := 0; i+1 < len(verdicts); i += 2 {
		r.Cases = append(r.Cases, reports.Case{ID: verdicts[i], Verdict: verdicts[i+1]})
	}
	return r
}

func TestCompareBenchSameVerdictsDifferNowhere(t *testing.T) {
	seq := benchResults("a", reports.Pass, "b", reports.Fail)
	sched := benchResults("b", reports.Fail, "a", reports.Pass) // completion order does not matter
	if c := compareBench(seq, sched); len(c.Differ)+len(c.OnlyIn) != 0 {
		t.Errorf("same verdicts: %+v", c)
	}
}

func TestCompareBenchFindsFlipsAndMissingCases(t *testing.T) {
	seq := benchResults("a", reports.Pass, "b", reports.Pass, "c", reports.Pass)
	sched := benchResults("a", reports.Pass, "b", reports.Inconclusive, "d", reports.Pass)
	c := compareBench(seq, sched)
	if len(c.Differ) != 1 || !strings.HasPrefix(c.Differ[0], "b:") {
		t.Errorf("Differ = %v, want b", c.Differ)
	}
	want := []string{"c: only in sequential", "d: only in scheduled"}
	if strings.Join(c.OnlyIn, "|") != strings.Join(want, "|") {
		t.Errorf("OnlyIn = %v, want %v", c.OnlyIn, want)
	}
}

func TestWriteBenchPrintsWallRateAndDifferences(t *testing.T) {
	seq := benchResults("a", reports.Pass, "b", reports.Pass)
	sched := benchResults("a", reports.Pass, "b", reports.Fail)
	sched.Parallel = "auto=3 (2 CPUs, load 0.50)"
	runs := []*benchRun{{Name: "sequential", Wall: 2 * time.Minute, Res: seq, LoadBefore: "0.1 0.2 0.3"},
		{Name: "scheduled", Wall: time.Minute, Res: sched, LoadBefore: "0.5 0.4 0.3", Exit: 1}}
	var b bytes.Buffer
	writeBench(&b, "speed:fast", 0.05, runs, []benchComparison{compareBench(seq, sched)})
	out := b.String()
	for _, w := range []string{"sequential  2", "1.0", "2.0", "auto=3", "scheduled wall time: 50% of sequential (×2.00)", "verdict differences: 1", "  b: "} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func TestBenchRunsOnePerParallelValue(t *testing.T) {
	runs, err := benchRuns("auto")
	if err != nil || len(runs) != 2 || runs[1].Name != "scheduled" || runs[1].Parallel != "auto" {
		t.Fatalf("auto: %v %+v", err, runs)
	}
	runs, err = benchRuns("2, 3")
	if err != nil || len(runs) != 3 || runs[1].Name != "scheduled-2" || runs[2].Name != "scheduled-3" || runs[2].Parallel != "3" {
		t.Fatalf("2,3: %v %+v", err, runs)
	}
	for _, bad := range []string{"", "0", "2,,3", "x"} {
		if _, err := benchRuns(bad); err == nil {
			t.Errorf("--parallel %q accepted", bad)
		}
	}
}

func TestWriteBenchComparesEveryScheduledRunWithTheSequentialOne(t *testing.T) {
	seq := benchResults("a", reports.Pass, "b", reports.Pass)
	two := benchResults("a", reports.Pass, "b", reports.Pass)
	three := benchResults("a", reports.Fail, "b", reports.Pass)
	three.Cases[0].ClockMs, three.Cases[0].ClockWaitMs = 1500, 700
	runs := []*benchRun{{Name: "sequential", Wall: 4 * time.Minute, Res: seq},
		{Name: "scheduled-2", Wall: 3 * time.Minute, Res: two}, {Name: "scheduled-3", Wall: 2 * time.Minute, Res: three}}
	var b bytes.Buffer
	writeBench(&b, "speed:fast", 0.05, runs, []benchComparison{compareBench(seq, two), compareBench(seq, three)})
	out := b.String()
	for _, w := range []string{"scheduled-2 wall time: 75% of sequential", "scheduled-3 wall time: 50% of sequential",
		"scheduled-2 verdict differences: 0", "scheduled-3 verdict differences: 1", "  a: ",
		"scheduled-3: alone cases' timed parts held the machine 1.5s in all (serial time), after waiting 700ms in all"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func TestWriteBenchPrintsEachRunsCPUAndCores(t *testing.T) {
	seq := benchResults("a", reports.Pass)
	sched := benchResults("a", reports.Pass)
	runs := []*benchRun{{Name: "sequential", Wall: 2 * time.Minute, CPU: time.Minute, Res: seq},
		{Name: "scheduled", Wall: time.Minute, CPU: 54 * time.Second, Res: sched}}
	var b bytes.Buffer
	writeBench(&b, "speed:fast", 0.05, runs, []benchComparison{compareBench(seq, sched)})
	out := b.String()
	for _, w := range []string{"CPU", "CORES", "1m0s  0.50", "54s   0.90"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func TestBenchRunsShareTheShardAndDifferInParallelOnly(t *testing.T) {
	o := benchChaosCmd{filter: "!speed:nightly", backend: "fake", supervisor: "auto", scale: 0.05, seed: 1, shard: "1/8"}
	seq := strings.Join(o.runArgs(&benchRun{Parallel: "1", Dir: "d/sequential"}), " ")
	three := strings.Join(o.runArgs(&benchRun{Parallel: "3", Dir: "d/scheduled-3"}), " ")
	for _, args := range []string{seq, three} {
		if !strings.Contains(args, "--shard 1/8") || !strings.Contains(args, "--label-filter !speed:nightly") {
			t.Errorf("run args %q lack the selection", args)
		}
	}
	if !strings.Contains(seq, "--parallel 1 ") || !strings.Contains(three, "--parallel 3 ") {
		t.Errorf("--parallel: %q / %q", seq, three)
	}
	o.shard = ""
	if args := strings.Join(o.runArgs(&benchRun{Parallel: "2"}), " "); strings.Contains(args, "--shard") {
		t.Errorf("no --shard asked, got %q", args)
	}
	// the scheduled runs take --case-times; the sequential one has no order to take
	o.caseTimes = "off"
	if args := strings.Join(o.runArgs(&benchRun{Parallel: "2"}), " "); !strings.Contains(args, "--case-times off") {
		t.Errorf("scheduled run without --case-times off: %q", args)
	}
	if args := strings.Join(o.runArgs(&benchRun{Parallel: "1"}), " "); strings.Contains(args, "--case-times") {
		t.Errorf("sequential run given --case-times: %q", args)
	}
}
