package reports

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
)

// run builds a minimal run whose cases have the given verdicts.
func run(verdicts ...string) *Results {
	r := &Results{RunID: "r", Backend: "fake", TimeScale: 0.05}
	for i, v := range verdicts {
		r.Cases = append(r.Cases, Case{ID: fmt.Sprintf("c%d", i), Scenario: "s", Verdict: v, ConvergeMs: 100, Attempts: 1,
			Repro:      fmt.Sprintf("vmchaos repro --scenario s --offset %d", i),
			Invariants: []Invariant{{Name: "intent-goal", OK: v != Fail, Evidence: "vm-a stuck in failed"}}})
	}
	return r
}

func TestGateExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		verdicts []string
		want     int
		line     string
	}{
		{"all pass", []string{Pass, Pass}, GatePass, "gate: pass (exit 0)"},
		{"one invariant violated", []string{Pass, Fail}, GateFail, "FAIL c1: invariant(s) intent-goal (vm-a stuck in failed); repro: vmchaos repro --scenario s --offset 1"},
		{"inconclusive", []string{Pass, Inconclusive}, GateInconclusive, "INCONCLUSIVE c1"},
		{"harness error", []string{Pass, Error}, GateInfra, "ERROR c1"},
		{"failure outranks harness error", []string{Error, Fail, Inconclusive}, GateFail, "FAIL c1"},
		{"harness error outranks inconclusive", []string{Inconclusive, Error}, GateInfra, "ERROR c1"},
		{"no cases is not a pass", nil, GateInconclusive, "nothing was tested"},
		{"unknown verdict is an infrastructure error", []string{Pass, "weird"}, GateInfra, `unknown verdict "weird"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := Gate(run(tc.verdicts...), nil, DefaultGateOptions())
			if g.Code != tc.want {
				t.Fatalf("code %d, want %d:\n%s", g.Code, tc.want, g)
			}
			if !strings.Contains(g.String(), tc.line) {
				t.Fatalf("lines lack %q:\n%s", tc.line, g)
			}
			if !strings.HasPrefix(g.Lines[len(g.Lines)-1], "gate: ") {
				t.Fatal("last line is not the tally")
			}
			err := g.Err()
			if tc.want == GatePass {
				if err != nil {
					t.Fatalf("Err() = %v for a pass", err)
				}
				return
			}
			var ec interface{ ExitCode() int }
			if !errors.As(err, &ec) || ec.ExitCode() != tc.want {
				t.Fatalf("Err() = %v, want an ExitCode() of %d", err, tc.want)
			}
		})
	}
	if g := Gate(nil, nil, DefaultGateOptions()); g.Code != GateInfra {
		t.Fatalf("nil results: code %d", g.Code)
	}
}

func TestGateMissingShardsIsInconclusive(t *testing.T) {
	r := run(Pass)
	r.Shards, r.MissingShards = []string{"1/3", "3/3"}, []string{"2/3"}
	g := Gate(r, nil, DefaultGateOptions())
	if g.Code != GateInconclusive || !strings.Contains(g.String(), "lack shard(s) 2/3") {
		t.Fatalf("code %d:\n%s", g.Code, g)
	}
}

func TestGateFlakyCountsOnlyWhenAsked(t *testing.T) {
	r := run(Pass, Pass)
	r.Cases[1].Attempts = 3
	if g := Gate(r, nil, DefaultGateOptions()); g.Code != GatePass {
		t.Fatalf("flaky pass failed the default gate:\n%s", g)
	}
	opt := DefaultGateOptions()
	opt.FlakyFails = true
	if g := Gate(r, nil, opt); g.Code != GateFail || !strings.Contains(g.String(), "FLAKY c1 passed only after 3 attempts") {
		t.Fatalf("flaky-fails: code %d:\n%s", g.Code, g)
	}
}

func TestGateAgainstBaseline(t *testing.T) {
	withMs := func(r *Results, ms ...float64) *Results {
		for i := range r.Cases {
			r.Cases[i].ConvergeMs = ms[i]
		}
		return r
	}
	base := func() *Results { return withMs(run(Pass, Pass, Pass, Pass), 100, 100, 100, 1000) }
	for _, tc := range []struct {
		name string
		cur  *Results
		opt  GateOptions
		want int
		line string
	}{
		{"same as baseline", base(), DefaultGateOptions(), GatePass, "convergence p95 1.00 s vs baseline 1.00 s (limit 1.20 s) over 4 cases: ok"},
		{"a case that passed now fails", run(Pass, Fail, Pass, Pass), DefaultGateOptions(), GateFail, "REGRESSION c1 passed in baseline r and fails now"},
		{"p95 within tolerance", withMs(run(Pass, Pass, Pass, Pass), 100, 100, 100, 1150), DefaultGateOptions(), GatePass, "ok"},
		{"p95 beyond tolerance", withMs(run(Pass, Pass, Pass, Pass), 100, 100, 100, 1300), DefaultGateOptions(), GateFail,
			"REGRESSION convergence p95 1.30 s > baseline 1.00 s + 20% (limit 1.20 s) over the 4 cases converged in both runs"},
		{"slack absorbs small growth", withMs(run(Pass, Pass, Pass, Pass), 100, 100, 100, 1300), GateOptions{P95Tolerance: 0.2, P95SlackMs: 150}, GatePass, "ok"},
		{"negative tolerance disables", withMs(run(Pass, Pass, Pass, Pass), 100, 100, 100, 9000), GateOptions{P95Tolerance: -1}, GatePass, "baseline r"},
		{"missing cases are noted", run(Pass, Pass), DefaultGateOptions(), GatePass, "NOTE 2 baseline case(s) are not in this run"},
		{"lost coverage is noted", run(Pass, Inconclusive, Pass, Pass), DefaultGateOptions(), GateInconclusive, "NOTE c1 passed in the baseline and is inconclusive now"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := Gate(tc.cur, base(), tc.opt)
			if g.Code != tc.want || !strings.Contains(g.String(), tc.line) {
				t.Fatalf("code %d (want %d), lines:\n%s\nwant a line with %q", g.Code, tc.want, g, tc.line)
			}
		})
	}
	// A different time scale makes convergence figures incomparable.
	cur := withMs(run(Pass, Pass, Pass, Pass), 9000, 9000, 9000, 9000)
	cur.TimeScale = 1
	g := Gate(cur, base(), DefaultGateOptions())
	if g.Code != GatePass || !strings.Contains(g.String(), "not comparable") {
		t.Fatalf("scale mismatch: code %d:\n%s", g.Code, g)
	}
	// A case fixed since the baseline is reported.
	bad := run(Pass, Fail)
	if g := Gate(run(Pass, Pass), bad, DefaultGateOptions()); !strings.Contains(g.String(), "FIXED c1") {
		t.Fatalf("fixed not noted:\n%s", g)
	}
}

func TestShardCoversEveryIDExactlyOnceAndBalanced(t *testing.T) {
	var ids []string
	for i := range 53 {
		ids = append(ids, fmt.Sprintf("scenario-%d@%dms", i%7, i*25))
	}
	for n := 1; n <= 8; n++ {
		seen := map[string]int{}
		minSz, maxSz := len(ids), 0
		for i := 1; i <= n; i++ {
			part := Shard(ids, i, n)
			minSz, maxSz = min(minSz, len(part)), max(maxSz, len(part))
			for _, id := range part {
				seen[id]++
			}
			if !slices.IsSortedFunc(part, func(a, b string) int { return slices.Index(ids, a) - slices.Index(ids, b) }) {
				t.Fatalf("shard %d/%d does not keep input order", i, n)
			}
		}
		if len(seen) != len(ids) {
			t.Fatalf("n=%d: %d of %d ids covered", n, len(seen), len(ids))
		}
		for id, k := range seen {
			if k != 1 {
				t.Fatalf("n=%d: %s in %d shards", n, id, k)
			}
		}
		if maxSz-minSz > 1 {
			t.Fatalf("n=%d: shard sizes %d..%d", n, minSz, maxSz)
		}
	}
}

func TestShardIgnoresCatalogueOrderAndDuplicates(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}
	rev := slices.Clone(ids)
	slices.Reverse(rev)
	for i := 1; i <= 3; i++ {
		x, y := Shard(ids, i, 3), Shard(append(rev, "a", "b"), i, 3)
		sort.Strings(x)
		sort.Strings(y)
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("shard %d/3 depends on order: %v vs %v", i, x, y)
		}
	}
	for _, bad := range [][2]int{{0, 3}, {4, 3}, {1, 0}} {
		if Shard(ids, bad[0], bad[1]) != nil {
			t.Fatalf("Shard(%d, %d) not nil", bad[0], bad[1])
		}
	}
}

func TestParseShard(t *testing.T) {
	if i, n, err := ParseShard(" 2/5 "); err != nil || i != 2 || n != 5 {
		t.Fatalf("2/5 → %d %d %v", i, n, err)
	}
	for _, bad := range []string{"", "2", "0/3", "4/3", "a/b", "1/0", "-1/2", "1/99999999999"} {
		if _, _, err := ParseShard(bad); err == nil {
			t.Fatalf("ParseShard(%q) accepted", bad)
		}
	}
}

// shardOf splits a run the way `vmchaos run --shard I/N` does.
func shardOf(r *Results, i, n int) *Results {
	var ids []string
	for _, c := range r.Cases {
		ids = append(ids, c.ID)
	}
	keep := map[string]bool{}
	for _, id := range Shard(ids, i, n) {
		keep[id] = true
	}
	s := *r
	s.Shard = fmt.Sprintf("%d/%d", i, n)
	s.Host = fmt.Sprintf("runner-%d", i)
	s.Build = "abc123"
	s.Cases = nil
	for _, c := range r.Cases {
		if keep[c.ID] {
			s.Cases = append(s.Cases, c)
		}
	}
	return &s
}

func TestMergeOfShardsEqualsUnshardedRun(t *testing.T) {
	full := sampleResults()
	for _, n := range []int{2, 3} {
		var parts []*Results
		for i := n; i >= 1; i-- { // merge order must not matter
			parts = append(parts, shardOf(full, i, n))
		}
		m, err := Merge(parts...)
		if err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(full.Cases)
		sort.SliceStable(want, func(a, b int) bool { return caseLess(&want[a], &want[b]) })
		if !reflect.DeepEqual(m.Cases, want) {
			t.Fatalf("n=%d: merged cases differ from the unsharded run", n)
		}
		if m.RunID != full.RunID || m.Backend != full.Backend || m.TimeScale != full.TimeScale || m.Seed != full.Seed ||
			!m.StartedAt.Equal(full.StartedAt) || !m.FinishedAt.Equal(full.FinishedAt) {
			t.Fatalf("n=%d: merged header %+v", n, m)
		}
		if len(m.Shards) != n || len(m.MissingShards) != 0 || !strings.Contains(m.Host, "runner-1") || m.Build != "abc123" {
			t.Fatalf("n=%d: shards %v missing %v host %q", n, m.Shards, m.MissingShards, m.Host)
		}
		if g, w := Gate(m, nil, DefaultGateOptions()), Gate(full, nil, DefaultGateOptions()); g.Code != w.Code {
			t.Fatalf("merged gate %d, unsharded %d", g.Code, w.Code)
		}
	}
}

func TestMergeRecordsMissingShards(t *testing.T) {
	full := sampleResults()
	m, err := Merge(shardOf(full, 1, 3), shardOf(full, 3, 3))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.MissingShards, []string{"2/3"}) {
		t.Fatalf("missing %v", m.MissingShards)
	}
	// Merging the merge with the missing shard completes it.
	m2, err := Merge(m, shardOf(full, 2, 3))
	if err != nil || len(m2.MissingShards) != 0 || len(m2.Cases) != len(full.Cases) {
		t.Fatalf("second merge: %v, missing %v, %d cases", err, m2.MissingShards, len(m2.Cases))
	}
}

func TestMergeRefusesMixedConfigurationsAndOverlap(t *testing.T) {
	full := sampleResults()
	for _, tc := range []struct {
		name   string
		mutate func(*Results)
		want   string
	}{
		{"backend", func(r *Results) { r.Backend = "real" }, `backend differs`},
		{"time scale", func(r *Results) { r.TimeScale = 1 }, `time scale differs`},
		{"seed", func(r *Results) { r.Seed = 7 }, `seed differs`},
		{"regress", func(r *Results) { r.Regress = []string{"failed-sticky"} }, `regress switches differs`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := shardOf(full, 2, 2)
			tc.mutate(b)
			_, err := Merge(shardOf(full, 1, 2), b)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Merge error %v, want %q", err, tc.want)
			}
		})
	}
	a := shardOf(full, 1, 2)
	if _, err := Merge(a, a); err == nil || !strings.Contains(err.Error(), "overlap") && !strings.Contains(err.Error(), "twice") {
		t.Fatalf("overlapping shards merged: %v", err)
	}
	if _, err := Merge(); err == nil {
		t.Fatal("empty merge accepted")
	}
}

func TestRebaseLogsKeepsLinksReachable(t *testing.T) {
	r := &Results{Cases: []Case{{ID: "a", Verdict: Pass, Logs: map[string]string{"agent": "cases/a/agent.log", "abs": "/var/log/x"}}}}
	if err := RebaseLogs(r, "/ci/shard-1", "/ci/merged"); err != nil {
		t.Fatal(err)
	}
	if got := r.Cases[0].Logs["agent"]; got != "../shard-1/cases/a/agent.log" {
		t.Fatalf("rebased to %q", got)
	}
	if r.Cases[0].Logs["abs"] != "/var/log/x" {
		t.Fatal("absolute path changed")
	}
}
