package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/progress"
	"github.com/vmchaos/vmchaos/reports"
)

func init() { register(newBenchChaosCmd) }

// benchChaosCmd holds bench-chaos's flags: what both runs share.
type benchChaosCmd struct {
	filter, backend, supervisor, parallel, dir, shard string
	caseTimes                                         string
	scale                                             float64
	seed                                              int64
}

func newBenchChaosCmd() *cobra.Command {
	var o benchChaosCmd
	c := &cobra.Command{
		Use:   "bench-chaos",
		Short: "Run the same cases sequentially and through the scheduler, and compare wall time and verdicts",
		Long: `bench-chaos runs ` + "`vmchaos run`" + ` twice with this binary, on the same selection, seed and time
scale: first --parallel 1 (one case at a time, through Ginkgo), then --parallel as given (default auto:
the scheduler, the timed part of a timed case alone, the rest N at a time). --parallel takes a comma
list (2,3: one scheduled run per value, each compared with the one sequential run), to choose N on a
machine with the same sequential baseline. --shard I/N runs only that hash shard of the selection in
every run (a representative sample of it, to compare --parallel values in a fraction of the time). Each run writes its own run dir under --report-dir
(sequential/, scheduled/, or scheduled-<N>/ for a list) and its output to <name>.log beside it. It
prints each run's wall time, cases per minute, CPU time (the run and every process of its stacks it
reaped: user+sys) and the cores that is on average, verdicts and the load average before it, and every
case whose verdict differs from the sequential run's (reports.Stability over both runs, plus cases
only one run has). Like any run, the sequential one records its cases' durations in case-times.json
beside its run dir, and a scheduled run starts its shared cases shortest first by them (run
--case-times; --case-times off here: catalogue order, as in a results root no run has left that file).
Exit status: 0 no verdict differs, 1 a verdict differs, 3 a run left no results.`,
		Example: `  vmchaos bench-chaos --label-filter speed:fast --time-scale 0.05
  BENCH_FILTER=speed:fast make bench-chaos
  BENCH_PARALLEL=2,3 make bench-chaos
  vmchaos bench-chaos --shard 1/8 --parallel 2,3,4 --time-scale 0.05`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd.OutOrStdout()) },
	}
	c.Flags().StringVar(&o.filter, "label-filter", "!speed:nightly", "label filter of both runs")
	c.Flags().StringVar(&o.backend, "backend", "fake", "stack backend of both runs")
	c.Flags().StringVar(&o.supervisor, "supervisor", "auto", "supervisor of both runs")
	c.Flags().StringVar(&o.parallel, "parallel", "auto", "--parallel of the scheduled run (the other is 1); a comma list: one scheduled run per value")
	c.Flags().Float64Var(&o.scale, "time-scale", 0.05, "time scale of both runs")
	c.Flags().Int64Var(&o.seed, "seed", 1, "seed of both runs")
	c.Flags().StringVar(&o.shard, "shard", "", "run only shard I of N of the selection in every run (\"I/N\", vmchaos run's hash split), e.g. 1/8")
	c.Flags().StringVar(&o.dir, "report-dir", "", "dir of both run dirs (default ./vmchaos-results/bench-chaos-<time>)")
	c.Flags().StringVar(&o.caseTimes, "case-times", "auto", "--case-times of the scheduled runs: auto (the durations the runs before it left in the report dir: the sequential run's), off (catalogue order) or a file")
	return c
}

// benchRun is one of the two runs as bench-chaos saw it.
type benchRun struct {
	Name, Dir, Parallel string
	Wall                time.Duration
	// CPU is the run's user+sys and its reaped descendants' (wait4's
	// rusage of the child: the stacks' processes are reaped by the run,
	// the builtin supervisor's subreaper, or a child it waited for).
	CPU        time.Duration
	LoadBefore string
	Exit       int // vmchaos run's exit status (the gate's: 0..3)
	Res        *reports.Results
}

