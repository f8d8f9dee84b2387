package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onsi/ginkgo/v2/reporters"
	"github.com/onsi/ginkgo/v2/types"

	"github.com/vmchaos/vmchaos/reports"
)

// writeRun writes a run dir whose cases have the given verdicts.
func writeRun(t *testing.T, dir, shard string, verdicts map[string]string, convergeMs float64) string {
	t.Helper()
	r := &reports.Results{RunID: "run-1", Backend: "fake", Supervisor: "builtin", TimeScale: 0.05, Seed: 1, Shard: shard}
	for id, v := range verdicts {
		r.Cases = append(r.Cases, reports.Case{ID: id, Scenario: strings.Split(id, "@")[0], Verdict: v, Attempts: 1,
			ConvergeMs: convergeMs, Repro: "vmchaos repro --scenario " + id,
			Logs:       map[string]string{"agent": "cases/" + id + "/agent.log"},
			Invariants: []reports.Invariant{{Name: "intent-goal", OK: v != reports.Fail, Evidence: "stuck"}}})
	}
	if err := reports.WriteAll(dir, r); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runReport runs `vmchaos report ARGS...` and returns its output and the
// exit status main would use.
func runReport(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := newReportCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	code := 0
	if err != nil {
		code = exitCode(err)
		fmt.Fprintln(&out, "Error:", err)
	}
	return out.String(), code
}

func TestReportGateExitCodes(t *testing.T) {
	tmp := t.TempDir()
	pass := writeRun(t, filepath.Join(tmp, "pass"), "", map[string]string{"a@0": reports.Pass, "b@0": reports.Pass}, 100)
	fail := writeRun(t, filepath.Join(tmp, "fail"), "", map[string]string{"a@0": reports.Pass, "b@0": reports.Fail}, 100)
	inc := writeRun(t, filepath.Join(tmp, "inc"), "", map[string]string{"a@0": reports.Inconclusive}, 100)
	errRun := writeRun(t, filepath.Join(tmp, "err"), "", map[string]string{"a@0": reports.Error}, 100)
	slow := writeRun(t, filepath.Join(tmp, "slow"), "", map[string]string{"a@0": reports.Pass, "b@0": reports.Pass}, 200)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"gate", pass}, 0, "gate: pass (exit 0)"},
		{[]string{"gate", filepath.Join(fail, "results.json")}, 1, "FAIL b@0: invariant(s) intent-goal (stuck); repro: vmchaos repro --scenario b@0"},
		{[]string{"gate", inc}, 2, "INCONCLUSIVE a@0"},
		{[]string{"gate", errRun}, 3, "ERROR a@0"},
		{[]string{"gate", filepath.Join(tmp, "missing")}, 3, "load results"},
		{[]string{"gate", "--baseline", pass, fail}, 1, "REGRESSION b@0 passed in baseline run-1"},
		{[]string{"gate", "--baseline", pass, slow}, 1, "REGRESSION convergence p95 200 ms > baseline 100 ms + 20%"},
		{[]string{"gate", "--baseline", pass, "--p95-tolerance", "150%", slow}, 0, "ok"},
		{[]string{"gate", "--baseline", pass, "--p95-tolerance", "off", slow}, 0, "gate: pass"},
		{[]string{"gate", "--baseline", pass, "--p95-slack", "100ms", slow}, 0, "gate: pass"},
		{[]string{"gate", "--baseline", filepath.Join(tmp, "nope"), pass}, 3, "baseline"},
		{[]string{"gate", "--p95-tolerance", "lots", pass}, 1, "--p95-tolerance"},
	} {
		out, code := runReport(t, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("report %v: exit %d (want %d), output lacks %q:\n%s", tc.args, code, tc.code, tc.want, out)
		}
	}
}

