package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
)

func init() { register(newReproCmd) }

func newReproCmd() *cobra.Command {
	var f runFlags
	var mf managerFlags
	var id, offset string
	var repeat, count int
	c := &cobra.Command{
		Use:   "repro",
		Short: "Rerun one case (a scenario at one offset): the command every failing case prints",
		Long: `repro runs one catalogue scenario at one offset with the given seed, time scale and backend,
and writes the same reports as run. VMCHAOS_REGRESS in the environment switches historical bugs
back on, as selftest does. --repeat N runs it N times (verdict stability).
--count N runs it N times, each on a fresh stack in its own case dir (<id>.runK), and prints how
often the verdict and the set of failed invariants repeated ("fail [intent-goal] 18/20, pass
2/20") with what varied between the runs: landed phase, window margin, injection error. Its exit
status is the gate code of the most common outcome.`,
		Example: `  vmchaos repro --scenario s001-h-wake-sigkill-after-commit --offset 28ms --seed 1 --time-scale 0.05 --backend fake
  VMCHAOS_REGRESS=net-refuses-paused vmchaos repro --scenario s001-2-stop-in-pause-window --time-scale 0.05
  VMCHAOS_REGRESS=save-rm-by-name vmchaos repro --scenario s001-3-pending-holder --count 20 --time-scale 0.05
  vmchaos repro --manager cocoon --manager-bin ./cocoon --scenario mgr-clone-kill-at-ch.restore.begin --count 20 --time-scale 0.05
  vmchaos repro --manager cocoon --manager-bin ./cocoon --scenario sweep-clone-sigkill --offset 50% --time-scale 0.1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if count < 1 || (count > 1 && repeat > 1) {
				return fmt.Errorf("--count %d --repeat %d: want --count >= 1, and not both above 1", count, repeat)
			}
			if mf.agentCases("case:" + scenarios.CaseLabel(id)) {
				// an agent case with its agent over cocoon, as `run`
				// runs it (the repro line of such a run says so)
				f.agentCocoon = mf.bin
			} else if mf.selected("case:" + scenarios.CaseLabel(id)) {
				if offset != "" {
					return fmt.Errorf("--offset: a manager-verb case's offset is in its id (mgr-clone-kill-at-35%%)")
				}
				return reproManager(cmd, &f, &mf, id, repeat, count)
			}
			cs, err := caseFromFlags(id, offset, f.backend)
			if err != nil {
				return err
			}
			if code, done := inPrivateMountNS(&f, []scenarios.Case{cs}); done {
				os.Exit(code)
			}
			ctx, cancel, dir, r, err := f.startRunner("repro")
			if err != nil {
				return err
			}
			defer cancel()
			if f.agentCocoon != "" && len(r.CocoonAgentCases([]scenarios.Case{cs})) == 0 {
				ns := r.Results().NotSupported
				return fmt.Errorf("%s cannot run with its agent over cocoon: %s", id, ns[len(ns)-1].Reason)
			}
			if count > 1 {
				return reproCount(ctx, cmd, r, dir, cs, count)
			}
			for i := 0; i < max(repeat, 1) && ctx.Err() == nil; i++ {
				r.RunCase(ctx, cs)
			}
			return finish(cmd, r, dir)
		},
	}
	f.add(c)
	mf.add(c)
	c.Flags().StringVar(&id, "scenario", "", "scenario id (see `vmchaos run --list`), or a manager-verb case id (mgr-…; with --manager and --manager-bin for a manager other than the bundled vmctl)")
	c.Flags().StringVar(&offset, "offset", "", "offset added to the scenario's trigger, real time (e.g. 59ms), or a percentage of the operation's window (35%); default the scenario's first")
	c.Flags().IntVar(&repeat, "repeat", 1, "run the case this many times")
	c.Flags().IntVar(&count, "count", 1, "run the case N times and report how often its verdict and failed invariants repeat and what varied between runs (landed phase, window margin, injection error), e.g. --count 20; exit status: the gate code of the most common outcome; 1 is one run, no table")
	_ = c.MarkFlagRequired("scenario")
	return c
}

// caseFromFlags builds the case of --scenario/--offset.
func caseFromFlags(id, offset, backend string) (scenarios.Case, error) {
	if offset == "" {
		return scenarios.CaseFor(id, 0, false, backend)
	}
	// "35%": a fraction of the operation's window, measured again on this
	// run's stack (a failing case prints the absolute offset it resolved)
	if scenarios.IsFracSweep(offset) {
		fr, err := scenarios.ParseFracSweep(offset)
		if err != nil || len(fr) != 1 {
			return scenarios.Case{}, fmt.Errorf("--offset %q: want one percentage", offset)
		}
		return scenarios.CaseForFrac(id, fr[0], backend)
	}
	d, err := injector.ParseOffset(offset)
	if err != nil {
		return scenarios.Case{}, fmt.Errorf("--offset: %w", err)
	}
	return scenarios.CaseFor(id, d, true, backend)
}

// startRunner starts the runner of a one-scenario verb (repro, sweep,
// bisect): the planted bugs from VMCHAOS_REGRESS, a context SIGINT and
// SIGTERM cancel, and the verb's report directory. The caller defers cancel
// when err is nil.
func (f *runFlags) startRunner(kind string) (ctx context.Context, cancel context.CancelFunc, dir string, r *runner.Runner, err error) {
	bugs, err := regressFromEnv()
	if err != nil {
		return nil, nil, "", nil, err
	}
	ctx, cancel = signalContext()
	dir = f.dir(kind)
	if r, err = f.runner(ctx, dir, os.Stderr, bugs); err != nil {
		cancel()
		return nil, nil, "", nil, runInfraError{err}
	}
	return ctx, cancel, dir, r, nil
}

// reproCount runs the case count times, each in its own case dir, writes
// the reports, prints the outcome table (reports.FormatRepro) and returns
// the gate code of the most common outcome: the code that case usually
// gets.
func reproCount(ctx context.Context, cmd *cobra.Command, r *runner.Runner, dir string, cs scenarios.Case, count int) error {
	var runs []reports.Case
	for k := 0; k < count && ctx.Err() == nil; k++ {
		runs = append(runs, r.RunCase(ctx, nthRun(cs, k, count)))
	}
	res, err := writeReports(cmd, r, dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "\nrepro %s: %d of %d run(s) done\n", cs.ID, len(runs), count)
	if err := reports.FormatRepro(cmd.OutOrStdout(), runs); err != nil {
		return err
	}
	if len(runs) < count {
		// interrupted: what ran is shown, but nothing is proven
		return &reports.GateError{Code: reports.GateInconclusive}
	}
	mode := reports.TallyOutcomes(runs)[0]
	judged := *res
	judged.Cases = nil
	for _, k := range mode.Runs {
		judged.Cases = append(judged.Cases, runs[k-1])
	}
	return reports.Gate(&judged, nil, reports.DefaultGateOptions()).Err()
}

// writeReports writes the reports, tears the runner down (a teardown error
// is only a warning) and prints the summary.
func writeReports(cmd *cobra.Command, r *runner.Runner, dir string) (*reports.Results, error) {
	res, werr := r.WriteAll()
	if cerr := r.Close(); cerr != nil {
		fmt.Fprintln(os.Stderr, "warning: teardown:", cerr)
	}
	res.Dir = dir
	reports.Summary(cmd.OutOrStdout(), res)
	if werr != nil {
		return nil, fmt.Errorf("write reports: %w", werr)
	}
	return res, nil
}

// finish writes the reports, prints the summary and returns the gate's exit.
func finish(cmd *cobra.Command, r *runner.Runner, dir string) error {
	res, err := writeReports(cmd, r, dir)
	if err != nil {
		return err
	}
	return reports.Gate(res, nil, reports.DefaultGateOptions()).Err()
}

// reproManager is repro of a manager-verb case: the runner in its manager
// mode generates the manager's cases (after discovering its verbs' phases)
// and runs the one named, once, --repeat or --count times.
func reproManager(cmd *cobra.Command, f *runFlags, mf *managerFlags, id string, repeat, count int) error {
	if code, done := inPrivateMountNS(f, mgrMayCut); done {
		os.Exit(code)
	}
	bugs, err := regressFromEnv()
	if err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	dir := f.dir("repro-" + mf.name)
	r, err := runner.New(ctx, runner.Options{ReportDir: dir, Backend: f.backend, Scale: f.scale, Seed: f.seed,
		Regress: bugs, Manager: mf.name, ManagerBin: mf.bin, ManagerConfig: mf.config})
	if err != nil {
		return runInfraError{err}
	}
	all, err := r.ManagerCases(ctx)
	if err != nil {
		_ = r.Close()
		return runInfraError{err}
	}
	for _, c := range all {
		if c.ID != id {
			continue
		}
		if count > 1 {
			return reproCount(ctx, cmd, r, dir, c, count)
		}
		for i := 0; i < max(repeat, 1) && ctx.Err() == nil; i++ {
			r.RunCase(ctx, c)
		}
		return finish(cmd, r, dir)
	}
	_ = r.Close()
	return fmt.Errorf("no manager-verb case %q for %s (see `vmchaos run --manager %s --list`)", id, mf.name, mf.name)
}
