package reports

import (
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"
)

// Markdown renders report.md for a release manager: the verdict first, what
// broke grouped by invariant, the one table of every case, then for each case
// that did not pass the evidence and the command that reproduces it.
func Markdown(r *Results) ([]byte, error) { return renderMarkdown(r, nil) }

// renderMarkdown is Markdown with a selftest table when rows are given.
func renderMarkdown(r *Results, selftest []SelftestRow) ([]byte, error) {
	var b strings.Builder
	g := Gate(r, nil, DefaultGateOptions())
	fmt.Fprintf(&b, "# vmchaos report — %s\n\n", mdEscape(orDefault(r.RunID, "(unnamed run)")))
	mdVerdict(&b, g, CountVerdicts(r.Cases), selftest)
	mdRunTable(&b, r)
	mdConvergence(&b, Convergence(r.Cases))
	mdWhyItBroke(&b, r, g)
	mdNotRun(&b, r)
	mdNotSupported(&b, r)
	mdPerScenario(&b, r)
	b.WriteString(coverageMarkdown(r))
	mdCaseTable(&b, r)
	mdInjectionErrors(&b, r)
	mdWorkloadCuts(&b, r)
	mdDetails(&b, r)
	return []byte(b.String()), nil
}

// mdNotRun lists the selected cases the host could not run (Results.NotRun).
func mdNotRun(b *strings.Builder, r *Results) {
	if len(r.NotRun) == 0 {
		return
	}
	fmt.Fprintf(b, "## Not run\n\n%s: the host lacks a binary or feature they need. They are not judged and never count as passed.\n\n", NotRunSummary(r.NotRun))
	b.WriteString("| case | missing | kind | reason |\n|---|---|---|---|\n")
	for _, n := range r.NotRun {
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", mdCode(n.Case), mdEscape(n.Missing), mdEscape(n.Kind), mdEscape(oneLine(n.Reason)))
	}
	b.WriteString("\n")
}

// mdNotSupported lists the verbs whose cases were not generated because
// the manager under test lacks what they need (Results.NotSupported).
func mdNotSupported(b *strings.Builder, r *Results) {
	if len(r.NotSupported) == 0 {
		return
	}
	b.WriteString("## Not supported by this manager\n\nNo case was generated for these verbs: they are not judged and never count as passed.\n\n")
	b.WriteString("| cases | verb | reason |\n|---|---|---|\n")
	for _, n := range r.NotSupported {
		fmt.Fprintf(b, "| %s | %s | %s |\n", mdCode(n.Case), mdEscape(n.Missing), mdEscape(oneLine(n.Reason)))
	}
	b.WriteString("\n")
}

// mdVerdict writes the run's verdict line; a selftest run leads with the
// selftest's own verdict and track record, as failing cases are expected there.
func mdVerdict(b *strings.Builder, g GateResult, counts VerdictCounts, selftest []SelftestRow) {
	if len(selftest) == 0 {
		fmt.Fprintf(b, "**Verdict: %s** (gate exit %d) — %s.\n\n", strings.ToUpper(GateCodeName(g.Code)), g.Code, mdEscape(counts.String()))
		return
	}
	t := TallySelftest(selftest)
	status := "PASS"
	if !t.OK() {
		status = "FAIL"
	}
	fmt.Fprintf(b, "**Selftest: %s** — %d of %d bugs caught, %d of %d checks ok.", status, t.BugsCaught, t.Bugs, t.RowsOK, t.Rows)
	if len(t.Missed) > 0 {
		fmt.Fprintf(b, " **Missed:** %s.", mdEscape(strings.Join(t.Missed, ", ")))
	}
	if len(t.Untested) > 0 {
		fmt.Fprintf(b, " Not run: %s.", mdEscape(strings.Join(t.Untested, ", ")))
	}
	fmt.Fprintf(b, " Cases ran with historical bugs switched back on, so failing cases are the expected outcome; every check is in %s.\n\n", SelftestMarkdownFile)
	selftestTrackRecord(b, selftest)
	b.WriteString("\n")
	fmt.Fprintf(b, "Case verdicts: %s (gate exit %d) — %s.\n\n", strings.ToUpper(GateCodeName(g.Code)), g.Code, mdEscape(counts.String()))
}

