package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/reports"
)

func init() { register(newReportCmd) }

func newReportCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "report",
		Short: "Judge, merge and re-render run results (results.json → gate exit code, junit.xml, report.md, report.html)",
		Long: `report works on the results of vmchaos runs. A run dir holds results.json (the source of
truth) and the junit.xml, report.md and report.html rendered from it.

  gate    exit 0 pass, 1 invariant violated or regression against a baseline,
          2 inconclusive, 3 infrastructure error
  merge   join the run dirs of CI shards (vmchaos run --shard I/N) into one report
  render  re-render junit.xml, report.md and report.html from results.json
  summary print the terminal summary of a run`,
	}
	c.AddCommand(newReportGateCmd(), newReportMergeCmd(), newReportRenderCmd(), newReportSummaryCmd(), newReportScheduleDiffCmd())
	return c
}

// gateFlags are `report gate`'s judging flags.
type gateFlags struct {
	tolerance, slack, acceptFile, minCoverage string
	flakyFails, allowNotRun                   bool
	maxInjErr                                 time.Duration
	accept                                    []string
}

// options turns the flags into the gate's options.
func (f *gateFlags) options(warn io.Writer) (reports.GateOptions, error) {
	opt := reports.DefaultGateOptions()
	var err error
	if opt.P95Tolerance, err = parseTolerance(f.tolerance); err != nil {
		return opt, err
	}
	if f.slack != "" {
		d, err := time.ParseDuration(f.slack)
		if err != nil || d < 0 {
			return opt, fmt.Errorf("--p95-slack %q: want a duration such as 50ms", f.slack)
		}
		opt.P95SlackMs = float64(d) / float64(time.Millisecond)
	}
	opt.FlakyFails, opt.AllowNotRun = f.flakyFails, f.allowNotRun
	opt.MaxInjectionError = f.maxInjErr
	if opt.MinCoverage, err = parseMinCoverage(f.minCoverage); err != nil {
		return opt, err
	}
	opt.Accept, err = acceptSet(f.accept, f.acceptFile, warn)
	return opt, err
}

func newReportGateCmd() *cobra.Command {
	var baseline, stepSummary string
	var f gateFlags
	c := &cobra.Command{
		Use:   "gate [--baseline results.json] [--p95-tolerance 20%] [--accept CASE:INVARIANT,...] [--min-coverage P] RUN_DIR|results.json",
		Short: "Decide a release from a run: exit 0 pass, 1 violated/regressed, 2 inconclusive, 3 infrastructure error",
		Long: `gate reads a run's results.json and exits with:
  0  every case passed
  1  an invariant was violated; or, with --baseline, a case that passed in the baseline
     fails now, or convergence p95 (over the cases converged in both runs) grew beyond
     --p95-tolerance (+ --p95-slack)
  2  a case is inconclusive (its fault did not land where intended), a selected case
     was not run (a missing binary or host feature, listed "NOT RUN"; --allow-not-run
     lets those alone pass, still listed and never counted as passed), the run has no
     cases, a merged run lacks shards, or (--max-injection-error) the p99 of its
     injection errors exceeds the bound
     (--min-coverage) the run's phase coverage is below the bound, or it has no map
  3  a case is a harness error, or the results cannot be read
When several apply the most severe wins: 1, then 3, then 2. Every reason is printed,
one line each, with the repro command of the case.`,
		Example: `  vmchaos report gate vmchaos-results/fast
  vmchaos report gate --baseline last-release/results.json --p95-tolerance 25% run/results.json
  vmchaos report gate --step-summary "$GITHUB_STEP_SUMMARY" vmchaos-results/nightly`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opt, err := f.options(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			cur, err := reports.Load(args[0])
			if err != nil {
				return reports.InfraError{Err: err}
			}
			var base *reports.Results
			if baseline != "" {
				if base, err = reports.Load(baseline); err != nil {
					return reports.InfraError{Err: fmt.Errorf("baseline: %w", err)}
				}
			}
			g := reports.Gate(cur, base, opt)
			fmt.Fprintln(cmd.OutOrStdout(), g.String())
			if cur.Coverage != nil {
				fmt.Fprintln(cmd.OutOrStdout(), cur.Coverage)
			}
			if stepSummary != "" {
				if err := appendFile(stepSummary, reports.MarkdownSummary(cur, g, 30)); err != nil {
					return reports.InfraError{Err: fmt.Errorf("--step-summary: %w", err)}
				}
			}
			return g.Err()
		},
	}
	c.Flags().StringVar(&baseline, "baseline", "", "results.json (or run dir) of a known-good run to compare against (default: none)")
	c.Flags().StringVar(&f.tolerance, "p95-tolerance", "20%", `allowed growth of convergence p95 against the baseline: "20%", a fraction "0.2", or "off"`)
	c.Flags().StringVar(&f.slack, "p95-slack", "", "absolute p95 growth always allowed on top of the tolerance, e.g. 50ms (default: none)")
	c.Flags().BoolVar(&f.flakyFails, "flaky-fails", false, "count a case that passed only after retries as failed")
	c.Flags().DurationVar(&f.maxInjErr, "max-injection-error", 0, "call the run inconclusive when the p99 of |actual − requested| over its timed (at, after-exit) injections exceeds this, e.g. 1ms (default 0: off)")
	c.Flags().StringSliceVar(&f.accept, "accept", nil, "known findings as CASE:INVARIANT pairs (listed as ACCEPTED, not failing the gate; another invariant failing in that case still fails it), e.g. mgr-clone-kill-at-ch.restore.begin:one-vm-per-name; a bare case id accepts any invariant of the case and warns (default: none)")
	c.Flags().StringVar(&f.minCoverage, "min-coverage", "", `fail the gate (exit 1) when the run's phase coverage (applicable operation × point × fault-kind cells landed, not-runnable ones counted) is below this, e.g. "80%" or "80" (default: off)`)
	c.Flags().BoolVar(&f.allowNotRun, "allow-not-run", false, "let cases the host could not run (results.json not_run: a missing binary or host feature) pass the gate; they are still listed and never counted as passed")
	c.Flags().StringVar(&f.acceptFile, "accept-file", "", "file of accepted findings, CASE:INVARIANT one per line, # comments (default: none)")
	c.Flags().StringVar(&stepSummary, "step-summary", "", `append a compact Markdown verdict (reasons, cases needing attention, repro commands) to this file, e.g. "$GITHUB_STEP_SUMMARY" (default: none)`)
	return c
}

