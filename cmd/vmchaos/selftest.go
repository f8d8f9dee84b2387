package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
	"github.com/vmchaos/vmchaos/scenarios/suite"
)

func init() { register(newSelftestCmd) }

// selftestOpts are selftest's own flags.
type selftestOpts struct {
	fast, list, failfast bool
	parallel, count      int
	bugs                 string // --bug: only these bugs (comma-separated)
	cleanParallel        string // the runs without a bug: auto or N (suite.ParseParallel)
	cleanWorkers         int    // cleanParallel resolved
}

func newSelftestCmd() *cobra.Command {
	var f runFlags
	var o selftestOpts
	c := &cobra.Command{
		Use:   "selftest",
		Short: "Prove the catalogue catches every historical bug: fail with the bug switched on, pass without",
		Long: `selftest runs, for every bug of the regression library (regress.Bugs), the scenarios whose
Targets name it, with VMCHAOS_REGRESS=<bug> (the case must fail, and its failure must name
the invariant the bug breaks — not a timeout of the harness) and without (it must pass).
--count N runs each N times with the bug and N times without: the table then gives each row's
detection rate k/N, the first catching run and the false positives (runs without the bug that did
not pass, which must be 0/N). A rate under 100 % is shown as the rate; a row whose fault is parked
at an exact phase must be N/N. --failfast stops a row at its first catch (rate k/runs done).
The table goes to the terminal and to selftest.md/selftest.json in the run dir; every case's
results, logs and trace are kept as for run. --fast runs only the quickest scenario per bug.
Exit status 0 only when every row holds: caught at least once, every park row in every run,
and no false positive.`,
		Example: `  vmchaos selftest --fast --time-scale 0.05
  vmchaos selftest --fast --count 20 --parallel 4 --time-scale 0.05
  vmchaos selftest --fast --count 100 --failfast --parallel 12 --time-scale 0.05
  vmchaos selftest --bug net-skips-eject-wait --time-scale 0.05
  vmchaos selftest --list`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.count < 1 {
				return fmt.Errorf("--count %d: want at least 1", o.count)
			}
			plan, err := selftestPlan(o.fast)
			if err != nil {
				return err
			}
			if plan, err = onlyBugs(plan, o.bugs); err != nil {
				return err
			}
			if o.list {
				return listSelftest(cmd)
			}
			return runSelftest(cmd, &f, plan, o)
		},
	}
	f.add(c)
	c.Flags().IntVar(&o.parallel, "parallel", 1, "with-bug cases run at once (after the cases without a bug, which must pass); a with-bug case usually waits out the 20 s convergence budget, so CI runs its 12 at once")
	c.Flags().StringVar(&o.cleanParallel, "clean-parallel", "auto", "the cases without a bug, which run first and must pass, are scheduled as run --parallel schedules the catalogue: cases with timed faults or a window calibration alone, the rest (park, steady state) auto (from the CPUs and the load, as run's) or N at a time; 1: one at a time")
	c.Flags().BoolVar(&o.fast, "fast", false, "only the quickest detecting scenario per bug (what CI runs)")
	c.Flags().StringVar(&o.bugs, "bug", "", "only these bugs of the library (comma-separated switch names, as VMCHAOS_REGRESS takes them), e.g. --bug net-skips-eject-wait; empty: every bug")
	c.Flags().BoolVar(&o.list, "list", false, "list every bug with its seed, the invariant it breaks and the scenarios targeting it")
	c.Flags().IntVar(&o.count, "count", 1, "run every check N times with the bug on and N times with it off, and report the detection rate k/N, the first catching run and the false positives, e.g. --count 20; 1 is one run each, the one-run table")
	c.Flags().BoolVar(&o.failfast, "failfast", false, "with --count: stop a bug's row at its first catch (its rate is then k/runs done, marked stopped early) and a scenario's runs without a bug at their first non-pass, e.g. --count 100 --failfast (CI)")
	return c
}