// mdRunTable writes the one-row table of how the run was made; optional
// columns appear only when set.
func mdRunTable(b *strings.Builder, r *Results) {
	b.WriteString("| backend | supervisor | time scale | seed | host | started | wall time |")
	row := []string{orDefault(r.Backend, "?"), orDefault(r.Supervisor, "?"), fmt.Sprint(r.TimeScale), fmt.Sprint(r.Seed),
		orDefault(r.Host, "?"), formatTime(r.StartedAt), wallTime(r)}
	extra := [][2]string{{"build", r.Build}, {"shard", r.Shard}, {"shards merged", strings.Join(r.Shards, ", ")}, {"MISSING shards", strings.Join(r.MissingShards, ", ")},
		{"label filter", r.Filter}, {"regress switches", strings.Join(r.Regress, ", ")}}
	for _, e := range extra {
		if e[1] != "" {
			fmt.Fprintf(b, " %s |", e[0])
			row = append(row, e[1])
		}
	}
	b.WriteString("\n|" + strings.Repeat("---|", len(row)) + "\n|")
	for _, v := range row {
		fmt.Fprintf(b, " %s |", mdEscape(v))
	}
	b.WriteString("\n\n")
}

func mdConvergence(b *strings.Builder, conv ConvergeStats) {
	fmt.Fprintf(b, "Time to converge (fault → stable), over the %d cases whose fault landed and converged: **p50 %s, p95 %s, max %s**", conv.N, FormatMs(conv.P50), FormatMs(conv.P95), FormatMs(conv.Max))
	if conv.Never > 0 {
		fmt.Fprintf(b, "; **%d never converged**", conv.Never)
	}
	b.WriteString(".\n\n")
}

// mdWhyItBroke lists the violated invariants with their cases, and the
// gate's reasons when there is more than one.
func mdWhyItBroke(b *strings.Builder, r *Results, g GateResult) {
	if groups := byInvariant(r.Cases); len(groups) > 0 {
		b.WriteString("## What broke\n\n")
		for _, gr := range groups {
			fmt.Fprintf(b, "- `%s` violated in %d case(s): %s\n", mdCode(gr.name), len(gr.cases), mdCaseLinks(gr.cases))
		}
		b.WriteString("\n")
	}
	if len(g.Lines) > 1 {
		b.WriteString("## Why this verdict\n\n")
		for _, l := range g.Lines {
			fmt.Fprintf(b, "- %s\n", mdEscape(l))
		}
		b.WriteString("\n")
	}
}

func mdPerScenario(b *strings.Builder, r *Results) {
	sc := byScenario(r.Cases)
	if len(sc) <= 1 {
		return
	}
	b.WriteString("## Per scenario\n\n| scenario | cases | pass | fail | inconclusive | error | converge p95 |\n|---|---|---|---|---|---|---|\n")
	for _, x := range sc {
		fmt.Fprintf(b, "| `%s` | %d | %d | %s | %s | %s | %s |\n", mdCode(x.name), x.counts.Total, x.counts.Pass,
			boldIf(x.counts.Fail), boldIf(x.counts.Inconclusive), boldIf(x.counts.Error), convP95(x.conv))
	}
	b.WriteString("\n")
}

