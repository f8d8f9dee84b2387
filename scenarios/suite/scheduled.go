package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/onsi/ginkgo/v2/reporters"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
)

// RunScheduled runs cases through Schedule (n shared cases at a time, each
// alone case by itself; Classify says which) without Ginkgo's scheduler
// (Ginkgo parallelises only across processes started by its CLI), writes
// the same ginkgo.json a sequential Run writes, one spec report per case
// in catalogue order, and records each case's class and concurrency in
// the runner's results, which it puts back in catalogue order.
// Shared cases start in order (ByTimes, OrderOf; CatalogueOrder for none).
func RunScheduled(ctx context.Context, r *runner.Runner, cases []scenarios.Case, order Order, n int, reportDir string, seed int64) error {
	start := time.Now()
	classes := make([]Class, len(cases))
	for i, c := range cases {
		classes[i], _ = Classify(c)
	}
	specs := make([]types.SpecReport, len(cases))
	// with --repeat each repetition of an alone case takes the machine
	slots := schedule(ctx, classes, order, n, r.RepeatRuns() > 1, func(ctx context.Context, i int) {
		t0 := time.Now()
		rc := r.RunCase(ctx, cases[i])
		specs[i] = specReport(cases[i], rc, t0, time.Now())
	})
	var ran []types.SpecReport
	for i, s := range slots {
		if s.Ran {
			ran = append(ran, specs[i])
		}
	}
	Annotate(r.Results(), cases, slots)
	return writeGinkgo(ran, len(cases), start, reportDir, seed)
}

// Annotate records each case's class and concurrency in res (slots from
// Schedule, or nil for a sequential run: concurrency 1) and sorts res's
// cases into the order of cases, the order a sequential run appends them
// in. Call it once no case is in flight.
func Annotate(res *reports.Results, cases []scenarios.Case, slots []Slot) {
	at := make(map[string]int, len(cases))
	for i, c := range cases {
		at[c.ID] = i
	}
	for k := range res.Cases {
		rc := &res.Cases[k]
		i, ok := at[rc.ID]
		if !ok {
			continue
		}
		cl, _ := Classify(cases[i])
		rc.Class, rc.Concurrency = string(cl), 1
		if slots != nil {
			rc.Concurrency, rc.ClockConcurrency = slots[i].Concurrency, slots[i].ClockConcurrency
			rc.ClockMs = float64(slots[i].Clock) / float64(time.Millisecond)
			rc.ClockWaitMs = float64(slots[i].ClockWait) / float64(time.Millisecond)
		}
	}
	sort.SliceStable(res.Cases, func(a, b int) bool {
		ia, oka := at[res.Cases[a].ID]
		ib, okb := at[res.Cases[b].ID]
		return oka && (!okb || ia < ib)
	})
}

// writeGinkgo writes ginkgo.json for the specs that ran.
func writeGinkgo(specs []types.SpecReport, total int, start time.Time, reportDir string, seed int64) error {
	ok := true
	for _, s := range specs {
		ok = ok && s.State != types.SpecStateFailed
	}
	cwd, _ := os.Getwd()
	rep := types.Report{SuitePath: cwd, SuiteDescription: "vmchaos", SuiteSucceeded: ok, StartTime: start,
		EndTime: time.Now(), RunTime: time.Since(start), SpecReports: specs,
		PreRunStats: types.PreRunStats{TotalSpecs: total, SpecsThatWillRun: total}}
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
		s.Failure = types.Failure{Message: skipMessage(rc)}
	default:
		s.State = types.SpecStateFailed
		s.Failure = types.Failure{Message: fmt.Sprintf("%s: %s\nrepro: %s", rc.Verdict, rc.Reason, rc.Repro)}
	}
	return s
}
