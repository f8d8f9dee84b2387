// Package suite is the catalogue as a Ginkgo suite: one DescribeTable whose
// entries are built at tree construction from scenarios.Catalogue, with the
// case's labels on every entry. `go test ./scenarios/suite` and `vmchaos run`
// (which runs Ginkgo programmatically, see Run) use this same tree.
package suite

import (
	"fmt"
	"strings"

	g "github.com/onsi/ginkgo/v2"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
)

// Register builds the spec tree for cases; r returns the runner (created in
// BeforeSuite or before RunSpecs).
func Register(cases []scenarios.Case, r func() *runner.Runner) bool {
	entries := make([]any, 0, len(cases)+1)
	entries = append(entries, runCase(r))
	for _, c := range cases {
		entries = append(entries, g.Entry(c.ID, c, g.Label(c.Labels...)))
	}
	return g.Describe("vmchaos catalogue", func() {
		g.DescribeTable("case", entries...)
	})
}

// runCase is the table's body: run the case, turn its verdict into Ginkgo's.
func runCase(r func() *runner.Runner) func(g.SpecContext, scenarios.Case) {
	return func(ctx g.SpecContext, c scenarios.Case) {
		rc := r().RunCase(ctx, c)
		g.AddReportEntry("verdict", rc.Verdict, g.ReportEntryVisibilityFailureOrVerbose)
		g.AddReportEntry("repro", rc.Repro, g.ReportEntryVisibilityFailureOrVerbose)
		if len(rc.Runs) > 1 {
			g.AddReportEntry("runs", reports.RunTally(rc.Runs), g.ReportEntryVisibilityFailureOrVerbose)
		}
		switch rc.Verdict {
		case reports.Pass:
		case reports.Inconclusive:
			// not a pass: Ginkgo reports it skipped, the gate exits 2
			g.Skip(skipMessage(rc))
		default:
			var ev []string
			for _, inv := range rc.Invariants {
				if !inv.OK {
					ev = append(ev, fmt.Sprintf("  %s: %s", inv.Name, inv.Evidence))
				}
			}
			g.Fail(fmt.Sprintf("%s: %s\n%s\nrepro: %s", rc.Verdict, rc.Reason, strings.Join(ev, "\n"), rc.Repro))
		}
	}
}

// skipMessage is what Ginkgo shows for an inconclusive case: "not run:" when
// the host lacks what it needs (culprit precondition, listed in results.json
// not_run), so a skipped spec says by name why it never ran.
func skipMessage(rc reports.Case) string {
	if rc.Culprit == "precondition" {
		return "not run: " + rc.Reason
	}
	return "inconclusive: " + rc.Reason
}
