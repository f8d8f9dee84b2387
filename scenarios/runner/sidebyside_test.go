package runner

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// caseRunArgs is one run of a case, with the planted bugs switched on.
type caseRunArgs struct {
	c    scenarios.Case
	bugs []string
}

// runSideBySide runs every run at once on r and returns the results in
// order. It is for runs that wait out their convergence budget (a stalled
// agent, a planted bug the case catches): 20 s of waiting each, one after
// the other, made this package the longest of `make test` (issue 37). The
// stalled runs park (no clock: scenarios/suite.Classify shares them); the
// with-bug runs go side by side as `vmchaos selftest` runs them in CI. Two
// runs of one case need distinct bugs or IDs (the case dir is named by both).
func runSideBySide(ctx context.Context, r *Runner, runs []caseRunArgs) []reports.Case {
	out := make([]reports.Case, len(runs))
	var wg sync.WaitGroup
	for i, run := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = r.RunCaseWith(ctx, run.c, run.bugs)
		}()
	}
	wg.Wait()
	return out
}

// newTestRunner is a builtin-supervised runner at scale 0.05 for one test,
// closed (and checked for leftover processes) when the test ends.
func newTestRunner(t *testing.T, limit time.Duration) (context.Context, *Runner) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	r, err := New(ctx, Options{ReportDir: t.TempDir(), Supervisor: "builtin", Scale: 0.05, Seed: 1})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		left := leftovers(r)
		r.Close()
		cancel()
		if len(left) > 0 {
			t.Errorf("processes left: %v", left)
		}
	})
	return ctx, r
}
