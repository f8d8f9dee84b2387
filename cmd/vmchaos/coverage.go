package main

import (
	"fmt"
	"io"

	"github.com/vmchaos/vmchaos/reports"
)

// printCoverage prints the phase-coverage map stored in a results.json
// (the same table as report.md's "Phase coverage").
func printCoverage(w io.Writer, path string) error {
	res, err := reports.Load(path)
	if err != nil {
		return fmt.Errorf("points --coverage: %w", err)
	}
	if res.Coverage == nil {
		return fmt.Errorf("points --coverage: %s has no coverage map (a run written before the fault matrix, or not an agent-layer run)", path)
	}
	return reports.WriteCoverageTable(w, res.Coverage)
}
