package reports

import (
	"fmt"
	"html/template"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// Cell marks of the coverage table.
const (
	covLanded      = "✓"
	covMissing     = "✗"
	covNotRunnable = "∅"
	covNA          = "·"
)

// covMark is one cell of a rendered row: its mark and what it says on
// hover (the crediting cases, or why the host cannot run it).
type covMark struct {
	Mark, Title string
}

// covRow is one (operation, point) of the map: a cell per kind.
type covRow struct {
	Op, Point, Proc string
	Cells           []covMark
}

func (c *Coverage) rows() []covRow {
	col := map[string]int{}
	for i, k := range c.Kinds {
		col[k] = i
	}
	idx := map[[2]string]int{}
	var rows []covRow
	for _, p := range c.Cells {
		key := [2]string{p.Op, p.Point}
		i, ok := idx[key]
		if !ok {
			i = len(rows)
			idx[key] = i
			cells := make([]covMark, len(c.Kinds))
			for j := range cells {
				cells[j] = covMark{Mark: covNA, Title: "not applicable (an applies rule)"}
			}
			rows = append(rows, covRow{Op: p.Op, Point: p.Point, Proc: p.Proc, Cells: cells})
		}
		j, ok := col[p.Kind]
		if !ok {
			continue
		}
		switch {
		case len(p.CoveredBy) > 0:
			rows[i].Cells[j] = covMark{covLanded, "landed: " + strings.Join(p.CoveredBy, ", ")}
		case p.NotRunnable != "":
			rows[i].Cells[j] = covMark{covNotRunnable, "not runnable here: " + p.NotRunnable}
		default:
			rows[i].Cells[j] = covMark{covMissing, "applicable, no case landed here"}
		}
	}
	return rows
}

func (r covRow) marks() []string {
	out := make([]string, len(r.Cells))
	for i, c := range r.Cells {
		out[i] = c.Mark
	}
	return out
}

// covLegend explains the marks.
func covLegend() string {
	return fmt.Sprintf("%s landed (credited by a case whose fault landed there), %s applicable and no case landed there, %s applicable but not runnable here (the reason below), %s the kind does not apply there",
		covLanded, covMissing, covNotRunnable, covNA)
}

// countLine is "k1 N, k2 M" in the given order, zero counts left out.
func countLine(order []string, n map[string]int) string {
	var parts []string
	for _, k := range order {
		if n[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n[k]))
		}
	}
	return strings.Join(parts, ", ")
}

// byCount orders a reason count, most cells first.
func byCount(n map[string]int) []string {
	var out []string
	for k := range n {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return n[out[i]] > n[out[j]] || (n[out[i]] == n[out[j]] && out[i] < out[j]) })
	return out
}

// gapLines are the uncovered counts per kind and per operation and the
// not-runnable reasons, one line each.
func (c *Coverage) gapLines() []string {
	byKind, byOp := c.MissingBy()
	var out []string
	if len(byKind) > 0 {
		out = append(out, fmt.Sprintf("no case landed in %d cells; by kind: %s", len(c.Missing()), countLine(c.Kinds, byKind)),
			"by operation: "+countLine(c.Ops, byOp))
	}
	nr := c.NotRunnableReasons()
	for _, why := range byCount(nr) {
		out = append(out, fmt.Sprintf("not runnable here (%d cells): %s", nr[why], why))
	}
	if len(c.Outside) > 0 {
		out = append(out, fmt.Sprintf("%d landings outside the map (no cell of the case's operation or its fallbacks holds the point × kind: a kind that does not apply there, or a victim idle since an earlier operation): %s", len(c.Outside), strings.Join(c.Outside, "; ")))
	}
	return out
}

