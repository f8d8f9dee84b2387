package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
	"github.com/vmchaos/vmchaos/scenarios/suite"
)

// scheduleFlags are run's flags of issue #36: --replay, --check-determinism
// and --repro-check.
type scheduleFlags struct {
	replay     string // a results.json (or run dir) whose schedule to run again
	checkDet   bool
	reproCheck int
	recorded   *reports.Schedule // the schedule --replay read
}

func (s *scheduleFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&s.replay, "replay", "", "run exactly the schedule a results.json (or run dir) records: its cases in its order, offsets, park points, seed, time scale, backend, planted bugs and workers; exit 3 when this build would arm any of it differently (default: none)")
	c.Flags().BoolVar(&s.checkDet, "check-determinism", false, "run every case a second time from the recorded schedule (into RUN_DIR/determinism) and compare the two schedules and the harness's own decisions (what it armed, when it set each fault to fire after its trigger hit); any difference is a harness defect: exit 3")
	c.Flags().IntVar(&s.reproCheck, "repro-check", 0, "after the run, run each failing case N more times (into RUN_DIR/repro-check) and record how often its verdict and failed invariants reproduced; under 95 % the report shows what varied and the park point that pins it (default 0: off)")
}

// set: any of the flags was given.
func (s *scheduleFlags) set() bool { return s.replay != "" || s.checkDet || s.reproCheck > 0 }

// replayConflicts are the flags a schedule decides: --replay refuses them.
var replayConflicts = []string{"label-filter", "shard", "seed", "time-scale", "backend", "parallel", "repeat", "lazyfs"}

// applyReplay loads the recorded schedule, takes the run's settings from it
// and rebuilds its cases from this build's catalogue, in its order. It
// refuses when this build would not run that schedule exactly (a changed
// catalogue or runner, or a schedule edited by hand): the differences are
// the error.
func (o *runCmd) applyReplay(cmd *cobra.Command) ([]scenarios.Case, error) {
	for _, name := range replayConflicts {
		if cmd.Flags().Changed(name) {
			return nil, fmt.Errorf("--replay takes --%s from the recorded schedule: leave it out", name)
		}
	}
	rec, err := reports.Load(o.sf.replay)
	if err != nil {
		return nil, fmt.Errorf("--replay: %w", err)
	}
	s := rec.Schedule
	if s == nil {
		return nil, fmt.Errorf("--replay %s: the results record no schedule (written before vmchaos recorded one, or a merged run)", o.sf.replay)
	}
	if s.Version != reports.ScheduleVersion {
		return nil, fmt.Errorf("--replay %s: schedule version %d, this build reads %d", o.sf.replay, s.Version, reports.ScheduleVersion)
	}
	if env := os.Getenv(regress.Env); env != "" && env != strings.Join(s.Regress, ",") {
		return nil, fmt.Errorf("--replay: %s=%q, the schedule ran with %q: unset it, the schedule sets it", regress.Env, env, strings.Join(s.Regress, ","))
	}
	if err := os.Setenv(regress.Env, strings.Join(s.Regress, ",")); err != nil {
		return nil, fmt.Errorf("--replay: %w", err)
	}
	o.f.backend, o.f.scale, o.f.seed, o.f.lazyfs = s.Backend, s.TimeScale, s.Seed, s.Lazyfs
	o.filter, o.shard, o.repeat = s.Filter, s.Shard, max(s.Repeat, 1)
	o.parallel = fmt.Sprint(s.Workers)
	o.sf.recorded = s
	return suite.CasesOf(s)
}

// schedule builds the run's schedule and, for --replay, compares it with
// the recorded one before anything runs.
func (o *runCmd) schedule(r *runner.Runner, cases []scenarios.Case, workers int) (*reports.Schedule, error) {
	if o.sf.reproCheck < 0 {
		return nil, fmt.Errorf("--repro-check %d: want N >= 0", o.sf.reproCheck)
	}
	s := suite.BuildSchedule(r, cases, suite.ScheduleMeta{Filter: o.filter, Shard: o.shard, Workers: workers, Repeat: o.repeat, Lazyfs: o.f.lazyfs, Order: o.order})
	if o.sf.recorded == nil {
		return s, nil
	}
	if diff := reports.DiffSchedules(o.sf.recorded, s); len(diff) > 0 {
		return nil, fmt.Errorf("--replay %s: this build would not run the recorded schedule exactly (%d difference(s)):\n  %s",
			o.sf.replay, len(diff), strings.Join(diff, "\n  "))
	}
	fmt.Fprintf(os.Stderr, "vmchaos run --replay: %d case(s), schedule identical to the one recorded in %s\n", len(cases), o.sf.replay)
	return s, nil
}