// mdCaseTable writes the one table of every case.
func mdCaseTable(b *strings.Builder, r *Results) {
	b.WriteString("## Cases\n\n")
	b.WriteString("| case | fault | landed phase | window margin | verdict | time to converge | failed invariants |\n|---|---|---|---|---|---|---|\n")
	for _, c := range r.Cases {
		verdict := c.Verdict
		if c.Verdict != Pass {
			verdict = "**" + strings.ToUpper(c.Verdict) + "**"
		}
		if c.Attempts > 1 {
			verdict += fmt.Sprintf(" (flaky: %d attempts)", c.Attempts)
		}
		if len(c.Runs) > 1 {
			verdict += " (" + RunTally(c.Runs) + ")"
		}
		fault := c.Fault
		if c.Trigger != "" {
			fault += " @ " + c.Trigger
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s |\n", mdCaseLink(c), mdEscape(fault), mdEscape(c.LandedLabel()),
			mdEscape(c.MarginLabel()), verdict, FormatMs(c.ConvergeMs), mdEscape(strings.Join(c.FailedInvariants(), ", ")))
	}
	b.WriteString("\n")
}

// mdDetails writes the evidence and repro of every case that did not pass,
// or passed only after retries.
func mdDetails(b *strings.Builder, r *Results) {
	var problems []Case
	for _, c := range r.Cases {
		if c.Problem() || c.Attempts > 1 {
			problems = append(problems, c)
		}
	}
	if len(problems) > 0 {
		b.WriteString("## Details\n\n")
	}
	for _, c := range problems {
		mdCaseDetail(b, c)
	}
}

func mdCaseDetail(b *strings.Builder, c Case) {
	mdCaseFacts(b, c)
	for _, l := range c.Ledger {
		mdLedgerLine(b, l)
	}
	b.WriteString(WorkloadMarkdown(c))
	mdViolatedInvariants(b, c)
	if rows := timelineExcerpt(c, 12); len(rows) > 0 {
		b.WriteString("\nTimeline around the fault (times relative to it):\n\n")
		b.WriteString(codeBlock("", strings.Join(rows, "\n")))
	}
	mdMetricsAndLogs(b, c)
	reproMarkdown(b, c)
	b.WriteString("\nReproduce:\n\n")
	if c.Repro != "" {
		b.WriteString(codeBlock("sh", c.Repro))
	} else {
		b.WriteString("(no repro command recorded)\n")
	}
	b.WriteString("\n")
}

// mdCaseFacts writes a problem case's heading and what was done to it:
// scenario, fault, landing, window, runs and injections.
func mdCaseFacts(b *strings.Builder, c Case) {
	fmt.Fprintf(b, "### %s — %s\n\n", mdEscape(c.ID), strings.ToUpper(c.Verdict))
	if c.Title != "" {
		fmt.Fprintf(b, "%s", mdEscape(c.Title))
		if c.SeedRef != "" {
			fmt.Fprintf(b, " (seed %s)", mdEscape(c.SeedRef))
		}
		b.WriteString("\n\n")
	}
	fmt.Fprintf(b, "- scenario `%s`, operation %s, fault %s, trigger `%s`, offset %s\n", mdCode(c.Scenario), mdEscape(orDefault(c.Operation, "-")),
		mdEscape(orDefault(c.Fault, "-")), mdCode(c.Trigger), c.OffsetLabel())
	fmt.Fprintf(b, "- landed phase %s; time to converge %s; case duration %s", mdEscape(orDefault(c.LandedPhase, "-")), FormatMs(c.ConvergeMs), FormatMs(c.DurationMs))
	if c.Attempts > 1 {
		fmt.Fprintf(b, "; **flaky: %d attempts**", c.Attempts)
	}
	b.WriteString("\n")
	if c.Reason != "" {
		fmt.Fprintf(b, "- reason: %s\n", mdEscape(c.Reason))
	}
	if w := c.Window; w != nil {
		fmt.Fprintf(b, "- window %s → %s: %s .. %s after the trigger (spread %s; %s); margin %s\n", mdEscape(w.Open), mdEscape(w.Close),
			FormatMs(w.StartMs), FormatMs(w.EndMs), FormatMs(w.SpreadMs), mdEscape(w.Source), mdEscape(c.MarginLabel()))
	}
	for i, r := range c.Runs {
		fmt.Fprintf(b, "- run %d: %s, landed %s%s\n", i+1, mdEscape(r.Verdict), mdEscape(orDefault(r.LandedPhase, "-")), mdEscape(prefixed(": ", r.Reason)))
	}
	for _, inj := range c.Injections {
		fmt.Fprintf(b, "- injection %s (`%s`): %s\n", mdEscape(inj.Fault), mdCode(inj.Trigger), mdEscape(injectionText(inj)))
	}
}

