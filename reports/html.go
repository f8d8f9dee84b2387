package reports

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"math"
	"sort"
	"strings"
)

//go:embed report.html.tmpl
var htmlTemplateText string

var htmlTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"ms":       FormatMs,
	"upper":    strings.ToUpper,
	"vclass":   verdictClass,
	"num":      func(v float64) string { return fmt.Sprintf("%+.6g", v) },
	"f":        func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"runtally": RunTally,
	"inc":      func(i int) int { return i + 1 },
	"wlsvg":    WorkloadSVG,
	"wltext":   WorkloadTimelineText,
}).Parse(htmlTemplateText))

type htmlCase struct {
	Case
	Anchor     string
	Failed     []string
	Open       bool
	Timeline   *svgTimeline
	Events     []timelineRow
	Injections []string
	LogNames   []string
	Why        string   // one line: why this case is not a plain pass
	Held       []string // invariants that held
}

type matrixCell struct {
	Anchor, Class, Title string
	Label                string // tiles show the case id
}

type matrixRow struct {
	Scenario string
	Cells    [][]matrixCell // one slot per column
}

type htmlData struct {
	R         *Results
	Title     string
	Gate      GateResult
	GateName  string
	Counts    VerdictCounts
	Conv      ConvergeStats
	Meta      [][2]string
	Broke     []htmlGroup
	Cases     []htmlCase
	Problems  []htmlCase
	Columns   []string
	Matrix    []matrixRow
	Tiles     []matrixCell
	Histogram *svgHistogram
	Selftest  *htmlSelftest
	Sweeps    []svgSweep
	Coverage  template.HTML // the phase-coverage section (coverage.go)
}

type htmlGroup struct {
	Name  string
	Cases []htmlCase
}

// HTML renders report.html: one self-contained page (inline CSS, inline SVG,
// a few lines of inline script for copy buttons; no external asset) with the
// verdict, what broke, an offset × scenario matrix coloured by verdict, the
// convergence-time histogram, the table of cases, and per case its details
// with an SVG timeline of phases, the fault and the convergence point.
// html/template escapes every value.
func HTML(r *Results) ([]byte, error) { return renderHTML(r, nil) }

type htmlSelftest struct {
	Tally SelftestTally
	OK    bool
	Rows  []htmlSelftestRow
}

type htmlSelftestRow struct {
	SelftestRow
	Expected string
}

// renderHTML is HTML with a selftest section when rows are given.
func renderHTML(r *Results, selftest []SelftestRow) ([]byte, error) {
	d := htmlData{
		R:      r,
		Title:  "vmchaos report — " + orDefault(r.RunID, "(unnamed run)"),
		Gate:   Gate(r, nil, DefaultGateOptions()),
		Counts: CountVerdicts(r.Cases),
		Conv:   Convergence(r.Cases),
	}
	d.GateName = GateCodeName(d.Gate.Code)
	var err error
	if d.Coverage, err = coverageHTML(r); err != nil {
		return nil, err
	}
	d.Selftest = htmlSelftestOf(selftest)
	d.Meta = htmlMeta(r)
	anchorOf := d.addCases(r)
	d.addBroke(r, anchorOf)
	d.addFigures(r, anchorOf)
	return executeHTML(d)
}

// htmlSelftestOf is the selftest section, nil when there are no rows.
func htmlSelftestOf(selftest []SelftestRow) *htmlSelftest {
	if len(selftest) == 0 {
		return nil
	}
	st := &htmlSelftest{Tally: TallySelftest(selftest)}
	st.OK = st.Tally.OK()
	for _, row := range selftest {
		st.Rows = append(st.Rows, htmlSelftestRow{SelftestRow: row, Expected: expectedInvariant(row.Bug)})
	}
	return st
}

// htmlMeta lists how the run was made; optional entries appear only when set.
func htmlMeta(r *Results) [][2]string {
	meta := [][2]string{{"backend", r.Backend}, {"supervisor", r.Supervisor}, {"time scale", fmt.Sprint(r.TimeScale)},
		{"seed", fmt.Sprint(r.Seed)}, {"host", r.Host}, {"started", formatTime(r.StartedAt)}, {"wall time", wallTime(r)}}
	for _, e := range [][2]string{{"build", r.Build}, {"shard", r.Shard}, {"shards merged", strings.Join(r.Shards, ", ")},
		{"MISSING shards", strings.Join(r.MissingShards, ", ")}, {"label filter", r.Filter}, {"regress switches", strings.Join(r.Regress, ", ")}} {
		if e[1] != "" {
			meta = append(meta, e)
		}
	}
	return meta
}

// addCases adds every case, and the problems among them, and returns each
// case's anchor by id.
func (d *htmlData) addCases(r *Results) map[string]string {
	anchorOf := map[string]string{}
	for i, c := range r.Cases {
		hc := newHTMLCase(i, c)
		anchorOf[c.ID] = hc.Anchor
		d.Cases = append(d.Cases, hc)
		if c.Problem() || c.Attempts > 1 {
			d.Problems = append(d.Problems, hc)
		}
	}
	return anchorOf
}

