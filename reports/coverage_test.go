package reports

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

var covVictims = map[string]string{"sigkill-main": "nodeagent", "sigkill-child": "vmctl", "sigkill-vmm": "fakech", "stop": "nodeagent", "power-cut": "",
	"sigkill-direct": "vmctl", "sigkill-daemon": "vmctl"}

// covSpec is a small denominator: two operations, a failpoint action, a
// power cut not runnable on this host.
func covSpec() *Coverage {
	return &Coverage{Version: CoverageVersion, Kinds: []string{"sigkill-main", "sigkill-child", "power-cut", "failpoint-error"},
		Ops: []string{"create", "save"}, FallbackOps: map[string][]string{"hibernate": {"save"}}, VictimProcs: covVictims,
		Cells: []CoverageCell{
			{Op: "create", Point: "agent.create.begin", Proc: "nodeagent", Kind: "sigkill-main"},
			{Op: "create", Point: "vm.clone.reserved", Proc: "vmctl", Kind: "sigkill-main"},
			{Op: "create", Point: "vm.clone.reserved", Proc: "vmctl", Kind: "sigkill-child"},
			{Op: "create", Point: "vm.clone.reserved", Proc: "vmctl", Kind: "power-cut", NotRunnable: "no FUSE"},
			{Op: "create", Point: "agent.create.begin", Proc: "nodeagent", Kind: "failpoint-error"},
			{Op: "save", Point: "snapshot.save.paused", Proc: "vmctl", Kind: "sigkill-main"},
		}}
}

// timeline: the agent reaches agent.create.begin (pid 10) at 100, its
// child vmctl (pid 20) reaches vm.clone.reserved at 200 and
// agent.child.exec (bookkeeping) at 250.
var covTimeline = []TimelineEvent{
	{TsNs: 100, Kind: "phase", Proc: "nodeagent", Pid: 10, Point: "agent.create.begin"},
	{TsNs: 150, Kind: "phase", Proc: "nodeagent", Pid: 10, Point: "agent.child.exec"},
	{TsNs: 200, Kind: "phase", Proc: "vmctl", Pid: 20, Point: "vm.clone.reserved"},
	{TsNs: 400, Kind: "phase", Proc: "vmctl", Pid: 20, Point: "vm.clone.files-copied"},
}

func timedCase(id, op, kind string, victim int, atNs int64, landed bool) Case {
	return Case{ID: id, Operation: op, CoverageKind: kind, Timeline: covTimeline, Verdict: Pass,
		Injections: []Injection{{Fault: kind, Trigger: "at vm.clone.reserved + 1ms", ActualNs: atNs, VictimPID: victim,
			LastPhase: "vm.clone.reserved", Landed: landed}}}
}

func parkCase(id, op, kind, point string, landed bool) Case {
	return Case{ID: id, Operation: op, CoverageKind: kind, Verdict: Fail,
		Injections: []Injection{{Fault: kind, Trigger: "park " + point + "@vm=a", ActualNs: 5, LastPhase: point, Landed: landed}}}
}

// sandboxCase: host pid 9999 is on no timeline event (a pid namespace);
// the harness-run vmctl (emitted pid 3) hit vm.clone.reserved, then the
// daemon (emitted pid 4) made a pass before the fault.
func sandboxCase(kind string) Case {
	tl := []TimelineEvent{
		{TsNs: 100, Kind: "phase", Proc: "vmctl", Pid: 3, Point: "vm.clone.reserved"},
		{TsNs: 120, Kind: "phase", Proc: "vmctl", Pid: 4, Point: "daemon.pass"},
		{TsNs: 130, Kind: "phase", Proc: "vmctl", Pid: 5, Point: "vm.rm.tombstoned"}, // another vmctl
	}
	trig := "at vm.clone.reserved + 59ms"
	if kind == "sigkill-daemon" {
		trig = "now + 0s"
	}
	return Case{ID: "s", Operation: "clone", CoverageKind: kind, Timeline: tl,
		Injections: []Injection{{Trigger: trig, ActualNs: 150, VictimPID: 9999, Landed: true}}}
}

