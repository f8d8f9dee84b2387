package doccheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/scenarios"
)

// root is the repository root, seen from this package's directory.
const root = "../.."

// faultKinds returns the fault kinds a scenario may name and the injector's
// own kinds. It is the one place that reads them, so a move of these lists
// (a registry of kinds) changes this function only.
func faultKinds() (catalogue, injectorKinds int) {
	return len(scenarios.FaultKinds), len(injector.FaultKinds)
}

// casesMatching counts the fake-backend cases a label filter selects, the
// way `vmchaos run --list --label-filter EXPR` does (scenarios.Expand, then
// scenarios.Filter).
func casesMatching(t *testing.T, filter string) int {
	t.Helper()
	all, err := scenarios.Expand("fake")
	if err != nil {
		t.Fatalf("expand the catalogue: %v", err)
	}
	cases, err := scenarios.Filter(all, filter)
	if err != nil {
		t.Fatalf("filter %q: %v", filter, err)
	}
	return len(cases)
}

// codeCounts is every count the docs may state, with its value from the code
// and the phrases that state it (docs/architecture.md, "Counts the docs state").
func codeCounts(t *testing.T) []Count {
	t.Helper()
	kinds, injKinds := faultKinds()
	perProc := map[string]int{}
	for _, p := range failpoint.Catalogue {
		perProc[p.Proc]++
	}
	counts := []Count{
		{"bugs", len(regress.Bugs), []*regexp.Regexp{
			Phrase(`\b(\d+) (?:planted |historical )?bugs\b`), Phrase(`\b(\d+) selftest rows\b`)}},
		{"fast cases", casesMatching(t, "speed:fast"), []*regexp.Regexp{
			Phrase(`\b(\d+) fast cases\b`), Phrase(`\bfast subset \((\d+) cases\)`)}},
		{"make chaos cases", casesMatching(t, "!speed:nightly"), []*regexp.Regexp{
			Phrase("`make chaos` runs ([0-9,]+) cases"), Phrase("\\b([0-9,]+) cases in `make chaos`")}},
		{"catalogue cases", casesMatching(t, ""), []*regexp.Regexp{
			Phrase("`make chaos-nightly` runs ([0-9,]+) cases"), Phrase(`\bwhole catalogue is ([0-9,]+) cases\b`)}},
		{"fault kinds", kinds, []*regexp.Regexp{Phrase(`\b(\d+) (?:catalogue )?fault kinds\b`)}},
		{"injector fault kinds", injKinds, []*regexp.Regexp{Phrase(`\b(\d+) injector fault kinds\b`)}},
		{"matrix kinds", len(scenarios.MatrixKinds), []*regexp.Regexp{Phrase(`\b(\d+) matrix kinds\b`)}},
		{"applicable pairs", len(scenarios.MatrixPairs()), []*regexp.Regexp{
			Phrase(`\b(\d+) applicable (?:\(point × kind\) )?pairs\b`)}},
		// the coverage denominator (scenarios/coverage.go), not the matrix's pairs
		{"coverage cells", len(scenarios.CoverageCells()), []*regexp.Regexp{
			Phrase(`\b([0-9,]+) applicable \(operation × point × fault-kind\) cells\b`)}},
		{"failpoints", len(failpoint.Catalogue), []*regexp.Regexp{
			Phrase(`\b(\d+) (?:named )?failpoints\b`), Phrase(`\b(\d+) named phases\b`)}},
	}
	for _, proc := range []string{"vmctl", "nodeagent", "fakech"} {
		counts = append(counts, Count{proc + " failpoints", perProc[proc], []*regexp.Regexp{
			Phrase(`\b(\d+) ` + proc + ` (?:fail)?points\b`)}})
	}
	return counts
}

// statedIn says where each count must be stated at least once, so the check
// cannot pass because a doc stopped stating a number at all.
var statedIn = map[string]string{
	"bugs":                 "README.md",
	"fast cases":           "README.md",
	"make chaos cases":     "README.md",
	"catalogue cases":      "docs/scenarios.md",
	"fault kinds":          "docs/architecture.md",
	"injector fault kinds": "docs/architecture.md",
	"matrix kinds":         "docs/scenarios.md",
	"applicable pairs":     "docs/scenarios.md",
	"coverage cells":       "docs/scenarios.md",
	"failpoints":           "docs/architecture.md",
	"vmctl failpoints":     "docs/vmctl.md",
	"nodeagent failpoints": "docs/nodeagent.md",
	"fakech failpoints":    "docs/fakech.md",
}

// readDocs returns README.md and docs/*.md by their path from the root.
func readDocs(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatalf("glob docs: %v", err)
	}
	paths = append(paths, filepath.Join(root, "README.md"))
	docs := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		rel, _ := filepath.Rel(root, p)
		docs[filepath.ToSlash(rel)] = string(b)
	}
	if len(docs) < 2 {
		t.Fatalf("found %d docs under %s: the check would have nothing to read", len(docs), root)
	}
	return docs
}

func TestDocsStateTheCodesCounts(t *testing.T) {
	counts := codeCounts(t)
	docs := readDocs(t)
	stated := map[string]int{}
	for file, text := range docs {
		for _, s := range Find(file, text, counts) {
			if s.Wrong() {
				t.Errorf("%s", s)
			}
			if statedIn[s.Count] == file {
				stated[s.Count]++
			}
		}
	}
	for _, c := range counts {
		file, ok := statedIn[c.Name]
		if !ok {
			t.Errorf("count %q has no doc that must state it (statedIn)", c.Name)
			continue
		}
		if _, ok := docs[file]; !ok {
			t.Errorf("count %q must be stated in %s, which does not exist", c.Name, file)
		} else if stated[c.Name] == 0 {
			t.Errorf("%s states no %s (the code has %d; phrases %v)", file, c.Name, c.Want, c.Phrases)
		}
	}
}