// newHTMLCase is case number i as the page shows it: its timeline, its
// injections and logs, the invariants that held, and why it did not pass.
func newHTMLCase(i int, c Case) htmlCase {
	hc := htmlCase{Case: c, Anchor: fmt.Sprintf("case-%d", i), Failed: c.FailedInvariants(), Open: c.Problem()}
	hc.Timeline, hc.Events = buildTimeline(c)
	if !c.Problem() && c.Attempts <= 1 {
		// A clean pass keeps its timeline picture; its event list
		// stays in results.json and the trace, which keeps the page
		// light for a catalogue of hundreds of cases.
		hc.Events = nil
	}
	for _, inj := range c.Injections {
		hc.Injections = append(hc.Injections, fmt.Sprintf("%s (%s): %s", inj.Fault, inj.Trigger, injectionText(inj)))
	}
	hc.LogNames = sortedKeys(c.Logs)
	for _, inv := range c.Invariants {
		if inv.OK {
			hc.Held = append(hc.Held, inv.Name)
		}
	}
	switch {
	case c.Verdict == Fail:
		hc.Why = oneLine(failureSummary(c))
	case c.Verdict == Pass && c.Attempts > 1:
		hc.Why = fmt.Sprintf("passed only after %d attempts", c.Attempts)
	case c.Verdict != Pass:
		hc.Why = oneLine(orDefault(c.Reason, "no reason recorded"))
	}
	return hc
}

// addBroke groups the failing cases by violated invariant.
func (d *htmlData) addBroke(r *Results, anchorOf map[string]string) {
	for _, g := range byInvariant(r.Cases) {
		hg := htmlGroup{Name: g.name}
		for _, c := range g.cases {
			hg.Cases = append(hg.Cases, htmlCase{Case: c, Anchor: anchorOf[c.ID]})
		}
		d.Broke = append(d.Broke, hg)
	}
}

// addFigures lays out the matrix or tiles, the histogram and the sweeps.
func (d *htmlData) addFigures(r *Results, anchorOf map[string]string) {
	// Scenarios run as several cases (offsets, park points) form the
	// offset × scenario matrix;
	// one-off scenarios would only add empty rows to it, so they get a wall
	// of tiles instead.
	perScenario := map[string]int{}
	for _, c := range r.Cases {
		perScenario[c.Scenario]++
	}
	var swept []Case
	for _, c := range r.Cases {
		if perScenario[c.Scenario] > 1 {
			swept = append(swept, c)
			continue
		}
		d.Tiles = append(d.Tiles, matrixCell{Anchor: anchorOf[c.ID], Class: "tile v-" + verdictClass(c.Verdict), Title: cellTitle(c), Label: c.ID})
	}
	d.Columns, d.Matrix = buildMatrix(swept, anchorOf)
	d.Histogram = buildHistogram(r.Cases)
	d.Sweeps = buildSweeps(r.Cases, anchorOf)
}

// executeHTML renders the page from d.
func executeHTML(d htmlData) ([]byte, error) {
	var buf bytes.Buffer
	if err := htmlTemplate.Execute(&buf, d); err != nil {
		return nil, fmt.Errorf("render html: %w", err)
	}
	// Control characters (from a process's output in some evidence) are
	// parse errors in HTML; the page shows U+FFFD in their place.
	return bytes.Map(func(r rune) rune {
		if r < 0x20 && r != '\n' && r != '\t' && r != '\r' || r == 0x7f {
			return '\uFFFD'
		}
		return r
	}, buf.Bytes()), nil
}

// buildMatrix lays cases out by scenario (rows, in run order) and offset
// (columns: "park" first, then offsets ascending). A cell may hold several
// cases (e.g. park cases at different points of one scenario).
func buildMatrix(cases []Case, anchorOf map[string]string) ([]string, []matrixRow) {
	type col struct {
		label string
		park  bool
		ms    float64
	}
	colIdx := map[string]int{}
	var cols []col
	rowIdx := map[string]int{}
	var rows []matrixRow
	for _, c := range cases {
		l := c.OffsetLabel()
		if _, ok := colIdx[l]; !ok {
			colIdx[l] = len(cols)
			cols = append(cols, col{l, l == "park", c.OffsetMs})
		}
		if _, ok := rowIdx[c.Scenario]; !ok {
			rowIdx[c.Scenario] = len(rows)
			rows = append(rows, matrixRow{Scenario: c.Scenario})
		}
	}
	sort.SliceStable(cols, func(a, b int) bool {
		if cols[a].park != cols[b].park {
			return cols[a].park
		}
		if math.IsNaN(cols[a].ms) || math.IsNaN(cols[b].ms) {
			return cols[a].label < cols[b].label
		}
		return cols[a].ms < cols[b].ms
	})
	labels := make([]string, len(cols))
	for i, c := range cols {
		colIdx[c.label] = i
		labels[i] = c.label
	}
	for i := range rows {
		rows[i].Cells = make([][]matrixCell, len(cols))
	}
	for _, c := range cases {
		row := &rows[rowIdx[c.Scenario]]
		j := colIdx[c.OffsetLabel()]
		title := cellTitle(c)
		cls := "cell v-" + verdictClass(c.Verdict)
		if c.Attempts > 1 {
			cls += " flaky"
		}
		row.Cells[j] = append(row.Cells[j], matrixCell{Anchor: anchorOf[c.ID], Class: cls, Title: title})
	}
	return labels, rows
}

// verdictClass maps a verdict to a CSS class suffix; anything unknown is an
// error, so a hostile verdict string never reaches the class attribute.
func verdictClass(v string) string {
	switch v {
	case Pass, Fail, Inconclusive, Flaky:
		return v
	}
	return "error"
}

// cellTitle is the hover text of a case's matrix cell or tile.
func cellTitle(c Case) string {
	title := fmt.Sprintf("%s: %s, converge %s", c.ID, c.Verdict, FormatMs(c.ConvergeMs))
	if f := c.FailedInvariants(); len(f) > 0 {
		title += ", violated " + strings.Join(f, ", ")
	}
	if c.Verdict == Inconclusive && c.Reason != "" {
		title += ": " + oneLine(c.Reason)
	}
	if c.Attempts > 1 {
		title += fmt.Sprintf(" (%d attempts)", c.Attempts)
	}
	return title
}