func mdLedgerLine(b *strings.Builder, l LedgerVerdict) {
	status := "ok"
	if !l.OK {
		status = "**NOT OK**"
	}
	fmt.Fprintf(b, "- ledger %s: %s — stable %d, lost %d, phantom %d, in flight %d", mdEscape(l.Guest), status, l.Stable, l.Lost, l.Phantom, l.InFlight)
	if len(l.LostNames) > 0 {
		fmt.Fprintf(b, "; lost: %s", mdEscape(strings.Join(l.LostNames, ", ")))
	}
	if len(l.PhantomNames) > 0 {
		fmt.Fprintf(b, "; phantom: %s", mdEscape(strings.Join(l.PhantomNames, ", ")))
	}
	if l.Message != "" {
		fmt.Fprintf(b, "; %s", mdEscape(l.Message))
	}
	b.WriteString("\n")
}

func mdViolatedInvariants(b *strings.Builder, c Case) {
	if len(c.FailedInvariants()) == 0 {
		return
	}
	b.WriteString("\nViolated invariants:\n\n")
	for _, inv := range c.Invariants {
		if inv.OK {
			continue
		}
		fmt.Fprintf(b, "- **%s**\n", mdEscape(inv.Name))
		if ev := strings.TrimSpace(inv.Evidence); ev != "" {
			b.WriteString("\n" + indent(strings.TrimRight(codeBlock("", ev), "\n"), "  ") + "\n")
		}
	}
}

func mdMetricsAndLogs(b *strings.Builder, c Case) {
	if len(c.Metrics) > 0 {
		var parts []string
		for _, k := range sortedKeys(c.Metrics) {
			parts = append(parts, fmt.Sprintf("`%s` %+.6g", mdCode(k), c.Metrics[k]))
		}
		fmt.Fprintf(b, "\nMetric deltas: %s\n", strings.Join(parts, ", "))
	}
	if len(c.Logs) > 0 {
		var parts []string
		for _, k := range sortedKeys(c.Logs) {
			parts = append(parts, fmt.Sprintf("[%s](%s)", mdEscape(k), mdLinkTarget(c.Logs[k])))
		}
		fmt.Fprintf(b, "\nLogs: %s\n", strings.Join(parts, ", "))
	}
}

type invariantGroup struct {
	name  string
	cases []Case
}

// byInvariant groups failing cases by violated invariant, most cases first.
func byInvariant(cases []Case) []invariantGroup {
	idx := map[string]int{}
	var groups []invariantGroup
	for _, c := range cases {
		if c.Verdict != Fail {
			continue
		}
		names := c.FailedInvariants()
		if len(names) == 0 {
			names = []string{"(none named)"}
		}
		for _, n := range names {
			i, ok := idx[n]
			if !ok {
				i = len(groups)
				idx[n] = i
				groups = append(groups, invariantGroup{name: n})
			}
			groups[i].cases = append(groups[i].cases, c)
		}
	}
	sort.SliceStable(groups, func(a, b int) bool { return len(groups[a].cases) > len(groups[b].cases) })
	return groups
}

// mdCaseLink links a case id to its detail heading when it has one.
func mdCaseLink(c Case) string {
	if !c.Problem() && c.Attempts <= 1 {
		return "`" + mdCode(c.ID) + "`"
	}
	return fmt.Sprintf("[`%s`](#%s)", mdCode(c.ID), mdAnchor(c.ID+" — "+strings.ToUpper(c.Verdict)))
}

