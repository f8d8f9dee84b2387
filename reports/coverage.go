package reports

import (
	"fmt"
	"html/template"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// Coverage is the phase-coverage map of a run (issue #18): for every
// applicable (failpoint × fault kind) pair of the generated matrix, the
// cases whose fault landed there. A pair counts as covered only through a
// case whose every injection landed (a fault that missed its phase covers
// nothing), whatever that case's verdict.
type Coverage struct {
	Applicable int            `json:"applicable"` // pairs of the matrix (point × kind, exclusion rules applied)
	Covered    int            `json:"covered"`
	Percent    float64        `json:"percent"` // 100 × covered / applicable
	Kinds      []string       `json:"kinds"`   // the matrix's fault kinds, in table order
	Pairs      []CoveragePair `json:"pairs"`
	Folded     []CoverageFold `json:"folded,omitempty"` // matrix cases not generated: a catalogue case reaches the same (phase, kind, goal)
}

// CoveragePair is one applicable pair and the cases that landed on it.
type CoveragePair struct {
	Point     string   `json:"point"`
	Proc      string   `json:"proc"`
	Kind      string   `json:"kind"`
	CoveredBy []string `json:"covered_by,omitempty"`
}

// CoverageFold says a matrix case was folded into a catalogue case.
type CoverageFold struct {
	Case string `json:"case"`
	Into string `json:"into"`
	Key  string `json:"key"` // phase × kind → goal
}

// ComputeCoverage fills the map from the applicable pairs and the run's
// cases (each carrying its CoverageKind and LandedPhase).
func ComputeCoverage(pairs []CoveragePair, kinds []string, folds []CoverageFold, cases []Case) *Coverage {
	cov := &Coverage{Kinds: append([]string(nil), kinds...), Folded: append([]CoverageFold(nil), folds...)}
	by := map[[2]string][]string{}
	for _, c := range cases {
		if c.CoverageKind == "" || !allLanded(c) {
			continue
		}
		k := [2]string{c.LandedPhase, c.CoverageKind}
		by[k] = append(by[k], c.ID)
	}
	for _, p := range pairs {
		p.CoveredBy = nil
		if ids := by[[2]string{p.Point, p.Kind}]; len(ids) > 0 {
			p.CoveredBy = append([]string(nil), ids...)
			sort.Strings(p.CoveredBy)
			cov.Covered++
		}
		cov.Pairs = append(cov.Pairs, p)
	}
	cov.Applicable = len(cov.Pairs)
	if cov.Applicable > 0 {
		cov.Percent = 100 * float64(cov.Covered) / float64(cov.Applicable)
	}
	return cov
}

// allLanded: the case injected at least one fault and every one landed.
func allLanded(c Case) bool {
	if len(c.Injections) == 0 {
		return false
	}
	for _, in := range c.Injections {
		if !in.Landed {
			return false
		}
	}
	return true
}

// Recompute is the map over other cases (report merge: the shards' pairs,
// the merged cases).
func (c *Coverage) Recompute(cases []Case) *Coverage {
	if c == nil {
		return nil
	}
	return ComputeCoverage(c.Pairs, c.Kinds, c.Folded, cases)
}

// String is the gate summary's line.
func (c *Coverage) String() string {
	return fmt.Sprintf("phase coverage %.1f%% (%d of %d applicable point × fault-kind pairs landed)", c.Percent, c.Covered, c.Applicable)
}

// Missing lists the applicable pairs no case landed on.
func (c *Coverage) Missing() []CoveragePair {
	var out []CoveragePair
	for _, p := range c.Pairs {
		if len(p.CoveredBy) == 0 {
			out = append(out, p)
		}
	}
	return out
}

// covRow is one failpoint of the map: a cell per kind.
type covRow struct {
	Point, Proc string
	Cells       []string // "✓" landed, "✗" applicable and never landed, "" not applicable
}

// Cell marks of the coverage table.
const (
	covLanded  = "✓"
	covMissing = "✗"
	covNA      = "·"
)

func (c *Coverage) rows() []covRow {
	col := map[string]int{}
	for i, k := range c.Kinds {
		col[k] = i
	}
	idx := map[string]int{}
	var rows []covRow
	for _, p := range c.Pairs {
		i, ok := idx[p.Point]
		if !ok {
			i = len(rows)
			idx[p.Point] = i
			cells := make([]string, len(c.Kinds))
			for j := range cells {
				cells[j] = covNA
			}
			rows = append(rows, covRow{Point: p.Point, Proc: p.Proc, Cells: cells})
		}
		j, ok := col[p.Kind]
		if !ok {
			continue
		}
		rows[i].Cells[j] = covMissing
		if len(p.CoveredBy) > 0 {
			rows[i].Cells[j] = covLanded
		}
	}
	return rows
}

// WriteCoverageTable prints the map as text (`vmchaos points --coverage`).
func WriteCoverageTable(w io.Writer, c *Coverage) error {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "POINT\tPROC\t%s\n", strings.Join(c.Kinds, "\t"))
	for _, r := range c.rows() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Point, r.Proc, strings.Join(r.Cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%s landed, %s applicable but never landed in this run, %s not applicable (an exclusion rule)\n", covLanded, covMissing, covNA)
	fmt.Fprintln(w, c.String())
	if miss := c.Missing(); len(miss) > 0 {
		fmt.Fprintf(w, "never landed (%d):\n", len(miss))
		for _, p := range miss {
			fmt.Fprintf(w, "  %s × %s\n", p.Point, p.Kind)
		}
	}
	return nil
}

// coverageMarkdown is report.md's section ("" when the run has no map).
func coverageMarkdown(r *Results) string {
	c := r.Coverage
	if c == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## Phase coverage\n\n%s. Columns are the matrix's fault kinds: %s landed in this run, %s applicable but never landed, %s not applicable.\n\n",
		mdEscape(c.String()), covLanded, covMissing, covNA)
	b.WriteString("| point | proc |")
	for _, k := range c.Kinds {
		fmt.Fprintf(&b, " %s |", mdEscape(k))
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(c.Kinds)) + "\n")
	for _, row := range c.rows() {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", mdCode(row.Point), row.Proc, strings.Join(row.Cells, " | "))
	}
	if miss := c.Missing(); len(miss) > 0 {
		fmt.Fprintf(&b, "\nNever landed (%d): ", len(miss))
		for i, p := range miss {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "`%s` × %s", mdCode(p.Point), mdEscape(p.Kind))
		}
		b.WriteString(".\n")
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
<p>{{.C.String}}. <span class="muted">{{.Landed}} landed in this run, {{.Missing}} applicable but never landed, {{.NA}} not applicable (an exclusion rule).</span></p>
<div class="matrix"><table><tr><th>point</th><th>proc</th>{{range .C.Kinds}}<th class="rot"><span>{{.}}</span></th>{{end}}</tr>
{{range .Rows}}<tr><td class="scen"><code>{{.Point}}</code></td><td class="muted">{{.Proc}}</td>{{range .Cells}}<td style="text-align:center">{{.}}</td>{{end}}</tr>
{{end}}</table></div>
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
		"Landed": covLanded, "Missing": covMissing, "NA": covNA})
	if err != nil {
		return "", fmt.Errorf("coverage section: %w", err)
	}
	return template.HTML(b.String()), nil
}
