package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/progress"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
	"github.com/vmchaos/vmchaos/scenarios/suite"
)

func init() { register(newRunCmd) }

// runFlags are the flags every case-running subcommand shares.
type runFlags struct {
	backend    string
	supervisor string
	scale      float64
	seed       int64
	// agentCocoon: the agent cases run with their agent over this cocoon
	// binary (`--manager cocoon --manager-bin P` and an agent-case filter)
	agentCocoon string
	reportDir   string
	repeat      int             // run only: --repeat
	lazyfs      bool            // every case's durable dirs on lazyfs (overhead figure)
	stackFS     string          // --stack-fs
	meter       *progress.Meter // made by runner(); Start/Stop around the cases
}

func (f *runFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&f.backend, "backend", "fake", "stack backend: fake (bundled fakech) or real (cloud-hypervisor on KVM)")
	c.Flags().StringVar(&f.supervisor, "supervisor", "auto", "supervisor of the agent unit: auto|sandbox|builtin|systemd (auto: first that works here)")
	c.Flags().Float64Var(&f.scale, "time-scale", 1, "multiply every simulated duration and stack timer by this (0.05 = 20x faster)")
	c.Flags().Int64Var(&f.seed, "seed", 1, "seed of the run (fakech timing jitter, case order); recorded in every repro command")
	c.Flags().BoolVar(&f.lazyfs, "lazyfs", false, "run every case's stack with its durable dirs on lazy filesystems, as power-cut cases always do (what lazyfs costs: compare the wall time without it)")
	c.Flags().StringVar(&f.stackFS, "stack-fs", "auto", "where the stacks' files live: tmpfs (a tmpfs of the run's own, unmounted at the end; needs root), disk (the temp dir) or auto (tmpfs for the fake backend when root, else disk). Verdicts are the same: power-cut cases judge durability on lazyfs either way")
	c.Flags().StringVar(&f.reportDir, "report-dir", "", "run dir for results.json, junit.xml, ginkgo.json, report.md/html and logs (default ./vmchaos-results/<run-id>)")
}

func (f *runFlags) dir(kind string) string {
	if f.reportDir != "" {
		return f.reportDir
	}
	return filepath.Join("vmchaos-results", fmt.Sprintf("%s-%s-s%d", kind, time.Now().UTC().Format("20060102-150405"), f.seed))
}

// regressFromEnv reads VMCHAOS_REGRESS for a run (selftest sets it per case).
func regressFromEnv() ([]string, error) {
	return regress.Parse(os.Getenv(regress.Env))
}

func (f *runFlags) runner(ctx context.Context, dir string, out io.Writer, bugs []string) (*runner.Runner, error) {
	if !(f.scale > 0 && f.scale <= 1000) { // written so NaN fails too
		return nil, fmt.Errorf("--time-scale %v: want a number in (0, 1000]", f.scale)
	}
	f.meter = progress.New(out)
	return runner.New(ctx, runner.Options{ReportDir: dir, Backend: f.backend, Supervisor: f.supervisor,
		Scale: f.scale, Seed: f.seed, Regress: bugs, Progress: f.meter, Done: f.meter.Case, Repeat: f.repeat,
		Lazyfs: f.lazyfs, StackFS: f.stackFS, AgentCocoon: f.agentCocoon})
}

// signalContext cancels on SIGINT/SIGTERM so a run tears its stacks down.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// runCmd holds run's flags: the shared runFlags, the manager-layer flags and
// run's own.
type runCmd struct {
	f             runFlags
	mf            managerFlags
	filter, shard string
	parallel      string // --parallel: auto or N (suite.ParseParallel)
	repeat        int
	list          bool
	load          string
	maxInjErr     time.Duration
	sf            scheduleFlags // --replay, --check-determinism, --repro-check (replay.go)
	caseTimes     string        // --case-times: auto, off or a file (sharedOrder)
	order         suite.Order   // the order the shared cases start in
}