// afterRun runs --repro-check and --check-determinism on a finished run
// (res, written to dir) and writes the reports again with what they found.
// It returns a harness-defect error when the determinism check found any.
func (o *runCmd) afterRun(ctx context.Context, cmd *cobra.Command, res *reports.Results, cases []scenarios.Case, dir string, workers int) error {
	if o.sf.replay != "" {
		res.ReplayOf = o.sf.replay
	}
	if o.sf.reproCheck > 0 {
		if err := o.reproCheck(ctx, cmd.OutOrStdout(), res, cases, dir); err != nil {
			return err
		}
	}
	var defect error
	if o.sf.checkDet {
		d, err := o.checkDeterminism(ctx, res, dir, workers)
		if err != nil {
			return err
		}
		res.Determinism = d
		fmt.Fprint(cmd.OutOrStdout(), d.String())
		if d.Defects() > 0 {
			defect = runInfraError{fmt.Errorf("--check-determinism: %d harness defect(s): the two runs of one schedule were planned or armed differently (see above, results.json determinism)", d.Defects())}
		}
	}
	if err := reports.WriteAll(dir, res); err != nil {
		return fmt.Errorf("write reports: %w", err)
	}
	return defect
}

// passRunner starts a runner of its own for a second pass over cases (the
// first one is closed once its reports are written) into sub of dir.
func (o *runCmd) passRunner(ctx context.Context, dir, sub string) (*runner.Runner, string, error) {
	bugs, err := regressFromEnv()
	if err != nil {
		return nil, "", err
	}
	d := filepath.Join(dir, sub)
	r, err := o.f.runner(ctx, d, os.Stderr, bugs)
	if err != nil {
		return nil, "", runInfraError{err}
	}
	return r, d, nil
}

// closePass writes a pass's reports and tears its runner down.
func closePass(r *runner.Runner) (*reports.Results, error) {
	res, werr := r.WriteAll()
	if cerr := r.Close(); cerr != nil {
		fmt.Fprintln(os.Stderr, "warning: teardown:", cerr)
	}
	if werr != nil {
		return nil, fmt.Errorf("write reports: %w", werr)
	}
	return res, nil
}

// checkDeterminism replays the run's schedule as written to its
// results.json (the --replay path: the schedule read back and its cases
// rebuilt from the catalogue) into dir/determinism, then compares the two
// schedules and each case's decisions.
func (o *runCmd) checkDeterminism(ctx context.Context, res *reports.Results, dir string, workers int) (*reports.Determinism, error) {
	back, err := reports.Load(dir)
	if err != nil || back.Schedule == nil {
		return nil, runInfraError{fmt.Errorf("--check-determinism: read the recorded schedule back: %v", err)}
	}
	cases, err := suite.CasesOf(back.Schedule)
	if err != nil {
		return nil, runInfraError{fmt.Errorf("--check-determinism: %w", err)}
	}
	r2, d2, err := o.passRunner(ctx, dir, "determinism")
	if err != nil {
		return nil, err
	}
	order := suite.OrderOf(back.Schedule)
	s2 := suite.BuildSchedule(r2, cases, suite.ScheduleMeta{Filter: o.filter, Shard: o.shard, Workers: workers, Repeat: o.repeat, Lazyfs: o.f.lazyfs, Order: order})
	fmt.Fprintf(os.Stderr, "vmchaos run --check-determinism: second pass of %d case(s) → %s\n", len(cases), d2)
	o.f.meter.Start("determinism", len(cases), workers)
	var runErr error
	if workers > 1 {
		runErr = suite.RunScheduled(ctx, r2, cases, order, workers, d2, o.f.seed)
	} else {
		for _, c := range cases {
			if ctx.Err() != nil {
				break
			}
			r2.RunCase(ctx, c)
		}
	}
	o.f.meter.Stop()
	r2.Results().Schedule = s2
	res2, err := closePass(r2)
	if err != nil || runErr != nil {
		return nil, runInfraError{fmt.Errorf("--check-determinism: second pass: %v %v", err, runErr)}
	}
	if ctx.Err() != nil {
		return nil, runInfraError{fmt.Errorf("--check-determinism: interrupted: %w", ctx.Err())}
	}
	d := reports.CompareRuns(res.Schedule, s2, res.Cases, res2.Cases, suite.FracCases(cases))
	d.SecondRun = "determinism"
	return d, nil
}