func TestReportMergeThenGateAndRender(t *testing.T) {
	tmp := t.TempDir()
	s1 := writeRun(t, filepath.Join(tmp, "s1"), "1/2", map[string]string{"a@0": reports.Pass}, 100)
	s2 := writeRun(t, filepath.Join(tmp, "s2"), "2/2", map[string]string{"b@0": reports.Fail}, 100)
	out := filepath.Join(tmp, "merged")
	txt, code := runReport(t, "merge", "-o", out, s1, s2)
	if code != 0 || !strings.Contains(txt, "merged 2 result set(s)") {
		t.Fatalf("merge exit %d:\n%s", code, txt)
	}
	m, err := reports.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Cases) != 2 || strings.Join(m.Shards, ",") != "1/2,2/2" {
		t.Fatalf("merged %d cases, shards %v", len(m.Cases), m.Shards)
	}
	// Log links now lead from the merged dir into the shard's dir.
	if got := m.Cases[0].Logs["agent"]; got != "../s1/cases/a@0/agent.log" {
		t.Fatalf("log link %q", got)
	}
	if _, code := runReport(t, "gate", out); code != 1 {
		t.Fatalf("gate of merged run: exit %d, want 1", code)
	}
	// Only one of two shards: inconclusive.
	half := filepath.Join(tmp, "half")
	if _, code := runReport(t, "merge", "-o", half, s1); code != 0 {
		t.Fatal("merge of one shard failed")
	}
	if txt, code := runReport(t, "gate", half); code != 2 || !strings.Contains(txt, "lack shard(s) 2/2") {
		t.Fatalf("gate of half merge: exit %d:\n%s", code, txt)
	}
	// Overlapping shards are refused.
	if txt, code := runReport(t, "merge", "-o", filepath.Join(tmp, "dup"), s1, s1); code == 0 {
		t.Fatalf("overlapping merge accepted:\n%s", txt)
	}
	// The merge never overwrites a shard.
	if txt, code := runReport(t, "merge", "-o", s1, s1, s2); code != 3 || !strings.Contains(txt, "is one of the shards") {
		t.Fatalf("merge into a shard dir: exit %d:\n%s", code, txt)
	}
	// render rebuilds a deleted report without touching results.json.
	before, _ := os.ReadFile(filepath.Join(out, "results.json"))
	if err := os.Remove(filepath.Join(out, "report.html")); err != nil {
		t.Fatal(err)
	}
	if txt, code := runReport(t, "render", out); code != 0 || !strings.Contains(txt, "report.html") {
		t.Fatalf("render exit %d:\n%s", code, txt)
	}
	after, _ := os.ReadFile(filepath.Join(out, "results.json"))
	if _, err := os.Stat(filepath.Join(out, "report.html")); err != nil || !bytes.Equal(before, after) {
		t.Fatalf("render: %v, results.json changed: %v", err, !bytes.Equal(before, after))
	}
	if txt, code := runReport(t, "summary", out); code != 0 || !strings.Contains(txt, "FAIL") {
		t.Fatalf("summary exit %d:\n%s", code, txt)
	}
}

