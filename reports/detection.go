package reports

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
)

// Detection statistics (issue 36): how often a planted bug's check catches
// it over `selftest --count N` runs, and how often `repro --count N`
// reproduces a case's outcome. A check that catches its bug 1 time in 5
// costs a day; one that catches it 20 times in 20 costs a minute, so a rate
// under 100 % is always shown as the rate, never as "caught".

// DetectionRate is one selftest row measured over --count N runs with the
// bug on and N runs with it off.
type DetectionRate struct {
	Count int `json:"count"` // N: runs asked for with the bug on, and with it off
	// Runs is the with-bug runs done: fewer than Count when --failfast
	// stopped the row at its first catch, or the run was interrupted.
	Runs       int `json:"runs"`
	Caught     int `json:"caught"`      // with-bug runs that failed naming the bug's invariant
	FirstCatch int `json:"first_catch"` // 1-based index of the first catching run; 0: none
	// StoppedEarly: --failfast ended the row at its first catch.
	StoppedEarly bool `json:"stopped_early,omitempty"`
	// CleanRuns is the without-bug runs done; FalsePositives those of them
	// that did not pass (a fail, or an inconclusive/error run: nothing
	// proven clean). Must be 0.
	CleanRuns      int `json:"clean_runs"`
	FalsePositives int `json:"false_positives"`
	// Exact: the scenario parks its fault at an exact phase, so nothing is
	// left to timing and the detection must be Runs/Runs.
	Exact bool `json:"exact,omitempty"`
}

// Catches says whether a with-bug run caught the bug: the case failed and
// one of its violated invariants is the one the bug breaks (a harness
// timeout or a failure on another invariant is not a detection).
func Catches(c Case, invariant string) bool {
	if c.Verdict != Fail {
		return false
	}
	for _, inv := range c.Invariants {
		if !inv.OK && inv.Name == invariant {
			return true
		}
	}
	return false
}

// MeasureDetection computes a row's rate. with[i] and without[i] are run
// i+1 (an ID of "" is a run not done: --failfast, or interrupted).
func MeasureDetection(invariant string, with, without []Case, count int, failfast, exact bool) DetectionRate {
	d := DetectionRate{Count: count, Exact: exact}
	for i, c := range with {
		if c.ID == "" {
			continue
		}
		d.Runs++
		if Catches(c, invariant) {
			d.Caught++
			if d.FirstCatch == 0 {
				d.FirstCatch = i + 1
			}
		}
	}
	for _, c := range without {
		if c.ID == "" {
			continue
		}
		d.CleanRuns++
		if c.Verdict != Pass {
			d.FalsePositives++
		}
	}
	d.StoppedEarly = failfast && d.FirstCatch > 0 && d.Runs < count
	return d
}

// Full says every with-bug run done caught the bug (100 %).
func (d DetectionRate) Full() bool { return d.Runs > 0 && d.Caught == d.Runs }

// Judge says whether the row holds and, when not, why. A false positive,
// a row without any clean run or any with-bug run (missing data), no catch
// at all, fewer runs than asked (interrupted; --failfast's stop excepted),
// or an exact-phase (park) row under Runs/Runs fails; a timed row
// caught in some runs only holds, reported under 100 %.
func (d DetectionRate) Judge() (ok bool, note string) {
	switch {
	case d.Runs == 0:
		return false, "no run with the bug was done"
	case d.CleanRuns == 0:
		return false, "no run without the bug was done: false positives not measured"
	case d.FalsePositives > 0:
		return false, fmt.Sprintf("false positive: %d/%d runs without the bug did not pass", d.FalsePositives, d.CleanRuns)
	case d.Caught == 0:
		return false, fmt.Sprintf("not detected in any of %d run(s)", d.Runs)
	case (d.Runs < d.Count && !d.StoppedEarly) || d.CleanRuns < d.Count:
		// interrupted: a rate over fewer runs than asked proves less
		return false, fmt.Sprintf("only %d and %d of %d runs done with and without the bug", d.Runs, d.CleanRuns, d.Count)
	case d.Exact && !d.Full():
		return false, fmt.Sprintf("exact-phase (park) detection %d/%d: must be %d/%d", d.Caught, d.Runs, d.Runs, d.Runs)
	}
	return true, ""
}

// RateLabel is the detection rate as the tables show it: "3/5 (60 %)",
// with how far --failfast got when it stopped the row.
func (d DetectionRate) RateLabel() string {
	s := fmt.Sprintf("%d/%d (%s)", d.Caught, d.Runs, percent(d.Caught, d.Runs))
	switch {
	case d.StoppedEarly:
		s += fmt.Sprintf(", stopped early after run %d of %d", d.Runs, d.Count)
	case d.Runs < d.Count:
		s += fmt.Sprintf(", %d of %d runs done", d.Runs, d.Count)
	}
	return s
}

