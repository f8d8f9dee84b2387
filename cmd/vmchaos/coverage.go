package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/vmchaos/vmchaos/reports"
)

// printCoverage prints the phase-coverage map stored in a results.json
// (the same map as report.md's "Phase coverage", with the crediting case
// of every covered cell). With several, the map credits every run's cases
// (reports.UnionCoverage): a nightly-only selection with the `make chaos`
// run it complements.
func printCoverage(w io.Writer, paths []string) error {
	var runs []*reports.Results
	for _, path := range paths {
		res, err := reports.Load(path)
		if err != nil {
			return fmt.Errorf("points --coverage: %w", err)
		}
		runs = append(runs, res)
	}
	cov, err := reports.UnionCoverage(runs)
	if err != nil {
		return fmt.Errorf("points --coverage: %s: %w", strings.Join(paths, ", "), err)
	}
	return reports.WriteCoverageTable(w, cov)
}
