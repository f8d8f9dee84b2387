package reports

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// Gate exit codes (docs/architecture.md §12).
const (
	GatePass         = 0
	GateFail         = 1 // an invariant was violated, or a regression against the baseline
	GateInconclusive = 2 // some fault did not land as intended; nothing proven either way
	GateInfra        = 3 // the harness failed; the run cannot be trusted
)

// GateOptions tunes the release gate.
type GateOptions struct {
	// P95Tolerance is the allowed relative growth of convergence p95 against
	// the baseline (0.2 = 20 %). Negative disables the check.
	P95Tolerance float64
	// P95SlackMs is an absolute growth always allowed on top of the relative
	// tolerance, so that a 40 ms → 60 ms wobble of a tiny p95 is not a
	// regression. 0 means none.
	P95SlackMs float64
	// FlakyFails makes a case that needed retries count as failed.
	FlakyFails bool
	// MaxInjectionError, when > 0, makes a run whose injection error p99
	// (|actual − requested| over every measured injection) exceeds it
	// inconclusive.
	MaxInjectionError time.Duration
	// Accept holds the known findings (typically against a third-party
	// manager) as CASE:INVARIANT pairs (accept.go): a failure whose every
	// violated invariant is accepted is listed as ACCEPTED and does not
	// fail the gate, nor does its regression against the baseline; any
	// other invariant failing in that case still does.
	Accept AcceptSet
	// MinCoverage, when > 0, fails the gate (exit 1) when the run's phase
	// coverage (percent of the applicable cells) is below it, or the run
	// has no (current) coverage map.
	MinCoverage float64
	// AllowNotRun lets a run whose not-run cases (Results.NotRun: a missing
	// binary or host feature) are its only shortfall exit 0: they are still
	// listed (NOT RUN) and never counted as passed.
	AllowNotRun bool
}

// DefaultGateOptions is what `vmchaos report gate` uses without flags.
func DefaultGateOptions() GateOptions { return GateOptions{P95Tolerance: 0.20} }

// GateResult is the gate's decision. Lines explain every reason that
// contributed to Code, most severe first, and end with a one-line tally.
type GateResult struct {
	Code  int
	Lines []string
}

// Err returns nil for a pass, else an error whose ExitCode is the gate code
// (cmd/vmchaos turns it into the process exit status).
func (g GateResult) Err() error {
	if g.Code == GatePass {
		return nil
	}
	return &GateError{Code: g.Code}
}

// String joins the lines.
func (g GateResult) String() string { return strings.Join(g.Lines, "\n") }

// GateError carries a gate exit code.
type GateError struct{ Code int }

func (e *GateError) Error() string {
	return fmt.Sprintf("gate: %s (exit %d)", GateCodeName(e.Code), e.Code)
}

// ExitCode is the process exit status.
func (e *GateError) ExitCode() int { return e.Code }

// GateCodeName names a gate code.
func GateCodeName(code int) string {
	switch code {
	case GatePass:
		return "pass"
	case GateFail:
		return "invariant violated"
	case GateInconclusive:
		return "inconclusive"
	case GateInfra:
		return "infrastructure error"
	}
	return fmt.Sprintf("code %d", code)
}

// severity orders gate codes: a violated invariant is proof of a product bug
// whatever else happened, so it wins; an infrastructure error means part of
// the run is untrustworthy, which is worse than a fault that missed its phase.
func severity(code int) int {
	switch code {
	case GateFail:
		return 3
	case GateInfra:
		return 2
	case GateInconclusive:
		return 1
	}
	return 0
}