// The crediting rule: a timed fault credits its victim's last phase, never
// the stack's (another process's); a park credits its point; a fault that
// did not land credits nothing.
func TestCoverageCreditingRule(t *testing.T) {
	for _, tc := range []struct {
		name  string
		c     Case
		point string // "" = credits nothing
	}{
		{"timed sigkill-main: the agent's last phase, not vmctl's (the stack's)", timedCase("t1", "create", "sigkill-main", 10, 300, true), "agent.create.begin"},
		{"timed sigkill-main, no pid in the timeline: by the victim's process", timedCase("t2", "create", "sigkill-main", 0, 300, true), "agent.create.begin"},
		{"timed sigkill-child: the child's last phase", timedCase("t3", "create", "sigkill-child", 20, 300, true), "vm.clone.reserved"},
		{"timed: phases after the fault do not count", timedCase("t4", "create", "sigkill-child", 20, 190, true), ""},
		{"timed, not landed", timedCase("t5", "create", "sigkill-main", 10, 300, false), ""},
		{"park credits its point", parkCase("p1", "save", "sigkill-main", "snapshot.save.paused", true), "snapshot.save.paused"},
		{"park, not landed", parkCase("p2", "save", "sigkill-main", "snapshot.save.paused", false), ""},
		{"no coverage kind", parkCase("p3", "save", "", "snapshot.save.paused", true), ""},
		{"power cut: the stack's last phase", timedCase("c1", "create", "power-cut", 0, 300, true), "vm.clone.reserved"},
		{"failpoint action: its own point", Case{ID: "f1", Operation: "create", CoverageKind: "failpoint-error", CoverageAt: "agent.create.begin",
			Injections: []Injection{{Trigger: "at agent.failed + 0s", ActualNs: 9, LastPhase: "agent.failed", Landed: true}}}, "agent.create.begin"},
		{"no injection", Case{ID: "n1", Operation: "create", CoverageKind: "sigkill-main"}, ""},
		{"pid namespace: the trigger's hitter, not another vmctl's later phase", sandboxCase("sigkill-direct"), "vm.clone.reserved"},
		{"the daemon's kind: its pass", sandboxCase("sigkill-daemon"), "daemon.pass"},
	} {
		got, ok := CreditedPoint(tc.c, covVictims)
		if ok != (tc.point != "") || got != tc.point {
			t.Errorf("%s: credited %q (%v), want %q", tc.name, got, ok, tc.point)
		}
	}
}

// The map credits (op, point, kind) from the crediting rule, falls back to
// FallbackOps, keeps not-runnable cells in the denominator, and lists
// landings outside it.
func TestCoverageMapCountsCellsAndKeepsUnrunnable(t *testing.T) {
	cases := []Case{
		timedCase("t1", "create", "sigkill-main", 10, 300, true),                  // (create, agent.create.begin, sigkill-main)
		parkCase("p1", "hibernate", "sigkill-main", "snapshot.save.paused", true), // falls back to save
		timedCase("t5", "create", "sigkill-child", 20, 300, false),                // not landed
		parkCase("o1", "create", "sigkill-main", "ch.boot", true),                 // no such cell
	}
	cov := ComputeCoverage(covSpec(), cases)
	if cov.Applicable != 6 || cov.Covered != 2 || cov.NotRunnable != 1 {
		t.Fatalf("applicable %d covered %d not runnable %d, want 6, 2, 1", cov.Applicable, cov.Covered, cov.NotRunnable)
	}
	if want := 100 * 2.0 / 6; cov.Percent != want {
		t.Errorf("percent %v, want %v (not-runnable cells stay in the denominator)", cov.Percent, want)
	}
	if c := cov.Cells[1]; len(c.CoveredBy) != 0 {
		t.Errorf("vm.clone.reserved × sigkill-main credited by %v: that is the child's phase, not the agent's", c.CoveredBy)
	}
	if c := cov.Cells[5]; len(c.CoveredBy) != 1 || c.CoveredBy[0] != "p1" {
		t.Errorf("save cell covered by %v, want p1 (hibernate falls back to save)", c.CoveredBy)
	}
	if len(cov.Outside) != 1 || !strings.HasPrefix(cov.Outside[0], "o1:") {
		t.Errorf("outside %v", cov.Outside)
	}
	if nr := cov.NotRunnableReasons(); nr["no FUSE"] != 1 {
		t.Errorf("not-runnable reasons %v", nr)
	}
	byKind, byOp := cov.MissingBy()
	if byKind["power-cut"] != 1 || byKind["sigkill-child"] != 1 || byOp["create"] != 4 {
		t.Errorf("missing by kind %v by op %v", byKind, byOp)
	}
}