// WriteCoverageTable prints the map as text (`vmchaos points --coverage`):
// a row per (operation, point), a column per kind, then every covered cell
// with the cases that credited it, the gaps, and the figure.
func WriteCoverageTable(w io.Writer, c *Coverage) error {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "OP\tPOINT\tPROC\t%s\n", strings.Join(c.Kinds, "\t"))
	for _, r := range c.rows() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Op, r.Point, r.Proc, strings.Join(r.marks(), "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%s\ncredited cells (%d):\n", covLegend(), c.Covered)
	for _, p := range c.Cells {
		if len(p.CoveredBy) > 0 {
			fmt.Fprintf(w, "  %s %s × %s: %s\n", p.Op, p.Point, p.Kind, strings.Join(p.CoveredBy, ", "))
		}
	}
	for _, l := range c.gapLines() {
		fmt.Fprintln(w, l)
	}
	// the figure last: CI prints the tail (nightly.yml)
	_, err := fmt.Fprintln(w, c.String())
	return err
}

// coverageMarkdown is report.md's section ("" when the run has no map).
func coverageMarkdown(r *Results) string {
	c := r.Coverage
	if c == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## Phase coverage\n\n%s. Columns are the fault kinds: %s.\n\n", mdEscape(c.String()), mdEscape(covLegend()))
	for _, l := range c.gapLines() {
		fmt.Fprintf(&b, "- %s\n", mdEscape(l))
	}
	b.WriteString("\n| op | point | proc |")
	for _, k := range c.Kinds {
		fmt.Fprintf(&b, " %s |", mdEscape(k))
	}
	b.WriteString("\n|---|---|---|" + strings.Repeat("---|", len(c.Kinds)) + "\n")
	for _, row := range c.rows() {
		fmt.Fprintf(&b, "| %s | `%s` | %s | %s |\n", mdEscape(row.Op), mdCode(row.Point), row.Proc, strings.Join(row.marks(), " | "))
	}
	if len(c.Folded) > 0 {
		fmt.Fprintf(&b, "\n<details><summary>%d matrix cases folded into catalogue cases reaching the same (phase, fault kind, goal)</summary>\n\n", len(c.Folded))
		for _, f := range c.Folded {
			fmt.Fprintf(&b, "- `%s` → `%s` (%s)\n", mdCode(f.Case), mdCode(f.Into), mdEscape(f.Key))
		}
		b.WriteString("\n</details>\n")
	}
	b.WriteString("\n")
	return b.String()
}

var coverageTmpl = template.Must(template.New("coverage").Parse(`<h2 id="coverage">Phase coverage</h2>
<p>{{.C.String}}. <span class="muted">{{.Legend}}. Hover a cell for the crediting cases or the reason.</span></p>
<ul>{{range .Gaps}}<li>{{.}}</li>{{end}}</ul>
<div class="matrix"><table><tr><th>op</th><th>point</th><th>proc</th>{{range .C.Kinds}}<th class="rot"><span>{{.}}</span></th>{{end}}</tr>
{{range .Rows}}<tr><td class="muted">{{.Op}}</td><td class="scen"><code>{{.Point}}</code></td><td class="muted">{{.Proc}}</td>{{range .Cells}}<td style="text-align:center" title="{{.Title}}">{{.Mark}}</td>{{end}}</tr>
{{end}}</table></div>
<details><summary>{{.C.Covered}} credited cells and their cases</summary><ul>
{{range .C.Cells}}{{if .CoveredBy}}<li>{{.Op}} <code>{{.Point}}</code> × {{.Kind}}: {{range $i, $c := .CoveredBy}}{{if $i}}, {{end}}<code>{{$c}}</code>{{end}}</li>
{{end}}{{end}}</ul></details>
{{with .C.Folded}}<details><summary>{{len .}} matrix cases folded into catalogue cases reaching the same (phase, fault kind, goal)</summary><ul>
{{range .}}<li><code>{{.Case}}</code> → <code>{{.Into}}</code> <span class="muted">({{.Key}})</span></li>
{{end}}</ul></details>{{end}}
`))

// coverageHTML is report.html's section (empty when the run has no map).
func coverageHTML(r *Results) (template.HTML, error) {
	if r.Coverage == nil {
		return "", nil
	}
	var b strings.Builder
	err := coverageTmpl.Execute(&b, map[string]any{"C": r.Coverage, "Rows": r.Coverage.rows(),
		"Legend": covLegend(), "Gaps": r.Coverage.gapLines()})
	if err != nil {
		return "", fmt.Errorf("coverage section: %w", err)
	}
	return template.HTML(b.String()), nil
}