// listSelftest prints every bug with the scenarios that target it.
func listSelftest(cmd *cobra.Command) error {
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUG\tSEED\tCOMPONENT\tINVARIANT\tSCENARIOS")
	for _, b := range regress.Bugs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", b.Name, b.Seed, b.Component, b.Invariant, strings.Join(scenarios.ScenariosTargeting(b.Name), ", "))
	}
	return tw.Flush()
}

// runSelftest runs the plan, writes selftest.md/json and the run's reports
// and judges the rows.
func runSelftest(cmd *cobra.Command, f *runFlags, plan []selftestItem, o selftestOpts) error {
	ctx, cancel := signalContext()
	defer cancel()
	n, how, err := suite.ParseParallel(o.cleanParallel)
	if err != nil {
		return err
	}
	o.cleanWorkers = n
	fmt.Fprintf(os.Stderr, "vmchaos selftest: cases without a bug %s at a time (timed ones alone), with a bug %d at a time\n", how, o.parallel)
	dir := f.dir("selftest")
	r, err := f.runner(ctx, dir, os.Stderr, nil)
	if err != nil {
		return runInfraError{err}
	}
	start := time.Now()
	f.meter.Start("selftest", selftestCases(plan)*o.count, o.parallel)
	runs, err := runSelftestPlan(ctx, r, plan, f.backend, o)
	if err != nil {
		return err
	}
	var rows []reports.SelftestRow
	for i, p := range plan {
		rate := reports.MeasureDetection(p.bug.Invariant, runs.with[i], runs.without[p.scenario], o.count, o.failfast, parkScenario(p.scenario))
		if rate.Runs > 0 && rate.CleanRuns > 0 {
			rows = append(rows, selftestRow(p.bug, p.scenario, runs.with[i], runs.without[p.scenario], rate))
		}
	}
	f.meter.Stop()
	if err := reports.WriteSelftest(dir, rows); err != nil {
		return err
	}
	// The run summary counts the with-bug cases, which must fail; the
	// selftest table and its verdict come last so they are what a
	// reader of a CI log sees at the bottom.
	fmt.Fprintln(cmd.OutOrStdout(), "(run summary: the cases run with a bug switched on are expected to fail)")
	finishErr := finish(cmd, r, dir)
	fmt.Fprintf(os.Stderr, "vmchaos selftest: %d row(s) in %s\n", len(rows), time.Since(start).Round(time.Second))
	_ = reports.FormatSelftest(cmd.OutOrStdout(), rows)
	t := reports.TallySelftest(rows)
	if finishErr != nil && !t.OK() {
		return finishErr
	}
	if !t.OK() {
		return fmt.Errorf("selftest: %s", t)
	}
	return nil
}

// parkScenario says whether the scenario parks a fault at an exact phase:
// nothing is left to timing, so its detection must hold in every run.
func parkScenario(id string) bool {
	s, _ := scenarios.Lookup(id)
	if s == nil {
		return false
	}
	for _, f := range s.Faults {
		if strings.HasPrefix(strings.TrimSpace(f.Trigger), "park") {
			return true
		}
	}
	return false
}

type selftestItem struct {
	bug      regress.Bug
	scenario string
}

// selftestPlan lists (bug, scenario) pairs; fast keeps the first
// speed:fast scenario per bug (the catalogue lists the quickest first).
func selftestPlan(fast bool) ([]selftestItem, error) {
	var out []selftestItem
	for _, b := range regress.Bugs {
		ids := scenarios.ScenariosTargeting(b.Name)
		if len(ids) == 0 {
			return nil, fmt.Errorf("bug %s: no scenario targets it", b.Name)
		}
		if fast {
			pick := ids[0]
			for _, id := range ids {
				if s, _ := scenarios.Lookup(id); s != nil && s.Speed == "fast" {
					pick = id
					break
				}
			}
			ids = []string{pick}
		}
		for _, id := range ids {
			out = append(out, selftestItem{bug: b, scenario: id})
		}
	}
	return out, nil
}

