package reports

import (
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"unicode"
)

// summaryMaxProblems caps the problem cases Summary lists.
const summaryMaxProblems = 25

// Summary writes what `vmchaos run` prints at the end: the tally per verdict,
// convergence figures, every case that is not a pass with why and its repro
// command, and where the reports are (when r.Dir is known).
func Summary(w io.Writer, r *Results) {
	if r == nil {
		fmt.Fprintln(w, "vmchaos: no results")
		return
	}
	counts := CountVerdicts(r.Cases)
	g := Gate(r, nil, DefaultGateOptions())
	// A leading blank line: the summary often follows a progress line that
	// did not end its line (Ginkgo's "SUCCESS!" does not).
	fmt.Fprintf(w, "\nvmchaos run %s: %s — %s\n", orDefault(r.RunID, "(unnamed)"), strings.ToUpper(GateCodeName(g.Code)), counts)
	fmt.Fprintf(w, "  backend %s, supervisor %s, time scale %g, seed %d\n", orDefault(r.Backend, "?"), orDefault(r.Supervisor, "?"), r.TimeScale, r.Seed)
	if s := NotRunSummary(r.NotRun); s != "" {
		fmt.Fprintf(w, "  %s: the host lacks what they need; they are not judged (see report.md, \"Not run\")\n", s)
	}
	fmt.Fprintf(w, "  %s\n", Convergence(r.Cases))
	if r.Coverage != nil {
		fmt.Fprintf(w, "  %s\n", r.Coverage)
	}
	// Problems first by severity, capped so a bad night does not scroll the
	// summary off the CI log; the report has them all.
	var problems []Case
	for _, c := range r.Cases {
		if c.Verdict != Pass || c.Attempts > 1 {
			problems = append(problems, c)
		}
	}
	rank := map[string]int{Fail: 0, Error: 1, Inconclusive: 2, Pass: 3}
	sort.SliceStable(problems, func(i, j int) bool { return rank[problems[i].Verdict] < rank[problems[j].Verdict] })
	shown := problems
	if len(shown) > summaryMaxProblems {
		shown = shown[:summaryMaxProblems]
	}
	for _, c := range shown {
		what := ""
		switch c.Verdict {
		case Fail:
			what = oneLine(failureSummary(c))
		case Pass:
			what = fmt.Sprintf("passed after %d attempts (flaky)", c.Attempts)
		default:
			what = oneLine(orDefault(c.Reason, "no reason recorded"))
		}
		fmt.Fprintf(w, "  %-12s %s: %s\n", strings.ToUpper(c.Verdict), c.ID, what)
		if c.Repro != "" {
			fmt.Fprintf(w, "  %-12s repro: %s\n", "", c.Repro)
		}
	}
	if more := len(problems) - len(shown); more > 0 {
		fmt.Fprintf(w, "  … and %d more case(s) that did not pass cleanly: see report.md\n", more)
	}
	if r.Dir != "" {
		fmt.Fprintf(w, "  report: %s (also %s, %s, %s)\n", filepath.Join(r.Dir, HTMLFile), MarkdownFile, JUnitFile, ResultsFile)
	}
}

// oneLine flattens text for a terminal line: whitespace runs become one
// space and control characters (escape sequences from a log) become '?'.
func oneLine(s string) string {
	return truncate(oneLineFull(s), 200)
}

// oneLineFull is oneLine without the length cap.
func oneLineFull(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && !unicode.IsSpace(r) {
			return '?'
		}
		return r
	}, s)
	return strings.Join(strings.Fields(s), " ")
}