// reproCheck runs each failing case o.sf.reproCheck more times into
// dir/repro-check (each rerun on a fresh stack, in a case dir of its own:
// the `repro --count` machinery) and records its reproduction rate.
func (o *runCmd) reproCheck(ctx context.Context, w io.Writer, res *reports.Results, cases []scenarios.Case, dir string) error {
	byID := map[string]scenarios.Case{}
	for _, c := range cases {
		byID[c.ID] = c
	}
	var failing []int
	for i, c := range res.Cases {
		if _, ok := byID[c.ID]; ok && c.Verdict == reports.Fail {
			failing = append(failing, i)
		}
	}
	if len(failing) == 0 {
		fmt.Fprintln(w, "repro-check: no failing case to rerun")
		return nil
	}
	n := o.sf.reproCheck
	r2, _, err := o.passRunner(ctx, dir, "repro-check")
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "vmchaos run --repro-check %d: %d failing case(s) → %s\n", n, len(failing), filepath.Join(dir, "repro-check"))
	o.f.meter.Start("repro-check", n*len(failing), 1)
	for _, i := range failing {
		cs := byID[res.Cases[i].ID]
		var runs []reports.Case
		for k := 0; k < n && ctx.Err() == nil; k++ {
			runs = append(runs, r2.RunCase(ctx, nthRun(cs, k, n)))
		}
		rate := reports.MeasureRepro(res.Cases[i], runs, n)
		rate.Dir = "repro-check"
		if rate.Low() {
			rate.Suggest = parkSuggestion(cs, res.Cases[i], runs)
		}
		res.Cases[i].ReproRate = rate
		fmt.Fprintf(w, "repro-check %s: %s reproduced %s\n", cs.ID, rate.Label(), rate.Outcome)
	}
	o.f.meter.Stop()
	if _, err := closePass(r2); err != nil {
		return err
	}
	return nil
}

// parkSuggestion names the park point that pins a failure, where one
// exists: the phase the failing runs' fault landed in most often, as a
// catalogue case that parks its fault kind there, or else as a trigger
// when that phase is a failpoint the harness can park at.
func parkSuggestion(cs scenarios.Case, orig reports.Case, reruns []reports.Case) string {
	if len(cs.Scenario.Faults) == 0 {
		return ""
	}
	f := cs.Scenario.Faults[0]
	if p, ok := strings.CutPrefix(f.Trigger, "park "); ok {
		return fmt.Sprintf("none needed: the case already parks at %s, so what varies is not where its fault lands", p)
	}
	want := reports.Outcome(orig)
	count := map[string]int{}
	best := ""
	for _, c := range append([]reports.Case{orig}, reruns...) {
		if reports.Outcome(c) != want || c.LandedPhase == "" {
			continue
		}
		count[c.LandedPhase]++
		if count[c.LandedPhase] > count[best] {
			best = c.LandedPhase
		}
	}
	if best == "" {
		return "none: no failing run recorded the phase its fault landed in"
	}
	if id := parkCase(best, f.Kind); id != "" {
		return fmt.Sprintf("park %s (%d failing run(s) landed there): `vmchaos repro --scenario %s`", best, count[best], id)
	}
	for _, p := range failpoint.Catalogue {
		if p.Name == best {
			return fmt.Sprintf("park %s (%d failing run(s) landed there): trigger \"park %s\" with fault %s; no catalogue case parks %s there yet", best, count[best], best, f.Kind, f.Kind)
		}
	}
	return fmt.Sprintf("none: the failing runs landed in %q, not a failpoint the harness can park at", best)
}

// parkCase is the catalogue case that parks fault kind at point: a plain
// one (that fault alone, released at once) before one with more to it.
func parkCase(point, kind string) string {
	first := ""
	for i := range scenarios.Catalogue {
		s := &scenarios.Catalogue[i]
		if len(s.Faults) == 0 || s.Faults[0].Trigger != "park "+point || s.Faults[0].Kind != kind {
			continue
		}
		if len(s.Faults) == 1 && s.Faults[0].ReleaseAfter == "" && s.Faults[0].ReleaseAfterChild == "" {
			return s.ID
		}
		if first == "" {
			first = s.ID
		}
	}
	return first
}

// newReportScheduleDiffCmd is `vmchaos report schedule-diff A B`: the
// differences between the schedules two runs recorded (a run and its
// --replay: none).
func newReportScheduleDiffCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "schedule-diff RUN_DIR|results.json RUN_DIR|results.json",
		Short: "List the differences between the schedules two runs recorded (exit 1 when they differ)",
		Example: `  vmchaos run --label-filter speed:fast --time-scale 0.05 --report-dir a
  vmchaos run --replay a --report-dir b
  vmchaos report schedule-diff a b`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s [2]*reports.Schedule
			for i, a := range args {
				res, err := reports.Load(a)
				if err != nil {
					return reports.InfraError{Err: err}
				}
				if res.Schedule == nil {
					return reports.InfraError{Err: fmt.Errorf("%s records no schedule", a)}
				}
				s[i] = res.Schedule
			}
			diff := reports.DiffSchedules(s[0], s[1])
			for _, l := range diff {
				fmt.Fprintln(cmd.OutOrStdout(), l)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "schedule-diff: %d case(s) vs %d, %d difference(s)\n", len(s[0].Cases), len(s[1].Cases), len(diff))
			if len(diff) > 0 {
				return &reports.GateError{Code: reports.GateFail}
			}
			return nil
		},
	}
}
