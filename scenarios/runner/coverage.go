package runner

import (
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// MatrixCoverage is the phase-coverage map of these cases over the
// generated matrix's applicable pairs (issue #18).
func MatrixCoverage(cases []reports.Case) *reports.Coverage {
	var pairs []reports.CoveragePair
	for _, p := range scenarios.MatrixPairs() {
		pairs = append(pairs, reports.CoveragePair{Point: p.Point, Proc: p.Proc, Kind: p.Kind})
	}
	var kinds []string
	for _, k := range scenarios.MatrixKinds {
		kinds = append(kinds, k.Name)
	}
	var folds []reports.CoverageFold
	for _, f := range scenarios.MatrixFolds() {
		folds = append(folds, reports.CoverageFold{Case: f.Case, Into: f.Into, Key: f.Key})
	}
	return reports.ComputeCoverage(pairs, kinds, folds, cases)
}