// Gate judges a run, optionally against a baseline run. Code is the most
// severe of: 1 when a case failed, a case that passed in the baseline (same
// id) no longer passes with a fail verdict, or convergence p95 over the cases
// converged in both runs grew beyond the tolerance; 3 when a case is an
// error or the results are unusable; 2 when a case is inconclusive, the run
// has no cases, or shards are missing from a merge; else 0.
func Gate(cur *Results, baseline *Results, opt GateOptions) GateResult {
	type reason struct {
		code int
		line string
	}
	var reasons []reason
	add := func(code int, format string, args ...any) {
		reasons = append(reasons, reason{code, fmt.Sprintf(format, args...)})
	}
	if cur == nil {
		return GateResult{Code: GateInfra, Lines: []string{"ERROR no results to judge"}}
	}
	if err := Validate(cur); err != nil {
		add(GateInfra, "ERROR results are invalid: %v", err)
	}
	if len(cur.Cases) == 0 {
		add(GateInconclusive, "INCONCLUSIVE the run has no cases (label filter %q, shard %q): nothing was tested", cur.Filter, cur.Shard)
	}
	if len(cur.MissingShards) > 0 {
		add(GateInconclusive, "INCONCLUSIVE merged results lack shard(s) %s: part of the catalogue never ran", strings.Join(cur.MissingShards, ", "))
	}
	gateCases(cur, opt, add)
	if opt.MaxInjectionError > 0 {
		if line, ok := injectionErrorGate(cur, opt.MaxInjectionError); !ok {
			add(GateInconclusive, "%s", line)
		}
	}
	if opt.MinCoverage > 0 {
		if line, ok := coverageGate(cur, opt.MinCoverage); !ok {
			add(GateFail, "%s", line)
		}
	}
	if baseline != nil {
		for _, l := range compareBaseline(cur, baseline, opt) {
			add(l.code, "%s", l.line)
		}
	}

	sort.SliceStable(reasons, func(i, j int) bool { return severity(reasons[i].code) > severity(reasons[j].code) })
	g := GateResult{}
	for _, r := range reasons {
		if severity(r.code) > severity(g.Code) {
			g.Code = r.code
		}
		g.Lines = append(g.Lines, r.line)
	}
	tally := fmt.Sprintf("gate: %s (exit %d): %s", GateCodeName(g.Code), g.Code, CountVerdicts(cur.Cases))
	if s := NotRunSummary(cur.NotRun); s != "" {
		tally += "; " + s
	}
	if baseline != nil {
		tally += fmt.Sprintf("; baseline %s", orDefault(baseline.RunID, "(unnamed)"))
	}
	g.Lines = append(g.Lines, tally)
	return g
}

// gateCases adds the reasons the cases give: each not-run case (inconclusive
// unless opt.AllowNotRun, never a pass), then each verdict other than a
// clean pass. A not-run case's inconclusive verdict is not listed twice.
func gateCases(cur *Results, opt GateOptions, add func(code int, format string, args ...any)) {
	notRun := cur.NotRunIDs()
	if len(cur.Cases) > 0 && allNotRun(cur.Cases, notRun) {
		add(GateInconclusive, "INCONCLUSIVE not one selected case ran (%d not run): nothing was tested", len(cur.Cases))
	}
	for _, n := range cur.NotRun {
		code := GateInconclusive
		if opt.AllowNotRun {
			code = GatePass
		}
		add(code, "NOT RUN %s: %s: %s", n.Case, notRunWhat(n), oneLine(orDefault(n.Reason, "no reason recorded")))
	}
	for _, c := range cur.Cases {
		if notRun[c.ID] && c.Verdict == Inconclusive {
			continue // listed above as NOT RUN
		}
		switch c.Verdict {
		case Pass:
			if c.Attempts > 1 && opt.FlakyFails {
				add(GateFail, "FLAKY %s passed only after %d attempts (--flaky-fails); repro: %s", c.ID, c.Attempts, reproOrNone(c))
			}
		case Fail:
			covered, rest := opt.Accept.Covers(c)
			if covered {
				add(GatePass, "ACCEPTED %s (known finding): %s; repro: %s", c.ID, failureSummary(c), reproOrNone(c))
				break
			}
			if opt.Accept.Names(c.ID) {
				add(GateFail, "FAIL %s: not accepted: %s failing beside the accepted finding(s): %s; repro: %s", c.ID,
					strings.Join(rest, ", "), failureSummary(c), reproOrNone(c))
				break
			}
			add(GateFail, "FAIL %s: %s; repro: %s", c.ID, failureSummary(c), reproOrNone(c))
		case Inconclusive:
			add(GateInconclusive, "INCONCLUSIVE %s: %s; repro: %s", c.ID, oneLine(orDefault(c.Reason, "fault did not land as intended")), reproOrNone(c))
		case Error:
			add(GateInfra, "ERROR %s: %s", c.ID, oneLine(orDefault(c.Reason, "harness error")))
		case Flaky:
			// its own outcome, never a pass: as severe as its worst run
			add(flakyCode(c), "FLAKY %s: verdicts %s across %d runs: %s; repro: %s", c.ID, RunTally(c.Runs), len(c.Runs),
				oneLine(orDefault(c.Reason, "verdicts differ")), reproOrNone(c))
		}
	}
}

// allNotRun: every case is one the host could not run.
func allNotRun(cases []Case, notRun map[string]bool) bool {
	for _, c := range cases {
		if !notRun[c.ID] {
			return false
		}
	}
	return true
}

type gateLine struct {
	code int
	line string
}

