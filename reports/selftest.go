package reports

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/regress"
)

// SelftestRow is one (bug, scenario) check of `vmchaos selftest`: the
// scenario run with the bug switched on must fail naming the bug's invariant,
// and run without it must pass. OK is the caller's judgement of both.
type SelftestRow struct {
	Bug               string `json:"bug"`
	Seed              string `json:"seed"`
	Scenario          string `json:"scenario"`
	WithBugVerdict    string `json:"with_bug_verdict"`
	WithBugInvariant  string `json:"with_bug_invariant"` // violated invariant(s) reported with the bug on
	WithoutBugVerdict string `json:"without_bug_verdict"`
	OK                bool   `json:"ok"`
	Repro             string `json:"repro,omitempty"` // command reproducing the with-bug run
	Note              string `json:"note,omitempty"`  // why a row is not OK, or anything else worth saying
	// Rate is the row measured over --count N runs with the bug on and N
	// with it off (detection.go); with N > 1 the verdict fields above are
	// those of a representative run: the first that caught the bug (else
	// the first done), and the first without it that did not pass (else
	// the first).
	Rate *DetectionRate `json:"rate,omitempty"`
}

// Selftest files inside the selftest report dir.
const (
	SelftestMarkdownFile = "selftest.md"
	SelftestJSONFile     = "selftest.json"
)

// SelftestTally counts rows and bugs: a bug is caught when it has rows and
// all of them are OK.
type SelftestTally struct {
	Rows, RowsOK, Bugs, BugsCaught int
	Missed                         []string // bugs with a row that is not OK
	// Partial lists the rows that hold but did not catch their bug in every
	// run ("bug/scenario 3/5"): they are not counted in BugsCaught.
	Partial  []string
	Untested []string // bugs of regress.Bugs without any row
}

// TallySelftest computes the tally over rows, listing every known bug that
// has no row as untested.
func TallySelftest(rows []SelftestRow) SelftestTally {
	var t SelftestTally
	byBug := map[string][]SelftestRow{}
	var order []string
	for _, r := range rows {
		t.Rows++
		if r.OK {
			t.RowsOK++
		}
		if _, ok := byBug[r.Bug]; !ok {
			order = append(order, r.Bug)
		}
		byBug[r.Bug] = append(byBug[r.Bug], r)
	}
	for _, b := range order {
		t.Bugs++
		all, full := true, true
		for _, r := range byBug[b] {
			all = all && r.OK
			if r.OK && r.Rate != nil && !r.Rate.Full() {
				full = false
				t.Partial = append(t.Partial, fmt.Sprintf("%s/%s %d/%d", r.Bug, r.Scenario, r.Rate.Caught, r.Rate.Runs))
			}
		}
		switch {
		case !all:
			t.Missed = append(t.Missed, b)
		case full:
			t.BugsCaught++
		}
	}
	for _, b := range regress.Bugs {
		if _, ok := byBug[b.Name]; !ok {
			t.Untested = append(t.Untested, b.Name)
		}
	}
	return t
}

// OK says whether the self-test passed: every row OK and at least one row.
func (t SelftestTally) OK() bool { return t.Rows > 0 && t.RowsOK == t.Rows }

func (t SelftestTally) String() string {
	s := fmt.Sprintf("selftest: %d/%d bugs caught, %d/%d checks ok", t.BugsCaught, t.Bugs, t.RowsOK, t.Rows)
	if len(t.Partial) > 0 {
		s += "; caught in some runs only: " + strings.Join(t.Partial, ", ")
	}
	if len(t.Missed) > 0 {
		s += "; MISSED: " + strings.Join(t.Missed, ", ")
	}
	if len(t.Untested) > 0 {
		s += "; not run: " + strings.Join(t.Untested, ", ")
	}
	return s
}

// expectedInvariant is the invariant regress.Bugs says the bug breaks.
func expectedInvariant(bug string) string {
	if b := regress.Lookup(bug); b != nil {
		return b.Invariant
	}
	return "?"
}

// FormatSelftest writes the terminal table of a self-test and its tally.
// With --count N above 1 it is the rates table instead (detection.go).
func FormatSelftest(w io.Writer, rows []SelftestRow) error {
	if hasRates(rows) {
		if err := formatRates(w, rows); err != nil {
			return err
		}
		_, err := fmt.Fprintln(w, TallySelftest(rows))
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUG\tSEED\tSCENARIO\tWITH BUG\tVIOLATED (EXPECTED)\tWITHOUT BUG\tOK")
	for _, r := range rows {
		ok := "ok"
		if !r.OK {
			ok = "MISSED"
			if r.Note != "" {
				ok += ": " + oneLine(r.Note)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s (%s)\t%s\t%s\n", r.Bug, r.Seed, r.Scenario, orDefault(r.WithBugVerdict, "-"),
			orDefault(r.WithBugInvariant, "-"), expectedInvariant(r.Bug), orDefault(r.WithoutBugVerdict, "-"), ok)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, TallySelftest(rows))
	return err
}

// WriteSelftest writes selftest.md (the track-record table) and selftest.json
// into dir.
func WriteSelftest(dir string, rows []SelftestRow) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write selftest: %w", err)
	}
	t := TallySelftest(rows)
	doc := struct {
		OK       bool          `json:"ok"`
		Summary  string        `json:"summary"`
		Untested []string      `json:"untested,omitempty"`
		Rows     []SelftestRow `json:"rows"`
	}{t.OK(), t.String(), t.Untested, rows}
	if doc.Rows == nil {
		doc.Rows = []SelftestRow{}
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("write selftest: %w", err)
	}
	if err := durable.WriteFile(filepath.Join(dir, SelftestJSONFile), append(data, '\n'), 0o644); err != nil {
		return err
	}
	if err := durable.WriteFile(filepath.Join(dir, SelftestMarkdownFile), []byte(SelftestMarkdown(rows)), 0o644); err != nil {
		return err
	}
	// When the run's results are already there, re-render its reports so
	// they carry the selftest table whichever was written first.
	if _, err := os.Stat(filepath.Join(dir, ResultsFile)); err == nil {
		r, err := Load(dir)
		if err != nil {
			return fmt.Errorf("write selftest: %w", err)
		}
		return Render(dir, r)
	}
	return nil
}