func (o *benchChaosCmd) run(out io.Writer) error {
	dir := o.dir
	if dir == "" {
		dir = filepath.Join("vmchaos-results", "bench-chaos-"+time.Now().UTC().Format("20060102-150405"))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return reports.InfraError{Err: fmt.Errorf("bench-chaos: %w", err)}
	}
	self, err := os.Executable()
	if err != nil {
		return reports.InfraError{Err: fmt.Errorf("bench-chaos: own binary: %w", err)}
	}
	runs, err := benchRuns(o.parallel)
	if err != nil {
		return err
	}
	for _, r := range runs {
		r.Dir = filepath.Join(dir, r.Name)
		fmt.Fprintf(os.Stderr, "bench-chaos: %s run (--parallel %s) → %s (output in %s.log)\n", r.Name, r.Parallel, r.Dir, r.Dir)
		if err := o.runOnce(self, r); err != nil {
			return reports.InfraError{Err: fmt.Errorf("bench-chaos: %s run: %w", r.Name, err)}
		}
		fmt.Fprintf(os.Stderr, "bench-chaos: %s run: %s, exit %d\n", r.Name, progress.Round(r.Wall), r.Exit)
	}
	cmps := make([]benchComparison, len(runs)-1)
	n := 0
	for i, r := range runs[1:] {
		cmps[i] = compareBench(runs[0].Res, r.Res)
		n += len(cmps[i].Differ) + len(cmps[i].OnlyIn)
	}
	writeBench(out, o.filter, o.scale, runs, cmps)
	if n > 0 {
		return benchError{fmt.Sprintf("%d case verdict(s) differ between the sequential and the scheduled run(s)", n)}
	}
	return nil
}

// benchRuns is the sequential run and one scheduled run per value of a
// comma list of --parallel values ("scheduled" alone, "scheduled-<v>" each
// for a list).
func benchRuns(parallel string) ([]*benchRun, error) {
	runs := []*benchRun{{Name: "sequential", Parallel: "1"}}
	vals := strings.Split(parallel, ",")
	for _, v := range vals {
		v = strings.TrimSpace(v)
		if v == "" || (v != "auto" && !positive(v)) {
			return nil, fmt.Errorf("bench-chaos: --parallel %q: want auto, a number >= 1, or a comma list of them", parallel)
		}
		name := "scheduled"
		if len(vals) > 1 {
			name += "-" + v
		}
		runs = append(runs, &benchRun{Name: name, Parallel: v})
	}
	return runs, nil
}

func positive(v string) bool {
	n, err := strconv.Atoi(v)
	return err == nil && n >= 1
}

// runOnce runs `vmchaos run` once as a child (Ginkgo allows one suite run
// per process) and loads its results; a run that fails its gate still
// counts, a run with no results.json is an error.
func (o *benchChaosCmd) runOnce(self string, r *benchRun) error {
	args := o.runArgs(r)
	log, err := os.Create(r.Dir + ".log")
	if err != nil {
		return err
	}
	defer log.Close()
	c := exec.Command(self, args...)
	c.Stdout, c.Stderr = log, log
	r.LoadBefore = loadAvg()
	t0 := time.Now()
	err = c.Run()
	r.Wall = time.Since(t0)
	if c.ProcessState != nil {
		r.CPU = c.ProcessState.UserTime() + c.ProcessState.SystemTime()
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.Exit = ee.ExitCode()
	case err != nil:
		return fmt.Errorf("vmchaos %s: %w", strings.Join(args, " "), err)
	}
	r.Res, err = reports.Load(r.Dir)
	if err != nil {
		return fmt.Errorf("exit %d, see %s.log: %w", r.Exit, r.Dir, err)
	}
	return nil
}

// runArgs is the `vmchaos run` command line of run r: the same
// selection (filter, shard), seed and scale in every run, r's --parallel.
func (o *benchChaosCmd) runArgs(r *benchRun) []string {
	args := []string{"run", "--label-filter", o.filter, "--backend", o.backend, "--supervisor", o.supervisor,
		"--time-scale", strconv.FormatFloat(o.scale, 'g', -1, 64), "--seed", strconv.FormatInt(o.seed, 10),
		"--parallel", r.Parallel, "--report-dir", r.Dir}
	if r.Parallel != "1" && o.caseTimes != "" {
		args = append(args, "--case-times", o.caseTimes)
	}
	if o.shard != "" {
		args = append(args, "--shard", o.shard)
	}
	return args
}