// FirstLabel is runs-to-first-failure: the first catching run, or "—".
func (d DetectionRate) FirstLabel() string {
	if d.FirstCatch == 0 {
		return "—"
	}
	return fmt.Sprint(d.FirstCatch)
}

// FalsePositiveLabel is "0/5": without-bug runs that did not pass.
func (d DetectionRate) FalsePositiveLabel() string {
	return fmt.Sprintf("%d/%d", d.FalsePositives, d.CleanRuns)
}

// percent is k/n as a whole percentage, floored so that 19/20 never reads
// as 100 %.
func percent(k, n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%d %%", k*100/n)
}

// rateStatus is a rates-table row's last column: "caught" only at 100 %.
func rateStatus(r SelftestRow) string {
	switch {
	case !r.OK:
		return "MISSED: " + oneLine(r.Note)
	case r.Rate != nil && !r.Rate.Full():
		return "UNDER 100 %"
	}
	return "caught"
}

// hasRates says whether the rows were measured with --count above 1 (the
// rates table replaces today's one-run table).
func hasRates(rows []SelftestRow) bool {
	for _, r := range rows {
		if r.Rate != nil && r.Rate.Count > 1 {
			return true
		}
	}
	return false
}

func triggerKind(r *DetectionRate) string {
	if r != nil && r.Exact {
		return "park"
	}
	return "timed"
}

// formatRates writes the terminal table of a selftest run with --count N.
func formatRates(w io.Writer, rows []SelftestRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUG\tSCENARIO\tFAULT\tDETECTED\tFIRST\tFALSE POS\tVIOLATED (EXPECTED)\tSTATUS")
	for _, r := range rows {
		d := DetectionRate{}
		if r.Rate != nil {
			d = *r.Rate
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s (%s)\t%s\n", r.Bug, r.Scenario, triggerKind(r.Rate), d.RateLabel(),
			d.FirstLabel(), d.FalsePositiveLabel(), orDefault(r.WithBugInvariant, "-"), expectedInvariant(r.Bug), rateStatus(r))
	}
	return tw.Flush()
}

// ratesMarkdown is the selftest.md section of a --count N run.
func ratesMarkdown(b *strings.Builder, rows []SelftestRow) {
	b.WriteString("## Detection rates\n\n")
	b.WriteString("Caught = the run failed naming the bug's invariant; a park (exact-phase) row must be caught in every run, a false positive is a run without the bug that did not pass.\n\n")
	b.WriteString("| bug | scenario | fault | detected | first catching run | false positives | status |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		d := DetectionRate{}
		if r.Rate != nil {
			d = *r.Rate
		}
		fmt.Fprintf(b, "| `%s` | `%s` | %s | %s | %s | %s | %s |\n", mdCode(r.Bug), mdCode(r.Scenario), triggerKind(r.Rate),
			mdEscape(d.RateLabel()), d.FirstLabel(), d.FalsePositiveLabel(), mdEscape(rateStatus(r)))
	}
}

// Outcome is a run's verdict with the invariants it violated, the unit
// `repro --count` compares runs by: "fail [intent-goal]", "pass".
func Outcome(c Case) string {
	var bad []string
	for _, inv := range c.Invariants {
		if !inv.OK {
			bad = append(bad, inv.Name)
		}
	}
	if len(bad) == 0 {
		return c.Verdict
	}
	sort.Strings(bad)
	return c.Verdict + " [" + strings.Join(bad, ",") + "]"
}

// OutcomeCount is one distinct outcome of a repro and the runs (1-based)
// that had it.
type OutcomeCount struct {
	Outcome string
	Verdict string
	Runs    []int
}

// TallyOutcomes groups runs by Outcome, the most common first (ties: the
// one seen first).
func TallyOutcomes(runs []Case) []OutcomeCount {
	var out []OutcomeCount
	at := map[string]int{}
	for i, c := range runs {
		k := Outcome(c)
		j, ok := at[k]
		if !ok {
			j = len(out)
			at[k] = j
			out = append(out, OutcomeCount{Outcome: k, Verdict: c.Verdict})
		}
		out[j].Runs = append(out[j].Runs, i+1)
	}
	sort.SliceStable(out, func(a, b int) bool { return len(out[a].Runs) > len(out[b].Runs) })
	return out
}