// appendFile appends text to path (created if missing), as CI job-summary
// files expect: every step adds its part.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// parseTolerance reads "20%", a fraction up to 1 such as "0.2", or "off"
// (disabled, as -1).
func parseTolerance(s string) (float64, error) {
	s = strings.TrimSpace(s)
	if s == "off" || s == "none" {
		return -1, nil
	}
	pct := strings.HasSuffix(s, "%")
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil || v < 0 || v != v {
		return 0, fmt.Errorf(`--p95-tolerance %q: want a percentage like "20%%", a fraction like 0.2, or "off"`, s)
	}
	if pct {
		return v / 100, nil
	}
	if v > 1 {
		// "20" is ambiguous (20 % or 2000 %?); make the user say which.
		return 0, fmt.Errorf(`--p95-tolerance %q: a bare number is a fraction (0.2 = 20%%); write "%g%%" for a percentage`, s, v)
	}
	return v, nil
}

func newReportMergeCmd() *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "merge -o OUT_DIR SHARD_DIR...",
		Short: "Join the results of CI shards into one run dir with one report",
		Long: `merge loads results.json from each shard's run dir, refuses shards of different backend,
time scale, seed, label filter or regress switches, and overlapping shards, and writes one
results.json, junit.xml, report.md and report.html into OUT_DIR, plus ginkgo.json holding
every shard's Ginkgo suite report. Log links are rewritten
to point into the shard dirs. Shards missing from an I/N set are recorded, and the gate
then says inconclusive. Merge itself exits 0 whatever the verdicts; run gate on OUT_DIR.`,
		Example: `  vmchaos report merge -o merged shard-1 shard-2 shard-3
  vmchaos report gate merged`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("merge: -o OUT_DIR is required")
			}
			outAbs, err := filepath.Abs(out)
			if err != nil {
				return reports.InfraError{Err: fmt.Errorf("merge: %w", err)}
			}
			for _, dir := range args {
				// Writing into a shard's own dir would replace that
				// shard's results.json with the merge.
				if a, err := filepath.Abs(dir); err == nil && (a == outAbs || a == filepath.Join(outAbs, reports.ResultsFile)) {
					return reports.InfraError{Err: fmt.Errorf("merge: -o %s is one of the shards; write the merge elsewhere", out)}
				}
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return reports.InfraError{Err: fmt.Errorf("merge: %w", err)}
			}
			var rs []*reports.Results
			for _, dir := range args {
				r, err := reports.Load(dir)
				if err != nil {
					return reports.InfraError{Err: fmt.Errorf("merge: %w", err)}
				}
				if err := reports.RebaseLogs(r, r.Dir, out); err != nil {
					return reports.InfraError{Err: fmt.Errorf("merge: %w", err)}
				}
				rs = append(rs, r)
			}
			m, err := reports.Merge(rs...)
			if err != nil {
				return reports.InfraError{Err: err}
			}
			if err := reports.WriteAll(out, m); err != nil {
				return reports.InfraError{Err: err}
			}
			noGinkgo, err := reports.MergeGinkgo(out, args)
			if err != nil {
				return reports.InfraError{Err: fmt.Errorf("merge: %w", err)}
			}
			for _, d := range noGinkgo {
				fmt.Fprintf(cmd.ErrOrStderr(), "merge: %s has no %s; the merged one lacks that shard's suite report\n", d, reports.GinkgoFile)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "merged %d result set(s) into %s\n", len(rs), out)
			reports.Summary(cmd.OutOrStdout(), m)
			return nil
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "run dir to write the merged results and reports into (required; created if missing)")
	return c
}

func newReportRenderCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "render RUN_DIR",
		Short: "Re-render junit.xml, report.md and report.html from a run's results.json",
		Long: `render rebuilds the reports of a run dir from its results.json (left untouched), e.g.
after a runner was killed before it rendered, or to get the current report layout.`,
		Example: `  vmchaos report render vmchaos-results/chaos-20261130-020000`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := reports.Load(args[0])
			if err != nil {
				return reports.InfraError{Err: err}
			}
			if err := reports.Render(r.Dir, r); err != nil {
				return reports.InfraError{Err: err}
			}
			reports.Summary(cmd.OutOrStdout(), r)
			return nil
		},
	}
}

func newReportSummaryCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "summary RUN_DIR|results.json",
		Short:   "Print the terminal summary of a run: counts per verdict, convergence, each problem with its repro",
		Example: `  vmchaos report summary vmchaos-results/fast`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := reports.Load(args[0])
			if err != nil {
				return reports.InfraError{Err: err}
			}
			reports.Summary(cmd.OutOrStdout(), r)
			return nil
		},
	}
}

// parseMinCoverage reads --min-coverage: a percentage in (0, 100], "%"
// optional ("" = off).
func parseMinCoverage(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "%"), 64)
	if err != nil || v <= 0 || v > 100 {
		return 0, fmt.Errorf("--min-coverage %q: want a percentage in (0, 100], e.g. 80%%", s)
	}
	return v, nil
}