func mdCaseLinks(cases []Case) string {
	var parts []string
	for _, c := range cases {
		parts = append(parts, mdCaseLink(c))
	}
	return strings.Join(parts, ", ")
}

// mdAnchor approximates GitHub's heading slug: lower case, spaces to '-',
// punctuation other than '-' and '_' dropped.
func mdAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127 && r != '—':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// mdEscape makes text safe inside a table cell or a list item: one line, no
// control characters, and the characters that could start markup mid-line
// (emphasis, code, links, HTML, cell borders) backslashed. Characters that
// matter only at the start of a line are left alone so the raw file stays
// readable in a terminal.
func mdEscape(s string) string {
	s = oneLineFull(s)
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune("\\`*[]<>|~", r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// mdCode makes text safe inside a single-backtick code span in a table.
func mdCode(s string) string {
	s = oneLineFull(s)
	s = strings.ReplaceAll(s, "`", "'")
	return strings.ReplaceAll(s, "|", "\\|")
}

func mdLinkTarget(p string) string {
	return strings.NewReplacer(" ", "%20", "(", "%28", ")", "%29", "<", "%3C", ">", "%3E").Replace(p)
}

// codeBlock fences text with a fence longer than any backtick run inside it.
func codeBlock(lang, text string) string {
	longest, run := 0, 0
	for _, r := range text {
		if r == '`' {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	text = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return '?'
		}
		return r
	}, text)
	fence := strings.Repeat("`", max(3, longest+1))
	return fence + lang + "\n" + strings.TrimRight(text, "\n") + "\n" + fence + "\n"
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func wallTime(r *Results) string {
	if r.StartedAt.IsZero() || !r.FinishedAt.After(r.StartedAt) {
		return "-"
	}
	return r.FinishedAt.Sub(r.StartedAt).Round(time.Second).String()
}

type scenarioStats struct {
	name   string
	counts VerdictCounts
	conv   ConvergeStats
}

// byScenario tallies cases per scenario, in run order.
func byScenario(cases []Case) []scenarioStats {
	idx := map[string]int{}
	var groups [][]Case
	var names []string
	for _, c := range cases {
		i, ok := idx[c.Scenario]
		if !ok {
			i = len(groups)
			idx[c.Scenario] = i
			groups = append(groups, nil)
			names = append(names, c.Scenario)
		}
		groups[i] = append(groups[i], c)
	}
	out := make([]scenarioStats, len(groups))
	for i, g := range groups {
		out[i] = scenarioStats{name: names[i], counts: CountVerdicts(g), conv: Convergence(g)}
	}
	return out
}

func boldIf(n int) string {
	if n > 0 {
		return fmt.Sprintf("**%d**", n)
	}
	return "0"
}

func convP95(st ConvergeStats) string {
	s := "-"
	if st.N > 0 {
		s = FormatMs(st.P95)
	}
	if st.Never > 0 {
		s += fmt.Sprintf(" (%d never)", st.Never)
	}
	return s
}

// timelineExcerpt renders up to perSide timeline events before the first
// fault and perSide after it, one aligned line each.
func timelineExcerpt(c Case, perSide int) []string {
	_, rows := buildTimeline(c)
	if len(rows) == 0 {
		return nil
	}
	fault := -1
	for i, r := range rows {
		if r.Kind == "fault" {
			fault = i
			break
		}
	}
	lo, hi := 0, len(rows)
	if fault >= 0 {
		lo, hi = max(0, fault-perSide), min(len(rows), fault+perSide+1)
	} else if len(rows) > 2*perSide {
		lo = len(rows) - 2*perSide
	}
	var out []string
	if lo > 0 {
		out = append(out, fmt.Sprintf("… %d earlier event(s)", lo))
	}
	for _, r := range rows[lo:hi] {
		what := r.Point
		switch r.Kind {
		case "phase":
		case "fault":
			what = "FAULT"
			if r.Point != "" {
				what += " (victim's last phase " + r.Point + ")"
			}
		default:
			what = strings.ToUpper(r.Kind) + " " + what
		}
		line := fmt.Sprintf("%10s  %-10s %s", r.Rel, r.Proc, strings.TrimSpace(what))
		if r.VM != "" {
			line += "  vm=" + r.VM
		}
		if r.Note != "" {
			line += "  " + oneLine(r.Note)
		}
		out = append(out, line)
	}
	if hi < len(rows) {
		out = append(out, fmt.Sprintf("… %d later event(s)", len(rows)-hi))
	}
	return out
}

// MarkdownSummary is a compact Markdown account of a gate decision for a CI
// job summary or a PR comment: the verdict, the run, each reason the gate
// gave, and a table of the cases that need attention with how to reproduce
// them (at most limit rows; the full report.md has the rest).
func MarkdownSummary(r *Results, g GateResult, limit int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### vmchaos: %s (exit %d)\n\n", strings.ToUpper(GateCodeName(g.Code)), g.Code)
	fmt.Fprintf(&b, "Run `%s`: %s; backend %s, supervisor %s, time scale %g, seed %d; %s.\n\n", mdCode(orDefault(r.RunID, "(unnamed)")),
		mdEscape(CountVerdicts(r.Cases).String()), mdEscape(orDefault(r.Backend, "?")), mdEscape(orDefault(r.Supervisor, "?")),
		r.TimeScale, r.Seed, mdEscape(Convergence(r.Cases).String()))
	if r.Coverage != nil {
		fmt.Fprintf(&b, "%s.\n\n", mdEscape(r.Coverage.String()))
	}
	var notes []string
	for _, l := range g.Lines[:max(len(g.Lines)-1, 0)] { // the last line is the tally, said above
		if strings.HasPrefix(l, "REGRESSION") || strings.HasPrefix(l, "NOTE") || strings.HasPrefix(l, "FIXED") ||
			strings.HasPrefix(l, "convergence") || strings.Contains(l, "shard") || strings.Contains(l, "no cases") {
			notes = append(notes, l)
		}
	}
	for _, n := range notes {
		fmt.Fprintf(&b, "- %s\n", mdEscape(n))
	}
	if len(notes) > 0 {
		b.WriteString("\n")
	}
	var problems []Case
	for _, c := range r.Cases {
		if c.Problem() || c.Attempts > 1 {
			problems = append(problems, c)
		}
	}
	if len(problems) == 0 {
		return b.String()
	}
	rank := map[string]int{Fail: 0, Error: 1, Inconclusive: 2, Pass: 3}
	sort.SliceStable(problems, func(i, j int) bool { return rank[problems[i].Verdict] < rank[problems[j].Verdict] })
	b.WriteString("| verdict | case | why | reproduce |\n|---|---|---|---|\n")
	for i, c := range problems {
		if limit > 0 && i == limit {
			fmt.Fprintf(&b, "\n… and %d more; see report.md in the run dir.\n", len(problems)-limit)
			break
		}
		why := ""
		switch {
		case c.Verdict == Fail:
			why = failureSummary(c)
		case c.Verdict == Pass:
			why = fmt.Sprintf("passed only after %d attempts", c.Attempts)
		default:
			why = orDefault(c.Reason, "no reason recorded")
		}
		repro := "-"
		if c.Repro != "" {
			repro = "`" + mdCode(c.Repro) + "`"
		}
		fmt.Fprintf(&b, "| %s | `%s` | %s | %s |\n", strings.ToUpper(c.Verdict), mdCode(c.ID), mdEscape(truncate(oneLine(why), 300)), repro)
	}
	return b.String()
}