// injectionErrors lists a run's measured injection errors (actual −
// requested), and any injection that failed.
func injectionErrors(c Case) []string {
	var out []string
	for _, in := range c.Injections {
		switch {
		case in.Err != "":
			out = append(out, "failed: "+oneLine(in.Err))
		case in.ErrorNs != nil:
			out = append(out, signedMs(float64(*in.ErrorNs)/1e6))
		}
	}
	return out
}

// FormatRepro writes the table of `repro --count N`: how often each outcome
// came, then every run with what can vary between runs (landed phase,
// window margin, injection error), then what did vary.
func FormatRepro(w io.Writer, runs []Case) error {
	n := len(runs)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OUTCOME\tRUNS\tWHICH")
	for _, o := range TallyOutcomes(runs) {
		fmt.Fprintf(tw, "%s\t%d/%d (%s)\t%s\n", o.Outcome, len(o.Runs), n, percent(len(o.Runs), n), joinInts(o.Runs))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tOUTCOME\tLANDED PHASE\tWINDOW MARGIN\tINJECTION ERROR\tDURATION")
	for i, c := range runs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%.1fs\n", i+1, Outcome(c), orDefault(c.LandedPhase, "-"), c.MarginLabel(),
			orDefault(strings.Join(injectionErrors(c), ","), "-"), c.DurationMs/1000)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, reproVaried(runs))
	return err
}

// reproVaried says which of landed phase, window margin and injection error
// differed between the runs, with their spread.
func reproVaried(runs []Case) string {
	var varied, same []string
	phases := distinct(runs, func(c Case) string { return orDefault(c.LandedPhase, "-") })
	if len(phases) > 1 {
		varied = append(varied, "landed phase ("+strings.Join(phases, ", ")+")")
	} else {
		same = append(same, "landed phase")
	}
	if m := marginSpread(runs); m != "" {
		varied = append(varied, "window margin ("+m+")")
	} else {
		same = append(same, "window margin")
	}
	if e := injErrSpread(runs); e != "" {
		varied = append(varied, "injection error ("+e+")")
	} else {
		same = append(same, "injection error")
	}
	s := "varied between runs: " + orDefault(strings.Join(varied, "; "), "nothing")
	if len(same) > 0 {
		s += "\nthe same in every run: " + strings.Join(same, ", ")
	}
	return s
}

// distinct lists the values f takes over runs with their counts ("a ×3"),
// in first-seen order.
func distinct(runs []Case, f func(Case) string) []string {
	var order []string
	n := map[string]int{}
	for _, c := range runs {
		v := f(c)
		if n[v] == 0 {
			order = append(order, v)
		}
		n[v]++
	}
	out := make([]string, len(order))
	for i, v := range order {
		out[i] = fmt.Sprintf("%s ×%d", v, n[v])
	}
	return out
}

// marginSpread is the nearer-edge margin's range over the runs whose fault
// fired in a measured window, or the distinct labels when they differ; ""
// when every run had the same.
func marginSpread(runs []Case) string {
	lo, hi, fired := math.Inf(1), math.Inf(-1), 0
	for _, c := range runs {
		if c.Window != nil && c.Window.Fired {
			lo, hi, fired = math.Min(lo, c.Window.MinMs()), math.Max(hi, c.Window.MinMs()), fired+1
		}
	}
	if fired > 1 && hi > lo {
		return fmt.Sprintf("nearer edge %s .. %s over %d runs", signedMs(lo), signedMs(hi), fired)
	}
	if labels := distinct(runs, func(c Case) string { return c.MarginLabel() }); len(labels) > 1 {
		return strings.Join(labels, ", ")
	}
	return ""
}

// injErrSpread is the range of the measured injection errors, or ""
// when none was measured or they did not differ.
func injErrSpread(runs []Case) string {
	lo, hi, n, failed := math.Inf(1), math.Inf(-1), 0, 0
	for _, c := range runs {
		for _, in := range c.Injections {
			if in.Err != "" {
				failed++
			}
			if in.ErrorNs != nil {
				ms := float64(*in.ErrorNs) / 1e6
				lo, hi, n = math.Min(lo, ms), math.Max(hi, ms), n+1
			}
		}
	}
	var parts []string
	if n > 1 && hi > lo {
		parts = append(parts, fmt.Sprintf("%s .. %s over %d injections", signedMs(lo), signedMs(hi), n))
	}
	if failed > 0 {
		parts = append(parts, fmt.Sprintf("%d injection(s) failed", failed))
	}
	return strings.Join(parts, "; ")
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}