// onlyBugs keeps the rows of the named bugs (all when names is empty); an
// unknown name is an error, never an empty plan that passes.
func onlyBugs(plan []selftestItem, names string) ([]selftestItem, error) {
	if strings.TrimSpace(names) == "" {
		return plan, nil
	}
	want, err := regress.Parse(names)
	if err != nil {
		return nil, fmt.Errorf("--bug: %w", err)
	}
	var out []selftestItem
	for _, it := range plan {
		if slices.Contains(want, it.bug.Name) {
			out = append(out, it)
		}
	}
	return out, nil
}

// selftestRow builds one bug × scenario row from its runs: rate judges it
// (reports.DetectionRate.Judge); the verdict fields are those of a
// representative run, the first that caught the bug and the first without
// it that did not pass (else the first of each).
func selftestRow(b regress.Bug, scenario string, withRuns, withoutRuns []reports.Case, rate reports.DetectionRate) reports.SelftestRow {
	with := representative(withRuns, func(c reports.Case) bool { return reports.Catches(c, b.Invariant) })
	without := representative(withoutRuns, func(c reports.Case) bool { return c.Verdict != reports.Pass })
	var violated []string
	named := false
	for _, inv := range with.Invariants {
		if !inv.OK {
			violated = append(violated, inv.Name)
			named = named || inv.Name == b.Invariant
		}
	}
	row := reports.SelftestRow{Bug: b.Name, Seed: b.Seed, Scenario: scenario, WithBugVerdict: with.Verdict,
		WithBugInvariant: strings.Join(violated, ","), WithoutBugVerdict: without.Verdict, Repro: with.Repro, Rate: &rate}
	row.OK, row.Note = rate.Judge()
	if row.OK || rate.Count > 1 {
		return row
	}
	// one run each: say what that run did, as selftest always has
	switch {
	case with.Verdict != reports.Fail:
		row.Note = fmt.Sprintf("with the bug the case was %s (%s): not detected", with.Verdict, with.Reason)
	case !named:
		row.Note = fmt.Sprintf("failed, but not on %s (the invariant the bug breaks)", b.Invariant)
	default:
		row.Note = fmt.Sprintf("without the bug the case was %s (%s)", without.Verdict, without.Reason)
	}
	return row
}

// representative is the first run done for which pick holds, else the
// first run done.
func representative(runs []reports.Case, pick func(reports.Case) bool) reports.Case {
	var first reports.Case
	for _, c := range runs {
		if c.ID == "" {
			continue
		}
		if pick(c) {
			return c
		}
		if first.ID == "" {
			first = c
		}
	}
	return first
}

// selftestCases is how many cases a plan runs: one per row with the bug,
// and one per scenario without any (shared by the rows of that scenario).
func selftestCases(plan []selftestItem) int {
	seen := map[string]bool{}
	for _, p := range plan {
		seen[p.scenario] = true
	}
	return len(plan) + len(seen)
}

// selftestRuns is every run of a plan: without[scenario][k] and with[i][k]
// are run k+1 of the scenario without a bug and of plan[i] with its bug; an
// ID of "" is a run not done (--failfast, or the run was interrupted).
type selftestRuns struct {
	without map[string][]reports.Case
	with    [][]reports.Case
}

// nthRun is run k (0-based) of a case; with --count above 1 its id, and so
// its case dir, carries ".runK" so every run's logs are kept.
func nthRun(c scenarios.Case, k, count int) scenarios.Case {
	if count > 1 {
		c.ID = fmt.Sprintf("%s.run%d", c.ID, k+1)
	}
	return c
}