// A merge of shards recomputes the map over every shard's cases.
func TestMergeRecomputesCoverage(t *testing.T) {
	s1 := &Results{Shard: "1/2", Cases: []Case{timedCase("a", "create", "sigkill-main", 10, 300, true)}}
	s2 := &Results{Shard: "2/2", Cases: []Case{parkCase("b", "save", "sigkill-main", "snapshot.save.paused", true)}}
	s1.Coverage = ComputeCoverage(covSpec(), s1.Cases)
	s2.Coverage = ComputeCoverage(covSpec(), s2.Cases)
	m, err := Merge(s1, s2)
	if err != nil {
		t.Fatal(err)
	}
	if m.Coverage == nil || m.Coverage.Covered != 2 || s1.Coverage.Covered != 1 {
		t.Fatalf("merged coverage %+v", m.Coverage)
	}
}

// --min-coverage fails the gate (exit 1, naming the figure) below the
// bound and without a current map; at or above it the gate passes.
func TestGateMinCoverage(t *testing.T) {
	r := &Results{RunID: "cov", Cases: []Case{timedCase("t1", "create", "sigkill-main", 10, 300, true)}}
	r.Coverage = ComputeCoverage(covSpec(), r.Cases) // 1 of 6: 16.7 %
	for _, tc := range []struct {
		min  float64
		code int
		want string
	}{
		{0, GatePass, ""},
		{16, GatePass, ""},
		{50, GateFail, "phase coverage 16.7% (1 of 6"},
	} {
		opt := DefaultGateOptions()
		opt.MinCoverage = tc.min
		g := Gate(r, nil, opt)
		if g.Code != tc.code || !strings.Contains(g.String(), tc.want) {
			t.Errorf("min %v: code %d, want %d; lines:\n%s", tc.min, g.Code, tc.code, g)
		}
	}
	opt := DefaultGateOptions()
	opt.MinCoverage = 1
	for name, res := range map[string]*Results{
		"no map":        {RunID: "none", Cases: r.Cases},
		"version-1 map": {RunID: "v1", Cases: r.Cases, LegacyCoverage: json.RawMessage(`{"applicable":378,"covered":378,"percent":100}`)},
	} {
		if g := Gate(res, nil, opt); g.Code != GateFail || !strings.Contains(g.String(), "COVERAGE below --min-coverage") {
			t.Errorf("%s: gate %d:\n%s", name, g.Code, g)
		}
	}
}