// trackRow is a row of a track-record table: "| `bug-name` | seed | ...".
var trackRow = regexp.MustCompile("(?m)^\\| `([a-z0-9-]+)` \\| .*$")

// TestTrackRecordListsEveryBug: the "Track record" tables of the README and
// of selftest.md are the regression library, row for row, each row with the
// bug's seed, its invariant and a scenario that targets it.
func TestTrackRecordListsEveryBug(t *testing.T) {
	docs := readDocs(t)
	for _, file := range []string{"README.md", "docs/selftest.md"} {
		missing, extra, wrong := trackRecordDiff(docs[file])
		if len(missing)+len(extra)+len(wrong) > 0 {
			t.Errorf("%s track record: missing %v, not in regress.Bugs %v, rows that disagree with the code %v",
				file, missing, extra, wrong)
		}
	}
}

// trackRecord returns the section of a doc under its "Track record" heading,
// up to the next heading.
func trackRecord(text string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "#") {
			in = strings.Contains(strings.ToLower(line), "track record")
			continue
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// trackRecordDiff compares a doc's track record with regress.Bugs: bugs it
// lacks, rows naming no known bug, and rows whose seed, invariant or
// scenario is not the code's.
func trackRecordDiff(text string) (missing, extra, wrong []string) {
	rows := map[string][]string{}
	for _, m := range trackRow.FindAllStringSubmatch(trackRecord(text), -1) {
		var cells []string
		for _, c := range strings.Split(strings.Trim(m[0], "| "), " | ") {
			cells = append(cells, strings.Trim(c, "`"))
		}
		rows[m[1]] = cells
	}
	known := map[string]bool{}
	for _, b := range regress.Bugs {
		known[b.Name] = true
		cells, ok := rows[b.Name]
		if !ok {
			missing = append(missing, b.Name)
			continue
		}
		if !slices.Contains(cells, b.Seed) || !slices.Contains(cells, b.Invariant) ||
			!slices.ContainsFunc(cells, func(c string) bool { return slices.Contains(scenarios.ScenariosTargeting(b.Name), c) }) {
			wrong = append(wrong, fmt.Sprintf("%s (want seed %q, invariant %q, one of %v)",
				b.Name, b.Seed, b.Invariant, scenarios.ScenariosTargeting(b.Name)))
		}
	}
	for name := range rows {
		if !known[name] {
			extra = append(extra, name)
		}
	}
	return missing, extra, wrong
}

// TestCheckerCatchesAHandEditedCount proves the check can fail: a doc whose
// count was changed by hand is reported, on made-up text and on the real
// README with one of its numbers bumped.
func TestCheckerCatchesAHandEditedCount(t *testing.T) {
	bugs := []Count{{"bugs", 12, []*regexp.Regexp{Phrase(`\b(\d+) (?:planted )?bugs\b`)}}}
	if got := Mismatches("x.md", "The library has 12 planted bugs.", bugs); len(got) != 0 {
		t.Fatalf("a right count reported as wrong: %v", got)
	}
	got := Mismatches("x.md", "intro\nThe library has 11 planted bugs.", bugs)
	if len(got) != 1 || got[0].Stated != 11 || got[0].Want != 12 || got[0].Line != 2 {
		t.Fatalf("a wrong count: got %v, want one mismatch stating 11 at line 2", got)
	}
	got = Mismatches("x.md", "intro\nThe library has 11\nplanted bugs.", bugs)
	if len(got) != 1 || got[0].Stated != 11 || got[0].Line != 2 {
		t.Fatalf("a wrong count across a line break: got %v, want one mismatch stating 11 at line 2", got)
	}

	counts := codeCounts(t)
	readme := readDocs(t)["README.md"]
	for _, c := range counts {
		if statedIn[c.Name] != "README.md" {
			continue
		}
		found := Find("README.md", readme, []Count{c})
		if len(found) == 0 {
			t.Fatalf("README.md states no %s to edit", c.Name)
		}
		s := found[0]
		bumped := fmt.Sprint(s.Want + 1)
		text := readme[:s.Number[0]] + bumped + readme[s.Number[1]:]
		bad := Mismatches("README.md", text, counts)
		if len(bad) != 1 || bad[0].Count != c.Name || bad[0].Stated != s.Want+1 {
			t.Errorf("README with %q stating %s instead: got %v, want one %s mismatch", s.Text, bumped, bad, c.Name)
		}
	}

	partial := "## Track record\n" +
		"| `event-stream-pointer-snapshot` | 000 | `s000-vmm-kill-event` | events-observed |\n" +
		"| `failed-sticky` | 001 #5 | `s001-5-transient-failed` | one-vm-per-name |\n" +
		"| `no-such-bug` | 1 |\n## Next\n| `metrics-process-local` | 001 obs |\n"
	missing, extra, wrong := trackRecordDiff(partial)
	if len(missing) != len(regress.Bugs)-2 || len(extra) != 1 || len(wrong) != 1 || !strings.HasPrefix(wrong[0], "failed-sticky ") {
		t.Errorf("a partial track record, an unknown bug, a wrong invariant: missing %v, extra %v, wrong %v", missing, extra, wrong)
	}
}