// loadAvg is /proc/loadavg's three averages, or "?" where it cannot be read.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if err != nil || len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// benchComparison is what differs between the sequential and the scheduled
// run of the same selection.
type benchComparison struct {
	Differ []string // "id: pass×1, inconclusive×1" (reports.Stability's flips)
	OnlyIn []string // "id: only in sequential"
}

// compareBench compares the verdicts of two runs of the same selection.
func compareBench(seq, sched *reports.Results) benchComparison {
	var c benchComparison
	c.Differ = reports.Stability(seq, sched).Flipped
	in := func(r *reports.Results) map[string]bool {
		m := map[string]bool{}
		for _, k := range r.Cases {
			m[k.ID] = true
		}
		return m
	}
	a, b := in(seq), in(sched)
	for _, k := range seq.Cases {
		if !b[k.ID] {
			c.OnlyIn = append(c.OnlyIn, k.ID+": only in sequential")
		}
	}
	for _, k := range sched.Cases {
		if !a[k.ID] {
			c.OnlyIn = append(c.OnlyIn, k.ID+": only in scheduled")
		}
	}
	return c
}

// writeBench prints the table of the runs, and each scheduled run's wall
// time against the sequential one and its verdict differences (cmps[i]
// is runs[i+1]'s).
func writeBench(w io.Writer, filter string, scale float64, runs []*benchRun, cmps []benchComparison) {
	fmt.Fprintf(w, "bench-chaos: label filter %q, time scale %g\n", filter, scale)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tCASES\tWALL\tCASES/MIN\tCPU\tCORES\tVERDICTS\tPARALLEL\tLOAD BEFORE\tEXIT")
	for _, r := range runs {
		n := len(r.Res.Cases)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f\t%s\t%.2f\t%s\t%s\t%s\t%d\n", r.Name, n, progress.Round(r.Wall), perMinute(n, r.Wall),
			progress.Round(r.CPU), cores(r.CPU, r.Wall), reports.CountVerdicts(r.Res.Cases), orDash(r.Res.Parallel), r.LoadBefore, r.Exit)
	}
	_ = tw.Flush()
	for i, r := range runs[1:] {
		if i >= len(cmps) {
			break
		}
		if runs[0].Wall > 0 {
			fmt.Fprintf(w, "%s wall time: %.0f%% of sequential (×%.2f)\n", r.Name,
				100*r.Wall.Seconds()/runs[0].Wall.Seconds(), runs[0].Wall.Seconds()/max(r.Wall.Seconds(), 1e-9))
		}
		if held, waited := clockHeld(r.Res); held > 0 {
			// with n places the run is at least (case time + (n-1)·held)/n:
			// the timed parts leave n-1 places empty, and so do the drains
			// before them
			fmt.Fprintf(w, "%s: alone cases' timed parts held the machine %s in all (serial time), after waiting %s in all for the cases in flight to drain\n",
				r.Name, progress.Round(held), progress.Round(waited))
		}
		cmp := cmps[i]
		prefix := ""
		if len(runs) > 2 {
			prefix = r.Name + " "
		}
		fmt.Fprintf(w, "%sverdict differences: %d\n", prefix, len(cmp.Differ)+len(cmp.OnlyIn))
		for _, d := range append(append([]string{}, cmp.Differ...), cmp.OnlyIn...) {
			fmt.Fprintln(w, "  "+d)
		}
	}
}

// clockHeld is the time the run's alone cases held the machine for their
// timed parts (results.json clock_ms), and the time they waited for it
// (clock_wait_ms).
func clockHeld(res *reports.Results) (held, waited time.Duration) {
	var ms, wms float64
	for _, c := range res.Cases {
		ms += c.ClockMs
		wms += c.ClockWaitMs
	}
	return time.Duration(ms * float64(time.Millisecond)), time.Duration(wms * float64(time.Millisecond))
}

// cores is the CPU a run used per second of its wall time.
func cores(cpu, wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return cpu.Seconds() / wall.Seconds()
}

func perMinute(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Minutes()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// benchError is a verdict difference: exit 1.
type benchError struct{ msg string }

func (e benchError) Error() string { return "bench-chaos: " + e.msg }
func (e benchError) ExitCode() int { return 1 }