func compareBaseline(cur, base *Results, opt GateOptions) []gateLine {
	var out []gateLine
	note := func(format string, args ...any) { out = append(out, gateLine{GatePass, fmt.Sprintf(format, args...)}) }
	if base.Backend != cur.Backend || base.TimeScale != cur.TimeScale {
		note("NOTE baseline ran backend %q at time scale %g, this run backend %q at %g: convergence figures are not comparable",
			base.Backend, base.TimeScale, cur.Backend, cur.TimeScale)
	}
	baseByID := make(map[string]*Case, len(base.Cases))
	for i := range base.Cases {
		baseByID[base.Cases[i].ID] = &base.Cases[i]
	}
	var curMs, baseMs []float64
	seen := map[string]bool{}
	for _, c := range cur.Cases {
		seen[c.ID] = true
		b, ok := baseByID[c.ID]
		if !ok {
			continue
		}
		if covered, _ := opt.Accept.Covers(c); b.Verdict == Pass && c.Verdict == Fail && !covered {
			out = append(out, gateLine{GateFail, fmt.Sprintf("REGRESSION %s passed in baseline %s and fails now: %s; repro: %s",
				c.ID, orDefault(base.RunID, "(unnamed)"), failureSummary(c), reproOrNone(c))})
		}
		if b.Verdict == Fail && c.Verdict == Pass {
			note("FIXED %s failed in the baseline and passes now", c.ID)
		}
		if opt.Accept.Names(c.ID) && c.Verdict == Pass {
			note("NOTE %s is accepted as a known finding but passes now: drop it from the accept list", c.ID)
		} else if stale := opt.Accept.Stale(c); len(stale) > 0 && c.Verdict == Fail {
			note("NOTE accepted finding(s) %s no longer fail: drop them from the accept list", strings.Join(stale, ", "))
		}
		if b.Verdict == Pass && (c.Verdict == Inconclusive || c.Verdict == Error) {
			note("NOTE %s passed in the baseline and is %s now: its coverage is lost for this run", c.ID, c.Verdict)
		}
		if (b.Verdict == Pass || b.Verdict == Fail) && (c.Verdict == Pass || c.Verdict == Fail) &&
			b.ConvergeMs >= 0 && c.ConvergeMs >= 0 {
			curMs = append(curMs, c.ConvergeMs)
			baseMs = append(baseMs, b.ConvergeMs)
		}
	}
	missing := 0
	for id := range baseByID {
		if !seen[id] {
			missing++
		}
	}
	if missing > 0 {
		note("NOTE %d baseline case(s) are not in this run (filter, shard or catalogue change)", missing)
	}
	comparable := base.Backend == cur.Backend && base.TimeScale == cur.TimeScale
	if opt.P95Tolerance >= 0 && comparable && len(curMs) > 0 {
		sort.Float64s(curMs)
		sort.Float64s(baseMs)
		cp, bp := Percentile(curMs, 0.95), Percentile(baseMs, 0.95)
		limit := bp*(1+opt.P95Tolerance) + opt.P95SlackMs
		if cp > limit && !math.IsNaN(cp) {
			out = append(out, gateLine{GateFail, fmt.Sprintf("REGRESSION convergence p95 %s > baseline %s + %.0f%% (limit %s) over the %d cases converged in both runs",
				FormatMs(cp), FormatMs(bp), opt.P95Tolerance*100, FormatMs(limit), len(curMs))})
		} else {
			note("convergence p95 %s vs baseline %s (limit %s) over %d cases: ok", FormatMs(cp), FormatMs(bp), FormatMs(limit), len(curMs))
		}
	}
	return out
}

// failureSummary names the violated invariants with the first line of the
// first one's evidence, so a gate line alone says what broke.
func failureSummary(c Case) string {
	var names []string
	first := ""
	for _, inv := range c.Invariants {
		if !inv.OK {
			names = append(names, inv.Name)
			if first == "" {
				first = firstLine(inv.Evidence)
			}
		}
	}
	if len(names) == 0 {
		return "failed: " + orDefault(c.Reason, "no invariant named")
	}
	s := "invariant(s) " + strings.Join(names, ", ")
	if first != "" {
		s += " (" + first + ")"
	}
	return s
}

func reproOrNone(c Case) string { return orDefault(c.Repro, "(no repro recorded)") }

func orDefault(s, def string) string {
	if strings.TrimSpace(s) == "" {
		return def
	}
	return s
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = strings.TrimSpace(s[:i]) + " …"
	}
	return truncate(s, 160)
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// InfraError wraps a failure to obtain, read or combine results; as a command
// error its exit status is GateInfra (3), so CI never mistakes a broken
// harness for a violated invariant.
type InfraError struct{ Err error }

func (e InfraError) Error() string { return e.Err.Error() }

// Unwrap exposes the cause.
func (e InfraError) Unwrap() error { return e.Err }

// ExitCode is the process exit status.
func (e InfraError) ExitCode() int { return GateInfra }

// coverageGate judges --min-coverage: the line naming the figure, and
// whether it holds. A run without a current map does not hold it.
func coverageGate(cur *Results, min float64) (string, bool) {
	cov, err := cur.CoverageMap()
	if err != nil {
		return fmt.Sprintf("COVERAGE below --min-coverage %.1f%%: %v", min, err), false
	}
	if cov.Percent < min {
		return fmt.Sprintf("COVERAGE %s is below --min-coverage %.1f%%", cov, min), false
	}
	return "", true
}
