package main

import (
	"fmt"
	"io"

	"github.com/vmchaos/vmchaos/reports"
)

// printCoverage prints the phase-coverage map stored in a results.json
// (the same map as report.md's "Phase coverage", with the crediting case
// of every covered cell).
func printCoverage(w io.Writer, path string) error {
	res, err := reports.Load(path)
	if err != nil {
		return fmt.Errorf("points --coverage: %w", err)
	}
	cov, err := res.CoverageMap()
	if err != nil {
		return fmt.Errorf("points --coverage: %s: %w", path, err)
	}
	return reports.WriteCoverageTable(w, cov)
}
