package runner

import (
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// CoverageSpec is the coverage denominator (scenarios.CoverageCells: every
// operation × failpoint × fault kind that applies there), each cell marked
// with why this host cannot run it (notRunnable by operation and kind; "" =
// it can).
func CoverageSpec(notRunnable func(op, kind string) string) *reports.Coverage {
	spec := &reports.Coverage{Version: reports.CoverageVersion, Kinds: scenarios.CoverageKindNames(),
		FallbackOps: scenarios.CoverageFallbackOps(), VictimProcs: scenarios.CoverageVictimProc()}
	seen := map[string]bool{}
	for _, c := range scenarios.CoverageCells() {
		if !seen[c.Op] {
			seen[c.Op] = true
			spec.Ops = append(spec.Ops, c.Op)
		}
		spec.Cells = append(spec.Cells, reports.CoverageCell{Op: c.Op, Point: c.Point, Proc: c.Proc, Kind: c.Kind,
			NotRunnable: notRunnable(c.Op, c.Kind)})
	}
	for _, f := range scenarios.MatrixFolds() {
		spec.Folded = append(spec.Folded, reports.CoverageFold{Case: f.Case, Into: f.Into, Key: f.Key})
	}
	return spec
}

// MatrixCoverage is the phase-coverage map of these cases over the
// denominator, with this host's unrunnable cells marked.
func MatrixCoverage(cases []reports.Case, notRunnable func(op, kind string) string) *reports.Coverage {
	return reports.ComputeCoverage(CoverageSpec(notRunnable), cases)
}

// notRunnable is why this runner's host cannot run a cell: a snapshot the
// host's KVM cannot take for the snapshot operations, the whole backend's
// preflight (no KVM, no cloud-hypervisor) for every kind, no FUSE (lazyfs)
// for the power cut. "" = it can.
func (r *Runner) notRunnable(op, kind string) string {
	if scenarios.OpNeedsSnapshot(op) && r.snapSkip != "" {
		return r.withSnapSkip()
	}
	if r.skip != "" {
		return r.skip
	}
	if kind == scenarios.FaultPowerCut {
		if why := fuseAvailable(); why != "" {
			return "power cut needs lazy filesystems: " + why
		}
	}
	return ""
}

// caseSkip is why a case is not run here ("" = it runs): a case that needs
// a snapshot gets the snapshot reason first when the host cannot take one.
func (r *Runner) caseSkip(s *scenarios.Scenario) string {
	if r.snapSkip != "" && scenarios.NeedsSnapshot(s) {
		return r.withSnapSkip()
	}
	return r.skip
}

// withSnapSkip is the snapshot reason, followed by the backend's own when
// there is one too, so neither is dropped.
func (r *Runner) withSnapSkip() string {
	if r.skip == "" {
		return "real backend: " + r.snapSkip
	}
	return "real backend: " + r.snapSkip + "; also " + r.skip
}
