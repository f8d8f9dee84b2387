package managerlayer

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	g "github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"

	"github.com/vmchaos/vmchaos/reports"
)

// failT is the GinkgoTestingT of a programmatic run: Ginkgo only needs Fail.
type failT struct{ failed bool }

func (t *failT) Fail() { t.failed = true }

// RunSuite runs the cases as a Ginkgo suite from inside the vmchaos binary,
// the way the agent catalogue runs (scenarios/suite): one DescribeTable whose
// entries carry the cases' labels, the label filter Ginkgo's own, and
// ginkgo.json in the report dir. It returns the results (not yet written).
// Ginkgo allows one RunSpecs per process.
func (r *Runner) RunSuite(ctx context.Context, cases []Case, filter string) (*reports.Results, error) {
	if _, err := types.ParseLabelFilter(filter); err != nil {
		return nil, fmt.Errorf("label filter %q: %w", filter, err)
	}
	res := r.newResults(filter)
	var mu sync.Mutex
	entries := []any{func(sctx g.SpecContext, c Case) {
		rc := r.RunCase(sctx, c)
		r.progress(rc)
		mu.Lock()
		res.Cases = append(res.Cases, rc)
		mu.Unlock()
		g.AddReportEntry("verdict", rc.Verdict, g.ReportEntryVisibilityFailureOrVerbose)
		g.AddReportEntry("repro", rc.Repro, g.ReportEntryVisibilityFailureOrVerbose)
		switch rc.Verdict {
		case reports.Pass:
		case reports.Inconclusive:
			g.Skip("inconclusive: " + rc.Reason) // not a pass: the gate exits 2
		default:
			var ev []string
			for _, inv := range rc.Invariants {
				if !inv.OK {
					ev = append(ev, fmt.Sprintf("  %s: %s", inv.Name, inv.Evidence))
				}
			}
			g.Fail(fmt.Sprintf("%s: %s\n%s\nrepro: %s", rc.Verdict, rc.Reason, strings.Join(ev, "\n"), rc.Repro))
		}
	}}
	for _, c := range cases {
		entries = append(entries, g.Entry(c.ID, c, g.Label(c.Labels...)))
	}
	g.Describe("vmchaos manager layer ("+r.opts.Manager+")", func() {
		g.DescribeTable("case", entries...)
	})
	sc, rc := g.GinkgoConfiguration()
	sc.LabelFilter = filter
	sc.RandomSeed = r.opts.Seed
	sc.RandomizeAllSpecs = false
	rc.JSONReport = filepath.Join(r.opts.ReportDir, "ginkgo.json")
	rc.Succinct = true
	rc.NoColor = true
	g.RunSpecs(&failT{}, "vmchaos manager layer", sc, rc)
	res.FinishedAt = time.Now().UTC()
	_ = ctx
	return res, nil
}