func TestReportGateAppendsStepSummary(t *testing.T) {
	tmp := t.TempDir()
	fail := writeRun(t, filepath.Join(tmp, "fail"), "", map[string]string{"a@0": reports.Pass, "b@0": reports.Fail}, 100)
	summary := filepath.Join(tmp, "summary.md")
	if err := os.WriteFile(summary, []byte("earlier step\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, code := runReport(t, "gate", "--step-summary", summary, fail); code != 1 {
		t.Fatalf("exit %d", code)
	}
	got, _ := os.ReadFile(summary)
	if !strings.HasPrefix(string(got), "earlier step\n### vmchaos: INVARIANT VIOLATED (exit 1)") ||
		!strings.Contains(string(got), "`vmchaos repro --scenario b@0`") {
		t.Fatalf("step summary:\n%s", got)
	}
}

func TestParseTolerance(t *testing.T) {
	for in, want := range map[string]float64{"20%": 0.2, "0.2": 0.2, "0": 0, "off": -1, " 5% ": 0.05, "150%": 1.5, "1": 1} {
		if got, err := parseTolerance(in); err != nil || got != want {
			t.Errorf("parseTolerance(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "-5%", "NaN", "20"} {
		if _, err := parseTolerance(bad); err == nil {
			t.Errorf("parseTolerance(%q) accepted", bad)
		}
	}
}

// TestReportMergeJoinsGinkgoReports: the merged ginkgo.json holds every
// shard's suite report (Ginkgo's own multi-suite shape, readable as
// []types.Report), and a shard without one is named, not silently dropped.
func TestReportMergeJoinsGinkgoReports(t *testing.T) {
	tmp := t.TempDir()
	s1 := writeRun(t, filepath.Join(tmp, "s1"), "1/2", map[string]string{"a@0": reports.Pass}, 100)
	s2 := writeRun(t, filepath.Join(tmp, "s2"), "2/2", map[string]string{"b@0": reports.Pass}, 100)
	for i, dir := range []string{s1, s2} {
		rep := types.Report{SuitePath: dir, SuiteDescription: "vmchaos", SuiteSucceeded: true,
			SpecReports: types.SpecReports{{LeafNodeText: fmt.Sprintf("case %d", i), State: types.SpecStatePassed}}}
		if err := reporters.GenerateJSONReport(rep, filepath.Join(dir, reports.GinkgoFile)); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(tmp, "merged")
	if txt, code := runReport(t, "merge", "-o", out, s1, s2); code != 0 || strings.Contains(txt, "has no ginkgo.json") {
		t.Fatalf("merge exit %d:\n%s", code, txt)
	}
	b, err := os.ReadFile(filepath.Join(out, reports.GinkgoFile))
	if err != nil {
		t.Fatal(err)
	}
	var suites []types.Report
	if err := json.Unmarshal(b, &suites); err != nil {
		t.Fatalf("merged ginkgo.json: %v", err)
	}
	if len(suites) != 2 || suites[0].SuitePath != s1 || suites[1].SpecReports[0].LeafNodeText != "case 1" {
		t.Fatalf("merged ginkgo.json holds %d suites: %+v", len(suites), suites)
	}

	if err := os.Remove(filepath.Join(s2, reports.GinkgoFile)); err != nil {
		t.Fatal(err)
	}
	out2 := filepath.Join(tmp, "merged2")
	if txt, code := runReport(t, "merge", "-o", out2, s1, s2); code != 0 || !strings.Contains(txt, s2+" has no ginkgo.json") {
		t.Fatalf("merge with a shard lacking ginkgo.json: exit %d:\n%s", code, txt)
	}
	if err := os.WriteFile(filepath.Join(s2, reports.GinkgoFile), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if txt, code := runReport(t, "merge", "-o", filepath.Join(tmp, "merged3"), s1, s2); code != 3 || !strings.Contains(txt, "not a Ginkgo JSON report") {
		t.Fatalf("merge with a corrupt ginkgo.json: exit %d:\n%s", code, txt)
	}
}

// `report gate --min-coverage P` exits 1 naming the figure below P, and
// passes at or above it; a run without a map cannot pass it.
func TestReportGateMinCoverage(t *testing.T) {
	tmp := t.TempDir()
	dir := writeRun(t, filepath.Join(tmp, "cov"), "", map[string]string{"a@0": reports.Pass}, 100)
	r, err := reports.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	r.Coverage = reports.ComputeCoverage(&reports.Coverage{Kinds: []string{"stop"}, Ops: []string{"create"},
		Cells: []reports.CoverageCell{{Op: "create", Point: "agent.create.begin", Proc: "nodeagent", Kind: "stop"},
			{Op: "create", Point: "agent.create.cloned", Proc: "nodeagent", Kind: "stop"}}},
		[]reports.Case{{ID: "a@0", Operation: "create", CoverageKind: "stop",
			Injections: []reports.Injection{{Trigger: "park agent.create.begin", ActualNs: 1, Landed: true}}}})
	if err := reports.WriteAll(dir, r); err != nil {
		t.Fatal(err)
	}
	bare := writeRun(t, filepath.Join(tmp, "bare"), "", map[string]string{"a@0": reports.Pass}, 100)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"gate", "--min-coverage", "50%", dir}, 0, "gate: pass"},
		{[]string{"gate", "--min-coverage", "50.1", dir}, 1, "COVERAGE phase coverage 50.0% (1 of 2 applicable operation × point × fault-kind cells landed) is below --min-coverage 50.1%"},
		{[]string{"gate", "--min-coverage", "10", bare}, 1, "COVERAGE below --min-coverage 10.0%: it has no coverage map"},
		{[]string{"gate", "--min-coverage", "0", dir}, 1, "want a percentage in (0, 100]"},
	} {
		out, code := runReport(t, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, want %d with %q; output:\n%s", tc.args, code, tc.code, tc.want, out)
		}
	}
}