// SelftestMarkdown renders the self-test as a Markdown page: the track
// record (one line per bug: what it did, the scenario that catches it, the
// invariant it breaks, a command that reproduces it — the README's table),
// then every check, then notes on the checks that missed.
func SelftestMarkdown(rows []SelftestRow) string {
	var b strings.Builder
	t := TallySelftest(rows)
	status := "PASS"
	if !t.OK() {
		status = "FAIL"
	}
	fmt.Fprintf(&b, "# vmchaos selftest — %s\n\n%s.\n\n", status, mdEscape(t.String()))
	b.WriteString("Each historical bug is switched back on (`VMCHAOS_REGRESS=<bug>`); its scenarios must fail naming the invariant the bug breaks, and pass with the switch off.\n\n")

	b.WriteString("## Track record\n\n")
	selftestTrackRecord(&b, rows)
	if hasRates(rows) {
		b.WriteString("\n")
		ratesMarkdown(&b, rows)
	}
	b.WriteString("\n## Every check\n\n")
	b.WriteString("| bug | seed | scenario | with bug | violated invariant | expected | without bug | ok |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		ok := "ok"
		if !r.OK {
			ok = "**MISSED**"
		}
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s | %s | %s | %s | %s |\n", mdCode(r.Bug), mdEscape(r.Seed), mdCode(r.Scenario),
			mdEscape(orDefault(r.WithBugVerdict, "-")), mdEscape(orDefault(r.WithBugInvariant, "-")), mdEscape(expectedInvariant(r.Bug)),
			mdEscape(orDefault(r.WithoutBugVerdict, "-")), ok)
	}
	var missed []SelftestRow
	for _, r := range rows {
		if !r.OK {
			missed = append(missed, r)
		}
	}
	if len(missed) > 0 {
		b.WriteString("\n## Missed\n\n")
		for _, r := range missed {
			fmt.Fprintf(&b, "### %s / %s\n\n", mdEscape(r.Bug), mdEscape(r.Scenario))
			fmt.Fprintf(&b, "With the bug on the verdict was %s (violated: %s; expected a fail naming `%s`); without it %s.\n\n",
				mdEscape(orDefault(r.WithBugVerdict, "-")), mdEscape(orDefault(r.WithBugInvariant, "none")), mdCode(expectedInvariant(r.Bug)),
				mdEscape(orDefault(r.WithoutBugVerdict, "-")))
			if r.Note != "" {
				fmt.Fprintf(&b, "Note: %s\n\n", mdEscape(r.Note))
			}
			if r.Repro != "" {
				b.WriteString(codeBlock("sh", r.Repro))
				b.WriteString("\n")
			}
		}
	}
	return b.String()
}

// selftestTrackRecord writes the track-record table: one line per bug with
// what it did, the scenario that catches it, the invariant it breaks and a
// command that reproduces it (the README's table).
func selftestTrackRecord(b *strings.Builder, rows []SelftestRow) {
	t := TallySelftest(rows)
	b.WriteString("| bug | seed | what the bug did | caught by | invariant | reproduce |\n|---|---|---|---|---|---|\n")
	seen := map[string]bool{}
	for _, r := range rows {
		if seen[r.Bug] {
			continue
		}
		seen[r.Bug] = true
		best := r
		for _, o := range rows {
			if o.Bug == r.Bug && o.OK {
				best = o
				break
			}
		}
		what := ""
		if bug := regress.Lookup(r.Bug); bug != nil {
			what = bug.What
		}
		caught := "`" + mdCode(best.Scenario) + "`"
		switch {
		case !best.OK:
			caught = "**not caught** (" + caught + ")"
		case best.Rate != nil && best.Rate.Count > 1:
			// the rate, never rounded: 19/20 is not "caught"
			caught += " " + mdEscape(best.Rate.RateLabel())
		}
		repro := "-"
		if best.Repro != "" {
			repro = "`" + mdCode(best.Repro) + "`"
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %s | %s | %s |\n", mdCode(r.Bug), mdEscape(r.Seed), mdEscape(what), caught,
			mdEscape(expectedInvariant(r.Bug)), repro)
	}
	for _, name := range t.Untested {
		fmt.Fprintf(b, "| `%s` | %s | %s | **not run** | %s | - |\n", mdCode(name), mdEscape(regress.Lookup(name).Seed),
			mdEscape(regress.Lookup(name).What), mdEscape(expectedInvariant(name)))
	}
}

// LoadSelftest reads the rows of selftest.json in dir.
func LoadSelftest(dir string) ([]SelftestRow, error) {
	data, err := os.ReadFile(filepath.Join(dir, SelftestJSONFile))
	if err != nil {
		return nil, fmt.Errorf("load selftest: %w", err)
	}
	var doc struct {
		Rows []SelftestRow `json:"rows"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("load selftest %s: %w", dir, err)
	}
	return doc.Rows, nil
}