func newRunCmd() *cobra.Command {
	var o runCmd
	c := &cobra.Command{
		Use:   "run",
		Short: "Run the scenario catalogue (or the cases a label filter selects) and write the reports",
		Long: `run executes catalogue cases against the bundled stack and writes results.json,
junit.xml, ginkgo.json, report.md and report.html plus every process log, the trace and the ledger
journal of each case into the run dir. One line per case goes to stderr as it finishes; the summary
and the report path to stdout. Exit status: 0 pass, 1 an invariant was violated, 2 inconclusive,
3 infrastructure error (reports.Gate).

With --parallel 1 the cases run one after the other through the Ginkgo suite of scenarios/suite
(run programmatically from this binary). Otherwise (the default, auto) the scheduler runs the cases
whose fault lands at an exact phase (park) or at steady state N at a time, and beside them, one after
the other, the cases whose fault lands by the clock (at, after-exit, offsets, sweep points, while-down,
window calibration): each of those has the machine to itself from its calibration's measured runs (or
its re-arm) until its faults are in. results.json records each case's class, the concurrency it ran
under and, for a timed case, the concurrency and time of its timed part and how long it waited for the machine (clock_concurrency, clock_ms, clock_wait_ms).`,
		Example: `  vmchaos run --label-filter speed:fast --time-scale 0.05
  vmchaos run --label-filter 'seed:001 && op:hibernate' --time-scale 0.05
  vmchaos run --list --label-filter 'fault:stop'
  vmchaos run --shard 2/4 --report-dir out/shard2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	o.add(c)
	return c
}

func (o *runCmd) add(c *cobra.Command) {
	o.f.add(c)
	c.Flags().DurationVar(&o.maxInjErr, "max-injection-error", 0, "exit 2 (inconclusive) when the p99 of |actual − requested| over the run's timed (at, after-exit) injections exceeds this, e.g. 1ms (default 0: off; see report gate)")
	o.mf.add(c)
	o.sf.add(c)
	c.Flags().StringVar(&o.filter, "label-filter", "", "Ginkgo label-filter expression over the case labels (backend:, op:, fault:, seed:, speed:), e.g. 'seed:001 && op:hibernate'")
	c.Flags().StringVar(&o.shard, "shard", "", "run only shard I of N of the selected cases (\"I/N\", deterministic hash split; join with `vmchaos report merge`)")
	c.Flags().StringVar(&o.parallel, "parallel", "auto", "shared cases run at once: auto (2.5 per CPU less one per CPU busy outside the run over the last second, at least 1, at most 5: 5 on an idle 2-CPU host, suite.AutoWorkers) or N; the timed part of a case with timed faults or a window calibration always runs alone. 1: sequential through Ginkgo, as before the scheduler. >1 (or auto): the scheduler of scenarios/suite, same ginkgo.json")
	c.Flags().StringVar(&o.caseTimes, "case-times", "auto", "start the shared cases shortest first by how long each took before, the long ones (over 1.5× the median) once the timed cases are done, longest first (the scheduler only: what keeps a long case from holding up the timed ones): auto (the "+reports.CaseTimesFile+" beside the run dir, which every run of a results root updates; catalogue order while it has none), off (catalogue order), or a case-times file or a results.json / run dir to take the durations from")
	c.Flags().BoolVar(&o.list, "list", false, "list the selected cases with their labels and exit")
	c.Flags().IntVar(&o.repeat, "repeat", 1, "run every case N times, each on a fresh stack; a case whose verdicts differ is reported flaky (not a pass). Composes with --shard, e.g. --repeat 5 --shard 1/2")
	c.Flags().StringVar(&o.load, "load", "", "run under a bounded CPU hog for the run's duration: cpu=N spins N cores (e.g. cpu=1), torn down with the run")
}

// run selects the cases, runs them (under the CPU hog of --load), writes
// the reports and returns the gate's verdict as the exit status.
func (o *runCmd) run(cmd *cobra.Command) error {
	f := &o.f
	cases, handled, err := o.routeAndSelect(cmd)
	if handled || err != nil {
		return err
	}
	if code, done := inPrivateMountNS(f, cases); done {
		os.Exit(code)
	}
	bugs, err := regressFromEnv()
	if err != nil {
		return err
	}
	if o.repeat < 1 {
		return fmt.Errorf("--repeat %d: want N >= 1", o.repeat)
	}
	workers, how, err := suite.ParseParallel(o.parallel)
	if err != nil {
		return err
	}
	hogs, err := runner.ParseLoad(o.load)
	if err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	dir := f.dir("run")
	f.repeat = o.repeat
	r, err := f.runner(ctx, dir, os.Stderr, bugs)
	if err != nil {
		return runInfraError{err}
	}
	// the hog runs for the run's duration and ends with it
	hog := runner.StartLoad(ctx, hogs)
	defer hog.Stop()
	r.Results().Parallel = how
	if f.agentCocoon != "" {
		if cases = r.CocoonAgentCases(cases); len(cases) == 0 {
			_, _ = o.writeReports(cmd, r, dir)
			return fmt.Errorf("no case of --label-filter %q can run with its agent over cocoon: see not_supported in %s/results.json", o.filter, dir)
		}
	}
	if o.order, err = o.sharedOrder(cases, dir, workers); err != nil {
		_ = r.Close()
		return err
	}
	if r.Results().Schedule, err = o.schedule(r, cases, workers); err != nil {
		_ = r.Close()
		return runInfraError{err}
	}
	runErr := o.runCases(ctx, r, cases, dir, workers)
	if spins := hog.Stop(); hogs > 0 && spins == 0 {
		fmt.Fprintln(os.Stderr, "warning: --load: the CPU hog never completed a spin round")
	}
	res, werr := o.writeReports(cmd, r, dir)
	if runErr != nil {
		return runErr
	}
	if werr != nil {
		return fmt.Errorf("write reports: %w", werr)
	}
	if err := o.afterRun(ctx, cmd, res, cases, dir, workers); err != nil {
		return err
	}
	gopt := reports.DefaultGateOptions()
	gopt.MaxInjectionError = o.maxInjErr
	return reports.Gate(res, nil, gopt).Err()
}

// routeAndSelect sends a manager-verb run to the manager runner (handled),
// marks agent cases over cocoon, and selects the run's cases (from --replay
// or the filter); with --list it prints them (handled).
func (o *runCmd) routeAndSelect(cmd *cobra.Command) (cases []scenarios.Case, handled bool, err error) {
	f := &o.f
	if o.mf.agentCases(o.filter) {
		if o.sf.set() || o.shard != "" || f.backend != "fake" {
			return nil, true, fmt.Errorf("the agent cases over cocoon run on the fake backend, without --shard, --replay, --check-determinism or --repro-check")
		}
		f.agentCocoon = o.mf.bin
	} else if o.mf.selected(o.filter) {
		if o.sf.set() {
			return nil, true, fmt.Errorf("--replay, --check-determinism and --repro-check run the agent catalogue's cases; the manager-verb cases of --manager/layer:manager record no schedule yet")
		}
		return nil, true, o.mf.run(cmd, o)
	}
	if o.sf.replay != "" {
		cases, err = o.applyReplay(cmd)
	} else {
		cases, err = selectCases(f.backend, o.filter, o.shard)
	}
	if err != nil {
		return nil, true, err
	}
	if o.list {
		return nil, true, listCases(cmd.OutOrStdout(), cases)
	}
	if len(cases) == 0 {
		return nil, true, fmt.Errorf("no case matches --label-filter %q (shard %q)", o.filter, o.shard)
	}
	return cases, false, nil
}

// runCases announces the run on stderr and runs the cases through the suite:
// through Ginkgo one at a time with one worker, else through the scheduler.
func (o *runCmd) runCases(ctx context.Context, r *runner.Runner, cases []scenarios.Case, dir string, workers int) error {
	f := &o.f
	sup := r.Supervisor()
	if note := r.SupervisorNote(); note != "" {
		sup += " (" + note + ")"
	}
	if fs := r.StackFS(); fs != "" {
		sup += ", stacks on " + fs
	}
	fmt.Fprintf(os.Stderr, "vmchaos run: %d case(s), backend %s, supervisor %s, time scale %g, seed %d, parallel %s%s → %s\n",
		len(cases), f.backend, sup, f.scale, f.seed, r.Results().Parallel, repeatLoadNote(o.repeat, o.load), dir)
	var runErr error
	f.meter.Start("run", len(cases), workers)
	if workers > 1 {
		switch {
		case o.sf.recorded != nil:
			fmt.Fprintf(os.Stderr, "vmchaos run: shared cases in the recorded order, %d of them after the timed cases\n", len(o.order.AfterLane))
		case o.order.Source != "":
			fmt.Fprintf(os.Stderr, "vmchaos run: shared cases shortest first by the durations in %s, %d long one(s) after the timed cases\n", o.order.Source, len(o.order.AfterLane))
		case o.caseTimes != "off":
			fmt.Fprintf(os.Stderr, "vmchaos run: shared cases in catalogue order: no durations recorded for them yet (%s)\n", caseTimesPath(dir))
		}
		runErr = suite.RunScheduled(ctx, r, cases, o.order, workers, dir, f.seed)
	} else {
		runErr = suite.Run(ctx, r, cases, o.filter, dir, f.seed)
		suite.Annotate(r.Results(), cases, nil)
	}
	f.meter.Stop()
	return runErr
}

// writeReports records the run's selection in its results, writes every
// report, tears the runner down and prints the summary.
func (o *runCmd) writeReports(cmd *cobra.Command, r *runner.Runner, dir string) (*reports.Results, error) {
	r.Results().Filter, r.Results().Shard = o.filter, o.shard
	if o.repeat > 1 {
		r.Results().Repeat = o.repeat
	}
	r.Results().Load = o.load
	res, werr := r.WriteAll()
	if cerr := r.Close(); cerr != nil {
		fmt.Fprintln(os.Stderr, "warning: teardown:", cerr)
	}
	if res != nil {
		res.Filter, res.Shard = o.filter, o.shard
		res.Dir = dir
		_ = reports.WriteAll(dir, res)
		reports.Summary(cmd.OutOrStdout(), res)
		o.recordCaseTimes(res, dir)
	}
	return res, werr
}

// sharedOrder is the order the run starts its shared cases in: a replay's
// as recorded, else by --case-times (suite.ByTimes), else catalogue order.
func (o *runCmd) sharedOrder(cases []scenarios.Case, dir string, workers int) (suite.Order, error) {
	classes := make([]suite.Class, len(cases))
	ids := make([]string, len(cases))
	for i, c := range cases {
		classes[i], _ = suite.Classify(c)
		ids[i] = c.ID
	}
	if o.sf.recorded != nil {
		return suite.OrderOf(o.sf.recorded), nil
	}
	if workers <= 1 || o.caseTimes == "off" {
		return suite.CatalogueOrder(classes), nil
	}
	if o.caseTimes == "auto" {
		// only a hint: a file that cannot be read costs the order, not the run
		path := caseTimesPath(dir)
		ct, err := reports.LoadCaseTimes(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "warning: shared cases in catalogue order:", err)
			return suite.CatalogueOrder(classes), nil
		}
		return suite.ByTimes(ids, classes, ct.Of(o.f.backend, o.f.scale), path), nil
	}
	path := o.caseTimes
	st, err := os.Stat(path)
	if err != nil {
		return suite.Order{}, fmt.Errorf("--case-times: %w", err)
	}
	if st.IsDir() || filepath.Base(path) == reports.ResultsFile {
		res, err := reports.Load(path)
		if err != nil {
			return suite.Order{}, fmt.Errorf("--case-times %s: %w", path, err)
		}
		return suite.ByTimes(ids, classes, reports.TimesOf(res), path), nil
	}
	ct, err := reports.LoadCaseTimes(path)
	if err != nil {
		return suite.Order{}, fmt.Errorf("--case-times: %w", err)
	}
	return suite.ByTimes(ids, classes, ct.Of(o.f.backend, o.f.scale), path), nil
}

// caseTimesPath is the case-times file of the results root run dir dir
// belongs to: beside it.
func caseTimesPath(dir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(dir)), reports.CaseTimesFile)
}

// recordCaseTimes merges the run's case durations into the case-times
// file beside its run dir, for the next run's order. A run with planted
// bugs or --repeat is not what the catalogue takes: it records nothing.
func (o *runCmd) recordCaseTimes(res *reports.Results, dir string) {
	if len(res.Regress) > 0 || o.repeat > 1 {
		return
	}
	if err := reports.RecordCaseTimes(caseTimesPath(dir), res); err != nil {
		fmt.Fprintln(os.Stderr, "warning: case times:", err)
	}
}

func repeatLoadNote(repeat int, load string) string {
	s := ""
	if repeat > 1 {
		s += fmt.Sprintf(", each case ×%d", repeat)
	}
	if load != "" {
		s += ", load " + load
	}
	return s
}

// selectCases expands the catalogue, applies the label filter and the shard.
func selectCases(backend, filter, shard string) ([]scenarios.Case, error) {
	all, err := scenarios.Expand(backend)
	if err != nil {
		return nil, err
	}
	cases, err := scenarios.Filter(all, filter)
	if err != nil {
		return nil, err
	}
	if shard == "" {
		return cases, nil
	}
	i, n, err := parseShard(shard)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(cases))
	for k, c := range cases {
		ids[k] = c.ID
	}
	keep := map[string]bool{}
	for _, id := range reports.Shard(ids, i, n) {
		keep[id] = true
	}
	var out []scenarios.Case
	for _, c := range cases {
		if keep[c.ID] {
			out = append(out, c)
		}
	}
	return out, nil
}

func parseShard(s string) (int, int, error) {
	a, b, ok := strings.Cut(s, "/")
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || n < 1 || i < 1 || i > n {
		return 0, 0, fmt.Errorf("--shard %q: want I/N with 1 <= I <= N", s)
	}
	return i, n, nil
}

func listCases(w io.Writer, cases []scenarios.Case) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tSEED\tFAULT\tLABELS\tTITLE")
	for _, c := range cases {
		var faults []string
		for _, f := range c.Scenario.Faults {
			faults = append(faults, f.Kind)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.ID, c.Scenario.SeedRef, strings.Join(faults, "+"), strings.Join(c.Labels, ","), c.Scenario.Title)
	}
	fmt.Fprintf(tw, "%d case(s)\n", len(cases))
	return tw.Flush()
}

// runInfraError is a harness failure before any case ran: exit 3.
type runInfraError struct{ err error }

func (e runInfraError) Error() string { return "infrastructure: " + e.err.Error() }
func (e runInfraError) ExitCode() int { return reports.GateInfra }
