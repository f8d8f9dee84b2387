package runner

import (
	"strings"

	"github.com/vmchaos/vmchaos/failpoint"
	"testing"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// Cells the host cannot run stay in the denominator, marked with the
// preflight's reason: a run without FUSE, and a real-backend run without
// KVM (the runner's skip), against a host that can run everything.
func TestUnrunnableCellsStayInTheDenominator(t *testing.T) {
	all := len(scenarios.CoverageCells())
	saved := fuseAvailable
	defer func() { fuseAvailable = saved }()
	fuseAvailable = func() string { return "no /dev/fuse" }
	for _, tc := range []struct {
		name    string
		r       *Runner
		wantAll bool // every cell not runnable, else the power cut's only
		reason  string
	}{
		{"no FUSE", &Runner{}, false, "power cut needs lazy filesystems: no /dev/fuse"},
		{"no KVM", &Runner{skip: "real backend unavailable: no /dev/kvm"}, true, "real backend unavailable: no /dev/kvm"},
	} {
		cov := MatrixCoverage(nil, tc.r.notRunnable)
		if cov.Applicable != all || cov.Covered != 0 {
			t.Fatalf("%s: %d of %d cells, want all %d in the denominator", tc.name, cov.Covered, cov.Applicable, all)
		}
		want := 0
		for _, c := range cov.Cells {
			marked := c.NotRunnable == tc.reason
			if tc.wantAll || c.Kind == scenarios.FaultPowerCut {
				want++
				if !marked {
					t.Errorf("%s: %s %s × %s not marked %q (got %q)", tc.name, c.Op, c.Point, c.Kind, tc.reason, c.NotRunnable)
				}
			} else if c.NotRunnable != "" {
				t.Errorf("%s: %s × %s marked %q", tc.name, c.Point, c.Kind, c.NotRunnable)
			}
		}
		if cov.NotRunnable != want || want == 0 {
			t.Errorf("%s: %d not runnable, want %d", tc.name, cov.NotRunnable, want)
		}
	}
	fuseAvailable = func() string { return "" }
	if cov := MatrixCoverage(nil, (&Runner{}).notRunnable); cov.NotRunnable != 0 {
		t.Errorf("a capable host has %d not-runnable cells", cov.NotRunnable)
	}
}

// The runner's map credits a case by the runner's own records: a park in a
// catalogue-shaped case credits its (operation, point, kind).
func TestMatrixCoverageCreditsAPark(t *testing.T) {
	c := reports.Case{ID: "p", Operation: scenarios.OpCreate, CoverageKind: "sigkill-main",
		Injections: []reports.Injection{{Trigger: "park vm.clone.reserved@vm=a", ActualNs: 1, LastPhase: "vm.clone.reserved", Landed: true}}}
	cov := MatrixCoverage([]reports.Case{c}, func(string, string) string { return "" })
	if cov.Covered != 1 {
		t.Fatalf("covered %d, want 1", cov.Covered)
	}
	for _, cell := range cov.Cells {
		if len(cell.CoveredBy) > 0 && (cell.Op != scenarios.OpCreate || cell.Point != "vm.clone.reserved" || cell.Kind != "sigkill-main") {
			t.Errorf("credited %+v", cell)
		}
	}
}

// Every park of the catalogue lands in a cell of the denominator (its
// operation's, or a fallback's): the map holds what the catalogue parks.
// It also logs the dry figure: the coverage the catalogue would reach if
// every park, failpoint action and same-process timed fault landed where
// intended (issue #31's honest figure, before a run).
func TestCatalogueParksLandInTheMap(t *testing.T) {
	victims := scenarios.CoverageVictimProc()
	var cases []reports.Case
	for i := range scenarios.Catalogue {
		s := &scenarios.Catalogue[i]
		kind := scenarios.CoverageKind(s)
		if kind == "" {
			continue
		}
		c := reports.Case{ID: s.ID, Operation: s.Op, CoverageKind: kind}
		c.CoverageAt, _ = scenarios.FailpointAction(s)
		trig := s.Faults[0].Trigger
		at, timed := strings.CutPrefix(trig, "at ")
		if timed {
			at, _, _ = strings.Cut(at, "@")
			fp, _ := failpoint.Lookup(at)
			if victims[kind] != "" && fp.Proc != victims[kind] {
				continue // the victim's phase needs a run
			}
			c.Timeline = []reports.TimelineEvent{{TsNs: 1, Kind: "phase", Proc: fp.Proc, Point: at}}
		} else if !strings.HasPrefix(trig, "park ") {
			continue
		}
		c.Injections = []reports.Injection{{Trigger: trig, ActualNs: 2, LastPhase: at, Landed: true}}
		cases = append(cases, c)
	}
	cov := MatrixCoverage(cases, func(string, string) string { return "" })
	for _, o := range cov.Outside {
		t.Errorf("a catalogue fault lands outside the map: %s", o)
	}
	t.Logf("dry: %d catalogue faults with a static landing: %s", len(cases), cov)
}