// runSelftestPlan runs each plan scenario o.count times without a bug, one
// at a time (those must pass, and their timing is what the catalogue was
// calibrated on), then every (bug, scenario) o.count times with the bug on
// o.parallel workers: a with-bug case mostly waits out its convergence
// budget, so running them side by side costs little CPU.
func runSelftestPlan(ctx context.Context, r *runner.Runner, plan []selftestItem, backend string, o selftestOpts) (selftestRuns, error) {
	cases := make([]scenarios.Case, len(plan))
	for i, p := range plan {
		cs, err := scenarios.CaseFor(p.scenario, 0, false, backend)
		if err != nil {
			return selftestRuns{}, err
		}
		cases[i] = cs
	}
	runs := selftestRuns{without: map[string][]reports.Case{}, with: make([][]reports.Case, len(plan))}
	for i, p := range plan {
		runs.with[i] = make([]reports.Case, o.count)
		if _, ok := runs.without[p.scenario]; !ok {
			runs.without[p.scenario] = make([]reports.Case, o.count)
		}
	}
	for k := 0; k < o.count && ctx.Err() == nil; k++ {
		runClean(ctx, r, plan, cases, runs.without, k, o)
	}
	runWithBugs(ctx, r, plan, cases, runs.with, o)
	return runs, nil
}

// runClean does run k of every plan scenario without a bug (once per
// scenario, however many bugs it catches) through the catalogue's
// scheduler: a case whose fault lands by the clock or that calibrates a
// window runs alone (that timing is what the catalogue was calibrated on),
// park and steady-state cases o.cleanWorkers at a time (issue 37: one at a
// time they were half of selftest-fast's wall time). With --failfast a
// scenario whose earlier runs did not all pass is not run again.
func runClean(ctx context.Context, r *runner.Runner, plan []selftestItem, cases []scenarios.Case, without map[string][]reports.Case, k int, o selftestOpts) {
	var todo []int // plan indexes, one per scenario
	seen := map[string]bool{}
	for i, p := range plan {
		if seen[p.scenario] || (o.failfast && anyNot(without[p.scenario], reports.Pass)) {
			continue
		}
		seen[p.scenario] = true
		todo = append(todo, i)
	}
	classes := make([]suite.Class, len(todo))
	for j, i := range todo {
		classes[j], _ = suite.Classify(cases[i])
	}
	suite.Schedule(ctx, classes, o.cleanWorkers, func(ctx context.Context, j int) {
		i := todo[j]
		// each scenario's slot k is written by this call only, and read
		// once Schedule has returned
		without[plan[i].scenario][k] = r.RunCaseWith(ctx, nthRun(cases[i], k, o.count), nil)
	})
}

// anyNot says whether a run done had another verdict than v.
func anyNot(runs []reports.Case, v string) bool {
	for _, c := range runs {
		if c.ID != "" && c.Verdict != v {
			return true
		}
	}
	return false
}

// runWithBugs fills with[i][k] on o.parallel workers. Without --failfast
// run 1 of every row goes first, then run 2, and so on, so that rows
// progress side by side; with it a row's runs go one after the other on
// one worker, each only once the one before missed, so a row stops at its
// first catch and rows still run side by side.
func runWithBugs(ctx context.Context, r *runner.Runner, plan []selftestItem, cases []scenarios.Case, with [][]reports.Case, o selftestOpts) {
	type job struct{ i, from, to int } // runs from..to-1 of plan[i]
	jobs := make(chan job)
	var wg sync.WaitGroup
	for w := 0; w < max(o.parallel, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				p := plan[j.i]
				for k := j.from; k < j.to && ctx.Err() == nil; k++ {
					// each (i, k) is written by this worker only, and read
					// after wg.Wait
					with[j.i][k] = r.RunCaseWith(ctx, nthRun(cases[j.i], k, o.count), []string{p.bug.Name})
					if o.failfast && reports.Catches(with[j.i][k], p.bug.Invariant) {
						break
					}
				}
			}
		}()
	}
	var order []job
	for i := range plan {
		order = append(order, job{i, 0, o.count})
	}
	if !o.failfast {
		order = order[:0]
		for k := 0; k < o.count; k++ {
			for i := range plan {
				order = append(order, job{i, k, k + 1})
			}
		}
	}
	for _, j := range order {
		if ctx.Err() != nil {
			break
		}
		jobs <- j
	}
	close(jobs)
	wg.Wait()
}
