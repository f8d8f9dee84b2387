package reports

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func covCase(id, phase, kind string, landed ...bool) Case {
	c := Case{ID: id, LandedPhase: phase, CoverageKind: kind, Verdict: Pass}
	for _, l := range landed {
		c.Injections = append(c.Injections, Injection{Landed: l, LastPhase: phase})
	}
	return c
}

var covPairs = []CoveragePair{
	{Point: "vm.clone.reserved", Proc: "vmctl", Kind: "stop"},
	{Point: "vm.clone.reserved", Proc: "vmctl", Kind: "sigkill-child"},
	{Point: "agent.create.begin", Proc: "nodeagent", Kind: "stop"},
	{Point: "agent.create.begin", Proc: "nodeagent", Kind: "vmm-kill-while-dead"},
}

// Only cases whose every injection landed cover their (phase, kind).
func TestCoverageCountsOnlyLandedFaults(t *testing.T) {
	cases := []Case{
		covCase("a", "vm.clone.reserved", "stop", true),
		covCase("b", "vm.clone.reserved", "sigkill-child", false),              // missed its phase
		covCase("c", "agent.create.begin", "vmm-kill-while-dead", true, false), // second fault missed
		covCase("d", "agent.create.begin", "", true),                           // no matrix kind
		covCase("e", "agent.create.begin", "stop"),                             // no injection at all
	}
	cases[0].Verdict = Fail // a failing case still landed
	cov := ComputeCoverage(covPairs, []string{"stop", "sigkill-child", "vmm-kill-while-dead"}, nil, cases)
	if cov.Applicable != 4 || cov.Covered != 1 || cov.Percent != 25 {
		t.Fatalf("coverage %+v, want 1 of 4", cov)
	}
	if got := cov.Pairs[0].CoveredBy; len(got) != 1 || got[0] != "a" {
		t.Errorf("covered by %v", got)
	}
	if len(cov.Missing()) != 3 {
		t.Errorf("missing %v", cov.Missing())
	}
}

// A merge of shards recomputes the map over every shard's cases.
func TestMergeRecomputesCoverage(t *testing.T) {
	kinds := []string{"stop", "sigkill-child", "vmm-kill-while-dead"}
	s1 := &Results{Shard: "1/2", Cases: []Case{covCase("a", "vm.clone.reserved", "stop", true)}}
	s2 := &Results{Shard: "2/2", Cases: []Case{covCase("b", "agent.create.begin", "stop", true)}}
	s1.Coverage = ComputeCoverage(covPairs, kinds, nil, s1.Cases)
	s2.Coverage = ComputeCoverage(covPairs, kinds, nil, s2.Cases)
	m, err := Merge(s1, s2)
	if err != nil {
		t.Fatal(err)
	}
	if m.Coverage == nil || m.Coverage.Covered != 2 || s1.Coverage.Covered != 1 {
		t.Fatalf("merged coverage %+v", m.Coverage)
	}
}

func TestCoverageRendersInEveryReport(t *testing.T) {
	r := &Results{RunID: "cov", Cases: []Case{covCase("a", "vm.clone.reserved", "stop", true)}}
	r.Coverage = ComputeCoverage(covPairs, []string{"stop", "sigkill-child", "vmm-kill-while-dead"},
		[]CoverageFold{{Case: "mx-x", Into: "park-x", Key: "vm.clone.reserved × stop → ready"}}, r.Cases)
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
		for _, want := range []string{"25.0%", "vm.clone.reserved", "agent.create.begin", covLanded, covMissing, covNA} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: no %q", name, want)
			}
		}
	}
	if !strings.Contains(string(md), "`mx-x` → `park-x`") || !strings.Contains(string(html), "park-x") {
		t.Error("folds not reported")
	}
	if s := MarkdownSummary(r, Gate(r, nil, DefaultGateOptions()), 5); !strings.Contains(s, "phase coverage 25.0%") {
		t.Errorf("gate step summary: %s", s)
	}
	var sum bytes.Buffer
	Summary(&sum, r)
	if !strings.Contains(sum.String(), "phase coverage 25.0% (1 of 4") {
		t.Errorf("summary: %s", sum.String())
	}
	b, _ := json.Marshal(r)
	var back Results
	if err := json.Unmarshal(b, &back); err != nil || back.Coverage == nil || back.Coverage.Percent != 25 || back.Cases[0].CoverageKind != "stop" {
		t.Errorf("results.json round trip: %v %+v", err, back.Coverage)
	}
}
