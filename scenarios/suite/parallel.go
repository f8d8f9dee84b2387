package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/onsi/ginkgo/v2/reporters"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
)

// RunParallel runs cases on n workers without Ginkgo's scheduler (Ginkgo
// parallelises only across processes started by its CLI) and writes the
// same ginkgo.json a sequential Run writes, one spec report per case, in
// catalogue order.
func RunParallel(ctx context.Context, r *runner.Runner, cases []scenarios.Case, n int, reportDir string, seed int64) error {
	start := time.Now()
	specs := make([]types.SpecReport, len(cases))
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				t0 := time.Now()
				rc := r.RunCase(ctx, cases[i])
				specs[i] = specReport(cases[i], rc, t0, time.Now())
			}
		}()
	}
	for i := range cases {
		if ctx.Err() != nil {
			break
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	ok := true
	for _, s := range specs {
		ok = ok && s.State != types.SpecStateFailed
	}
	cwd, _ := os.Getwd()
	rep := types.Report{SuitePath: cwd, SuiteDescription: "vmchaos", SuiteSucceeded: ok, StartTime: start,
		EndTime: time.Now(), RunTime: time.Since(start), SpecReports: specs,
		PreRunStats: types.PreRunStats{TotalSpecs: len(cases), SpecsThatWillRun: len(cases)}}
	rep.SuiteConfig.RandomSeed = seed
	if err := reporters.GenerateJSONReport(rep, filepath.Join(reportDir, "ginkgo.json")); err != nil {
		return fmt.Errorf("ginkgo.json: %w", err)
	}
	return nil
}

func specReport(c scenarios.Case, rc reports.Case, t0, t1 time.Time) types.SpecReport {
	s := types.SpecReport{ContainerHierarchyTexts: []string{"vmchaos catalogue", "case"}, LeafNodeType: types.NodeTypeIt,
		LeafNodeText: c.ID, LeafNodeLabels: c.Labels, StartTime: t0, EndTime: t1, RunTime: t1.Sub(t0), NumAttempts: 1}
	if len(rc.Runs) > 1 {
		// Ginkgo's convention for a spec run several times
		s.NumAttempts, s.MaxMustPassRepeatedly = len(rc.Runs), len(rc.Runs)
	}
	switch rc.Verdict {
	case reports.Pass:
		s.State = types.SpecStatePassed
	case reports.Inconclusive:
		s.State = types.SpecStateSkipped
		s.Failure = types.Failure{Message: "inconclusive: " + rc.Reason}
	default:
		s.State = types.SpecStateFailed
		s.Failure = types.Failure{Message: fmt.Sprintf("%s: %s\nrepro: %s", rc.Verdict, rc.Reason, rc.Repro)}
	}
	return s
}