// A version-1 map is refused by name, and a map of another version fails
// to load: neither is shown as this map's figure.
func TestCoverageVersionIsChecked(t *testing.T) {
	v1 := []byte(`{"run_id":"old","cases":[],"coverage":{"applicable":378,"covered":378,"percent":100,"pairs":[]}}`)
	r, err := Parse(v1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.CoverageMap(); err == nil || !strings.Contains(err.Error(), "version 1") {
		t.Errorf("version-1 map: %v", err)
	}
	if _, err := Parse([]byte(`{"run_id":"x","cases":[],"phase_coverage":{"version":3}}`)); err == nil {
		t.Error("a version-3 map loaded")
	}
}

func TestCoverageRendersInEveryReport(t *testing.T) {
	r := &Results{RunID: "cov", Cases: []Case{timedCase("t1", "create", "sigkill-main", 10, 300, true)}}
	spec := covSpec()
	spec.Folded = []CoverageFold{{Case: "mx-x", Into: "park-x", Key: "vm.clone.reserved × stop → ready"}}
	r.Coverage = ComputeCoverage(spec, r.Cases)
	md, err := Markdown(r)
	if err != nil {
		t.Fatal(err)
	}
	html, err := HTML(r)
	if err != nil {
		t.Fatal(err)
	}
	var txt bytes.Buffer
	if err := WriteCoverageTable(&txt, r.Coverage); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{"md": string(md), "html": string(html), "text": txt.String()} {
		for _, want := range []string{"16.7%", "vm.clone.reserved", "agent.create.begin", "snapshot.save.paused",
			covLanded, covMissing, covNotRunnable, covNA, "not runnable here (1 cells): no FUSE", "by kind: sigkill-main 2"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: no %q", name, want)
			}
		}
	}
	for name, out := range map[string]string{"html": string(html), "text": txt.String()} {
		if !strings.Contains(out, "t1") {
			t.Errorf("%s: the crediting case is not shown", name)
		}
	}
	if !strings.Contains(string(md), "`mx-x` → `park-x`") || !strings.Contains(string(html), "park-x") {
		t.Error("folds not reported")
	}
	if s := MarkdownSummary(r, Gate(r, nil, DefaultGateOptions()), 5); !strings.Contains(s, "phase coverage 16.7%") {
		t.Errorf("gate step summary: %s", s)
	}
	var sum bytes.Buffer
	Summary(&sum, r)
	if !strings.Contains(sum.String(), "phase coverage 16.7% (1 of 6") {
		t.Errorf("summary: %s", sum.String())
	}
	b, _ := json.Marshal(r)
	var back Results
	if err := json.Unmarshal(b, &back); err != nil || back.Coverage == nil || back.Coverage.Version != CoverageVersion ||
		back.Coverage.Cells[3].NotRunnable != "no FUSE" || back.Cases[0].CoverageKind != "sigkill-main" || back.Cases[0].Timeline[0].Pid != 10 {
		t.Errorf("results.json round trip: %v %+v", err, back.Coverage)
	}
	if !bytes.Contains(b, []byte(`"phase_coverage"`)) || bytes.Contains(b, []byte(`"coverage":`)) {
		t.Errorf("results.json keys: %s", b)
	}
}

// Two runs of one build (a nightly-only selection and the make chaos run
// it complements) credit one map together; runs whose denominators differ
// are refused, not mixed.
func TestUnionCoverage(t *testing.T) {
	a := &Results{RunID: "chaos", Cases: []Case{timedCase("a", "create", "sigkill-main", 10, 300, true)}}
	b := &Results{RunID: "nightly", Cases: []Case{parkCase("b", "save", "sigkill-main", "snapshot.save.paused", true)}}
	a.Coverage = ComputeCoverage(covSpec(), a.Cases)
	b.Coverage = ComputeCoverage(covSpec(), b.Cases)
	u, err := UnionCoverage([]*Results{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if u.Covered != 2 || u.Applicable != a.Coverage.Applicable || a.Coverage.Covered != 1 {
		t.Fatalf("union covered %d of %d, want 2 of %d", u.Covered, u.Applicable, a.Coverage.Applicable)
	}
	other := covSpec()
	other.Cells = other.Cells[1:]
	c := &Results{RunID: "older", Coverage: ComputeCoverage(other, nil)}
	if _, err := UnionCoverage([]*Results{a, c}); err == nil || !strings.Contains(err.Error(), "denominator differs") {
		t.Errorf("different denominators: %v", err)
	}
	if _, err := UnionCoverage([]*Results{a, {RunID: "nomap"}}); err == nil {
		t.Error("a run without a map was taken")
	}
}
