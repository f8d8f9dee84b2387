package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
)

func init() { register(newSelftestCmd) }

func newSelftestCmd() *cobra.Command {
	var f runFlags
	var fast, list bool
	var parallel int
	c := &cobra.Command{
		Use:   "selftest",
		Short: "Prove the catalogue catches every historical bug: fail with the bug switched on, pass without",
		Long: `selftest runs, for every bug of the regression library (regress.Bugs), the scenarios whose
Targets name it, once with VMCHAOS_REGRESS=<bug> (the case must fail, and its failure must name
the invariant the bug breaks — not a timeout of the harness) and once without (it must pass).
The table goes to the terminal and to selftest.md/selftest.json in the run dir; every case's
results, logs and trace are kept as for run. --fast runs only the quickest scenario per bug.
Exit status 0 only when every row holds.`,
		Example: `  vmchaos selftest --fast --time-scale 0.05
  vmchaos selftest --list`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			plan, err := selftestPlan(fast)
			if err != nil {
				return err
			}
			if list {
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "BUG\tSEED\tCOMPONENT\tINVARIANT\tSCENARIOS")
				for _, b := range regress.Bugs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", b.Name, b.Seed, b.Component, b.Invariant, strings.Join(scenarios.ScenariosTargeting(b.Name), ", "))
				}
				return tw.Flush()
			}
			ctx, cancel := signalContext()
			defer cancel()
			dir := f.dir("selftest")
			r, err := f.runner(ctx, dir, os.Stderr, nil)
			if err != nil {
				return runInfraError{err}
			}
			start := time.Now()
			f.meter.Start("selftest", selftestCases(plan), parallel)
			without, with, err := runSelftestPlan(ctx, r, plan, f.backend, parallel)
			if err != nil {
				return err
			}
			var rows []reports.SelftestRow
			for i, p := range plan {
				if wo, ok := without[p.scenario]; ok && with[i].ID != "" {
					rows = append(rows, selftestRow(p.bug, p.scenario, with[i], wo))
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
			if finishErr != nil && !reports.TallySelftest(rows).OK() {
				return finishErr
			}
			if t := reports.TallySelftest(rows); !t.OK() {
				return fmt.Errorf("selftest: %s", t)
			}
			return nil
		},
	}
	f.add(c)
	c.Flags().IntVar(&parallel, "parallel", 1, "with-bug cases run at once (the cases without a bug, which must pass, always run one at a time first); a with-bug case usually waits out the 20 s convergence budget, so CI runs its 12 at once")
	c.Flags().BoolVar(&fast, "fast", false, "only the quickest detecting scenario per bug (what CI runs)")
	c.Flags().BoolVar(&list, "list", false, "list every bug with its seed, the invariant it breaks and the scenarios targeting it")
	return c
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

// selftestRow judges one bug × scenario: the bug must make the case fail
// naming the bug's invariant, and the case must pass without it.
func selftestRow(b regress.Bug, scenario string, with, without reports.Case) reports.SelftestRow {
	var violated []string
	named := false
	for _, inv := range with.Invariants {
		if !inv.OK {
			violated = append(violated, inv.Name)
			named = named || inv.Name == b.Invariant
		}
	}
	row := reports.SelftestRow{Bug: b.Name, Seed: b.Seed, Scenario: scenario, WithBugVerdict: with.Verdict,
		WithBugInvariant: strings.Join(violated, ","), WithoutBugVerdict: without.Verdict, Repro: with.Repro}
	row.OK = with.Verdict == reports.Fail && named && without.Verdict == reports.Pass
	switch {
	case row.OK:
	case with.Verdict != reports.Fail:
		row.Note = fmt.Sprintf("with the bug the case was %s (%s): not detected", with.Verdict, with.Reason)
	case !named:
		row.Note = fmt.Sprintf("failed, but not on %s (the invariant the bug breaks)", b.Invariant)
	default:
		row.Note = fmt.Sprintf("without the bug the case was %s (%s)", without.Verdict, without.Reason)
	}
	return row
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

// runSelftestPlan runs each plan scenario once without a bug, one at a time
// (those must pass, and their timing is what the catalogue was calibrated
// on), then every (bug, scenario) with the bug on n workers: a with-bug case
// mostly waits out its convergence budget, so running them side by side
// costs little CPU. with[i] belongs to plan[i]; an ID of "" means it did not
// run (the run was interrupted).
func runSelftestPlan(ctx context.Context, r *runner.Runner, plan []selftestItem, backend string, n int) (map[string]reports.Case, []reports.Case, error) {
	cases := make([]scenarios.Case, len(plan))
	for i, p := range plan {
		cs, err := scenarios.CaseFor(p.scenario, 0, false, backend)
		if err != nil {
			return nil, nil, err
		}
		cases[i] = cs
	}
	without := map[string]reports.Case{}
	for i, p := range plan {
		if _, done := without[p.scenario]; done || ctx.Err() != nil {
			continue
		}
		without[p.scenario] = r.RunCaseWith(ctx, cases[i], nil)
	}
	with := make([]reports.Case, len(plan))
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < max(n, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				with[i] = r.RunCaseWith(ctx, cases[i], []string{plan[i].bug.Name})
			}
		}()
	}
	for i := range plan {
		if ctx.Err() != nil {
			break
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return without, with, nil
}
