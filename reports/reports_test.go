package reports

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

func TestWriteAllWritesEveryFileAndLoadRoundTrips(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	r := sampleResults()
	if err := WriteAll(dir, r); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ResultsFile, JUnitFile, MarkdownFile, HTMLFile} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Fatalf("%s missing or empty: %v", f, err)
		}
	}
	if r.Dir != dir {
		t.Fatalf("WriteAll set Dir %q, want %q", r.Dir, dir)
	}
	for _, p := range []string{dir, filepath.Join(dir, ResultsFile)} {
		got, err := Load(p)
		if err != nil {
			t.Fatalf("Load(%s): %v", p, err)
		}
		if got.Dir != dir {
			t.Fatalf("Load(%s).Dir = %q, want %q", p, got.Dir, dir)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("Load(%s) differs from what was written", p)
		}
	}
	// No temp files left behind by the durable writes.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 4 {
		t.Fatalf("run dir holds %d entries, want the 4 reports", len(ents))
	}
}

func TestRenderLeavesResultsJSONAlone(t *testing.T) {
	dir := t.TempDir()
	r := sampleResults()
	// A results.json from a newer vmchaos carries a field this one ignores;
	// re-rendering must not drop it.
	data, _ := Marshal(r)
	data = bytes.Replace(data, []byte(`"run_id"`), []byte(`"future_field": 7, "run_id"`), 1)
	if err := os.WriteFile(filepath.Join(dir, ResultsFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := Render(dir, loaded); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, ResultsFile))
	if !bytes.Equal(after, data) {
		t.Fatal("Render rewrote results.json")
	}
	if _, err := os.Stat(filepath.Join(dir, HTMLFile)); err != nil {
		t.Fatal(err)
	}
}

func TestLoadRejectsBrokenResultsWithReason(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"not json", "hello", "decode"},
		{"truncated", `{"run_id":"x","cases":[`, "decode"},
		{"two documents", `{"cases":[]} {"cases":[]}`, "trailing data"},
		{"empty id", `{"cases":[{"verdict":"pass"}]}`, "empty id"},
		{"unknown verdict", `{"cases":[{"id":"a","verdict":"passed"}]}`, `unknown verdict "passed"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), ResultsFile)
			if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Load(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("Load error = %v, want it to name %q and the file", err, tc.want)
			}
		})
	}
	if _, err := Load(filepath.Join(t.TempDir(), "nope")); err == nil {
		t.Fatal("Load of a missing path succeeded")
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), ResultsFile) {
		t.Fatalf("Load of a dir without results.json: %v", err)
	}
}

// Independent JUnit shapes for reading the file back the way a consumer does.
type jSuites struct {
	XMLName  xml.Name `xml:"testsuites"`
	Tests    int      `xml:"tests,attr"`
	Failures int      `xml:"failures,attr"`
	Errors   int      `xml:"errors,attr"`
	Skipped  int      `xml:"skipped,attr"`
	Suites   []struct {
		Name     string  `xml:"name,attr"`
		Tests    int     `xml:"tests,attr"`
		Failures int     `xml:"failures,attr"`
		Errors   int     `xml:"errors,attr"`
		Skipped  int     `xml:"skipped,attr"`
		Props    []jProp `xml:"properties>property"`
		Cases    []struct {
			Name      string  `xml:"name,attr"`
			Classname string  `xml:"classname,attr"`
			Time      string  `xml:"time,attr"`
			Props     []jProp `xml:"properties>property"`
			Failure   *jMsg   `xml:"failure"`
			Error     *jMsg   `xml:"error"`
			Skipped   *jMsg   `xml:"skipped"`
			SystemOut string  `xml:"system-out"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

type jProp struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type jMsg struct {
	Message string `xml:"message,attr"`
	Body    string `xml:",chardata"`
}

func TestJUnitMapsVerdictsAndCarriesEvidence(t *testing.T) {
	r := sampleResults()
	data, err := JUnit(r)
	if err != nil {
		t.Fatal(err)
	}
	var doc jSuites
	if err := xml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("junit.xml does not parse: %v", err)
	}
	if len(doc.Suites) != 1 {
		t.Fatalf("%d testsuites, want 1 per run", len(doc.Suites))
	}
	s := doc.Suites[0]
	if s.Tests != len(r.Cases) || len(s.Cases) != len(r.Cases) || s.Failures != 1 || s.Errors != 1 || s.Skipped != 1 {
		t.Fatalf("suite counts tests=%d cases=%d failures=%d errors=%d skipped=%d", s.Tests, len(s.Cases), s.Failures, s.Errors, s.Skipped)
	}
	if doc.Tests != s.Tests || doc.Failures != s.Failures || doc.Skipped != s.Skipped {
		t.Fatal("testsuites totals disagree with the suite")
	}
	for i, jc := range s.Cases {
		c := r.Cases[i]
		if jc.Name != c.ID || jc.Classname != c.Scenario {
			t.Fatalf("testcase %d is %s/%s, want %s/%s", i, jc.Classname, jc.Name, c.Scenario, c.ID)
		}
		results := 0
		for _, m := range []*jMsg{jc.Failure, jc.Error, jc.Skipped} {
			if m != nil {
				results++
			}
		}
		switch c.Verdict {
		case Pass:
			if results != 0 {
				t.Fatalf("%s passed but carries a failure/error/skipped", c.ID)
			}
		case Fail:
			if jc.Failure == nil {
				t.Fatalf("%s failed without <failure>", c.ID)
			}
			for _, want := range []string{"intent-goal", "one-vm-per-name", hostileXML(), "01AAA, 01BBB", c.Repro, "m-0003"} {
				if !strings.Contains(jc.Failure.Body, want) {
					t.Fatalf("failure body lacks %q:\n%s", want, jc.Failure.Body)
				}
			}
			if !strings.Contains(jc.Failure.Message, "intent-goal, one-vm-per-name") {
				t.Fatalf("failure message %q does not name the invariants", jc.Failure.Message)
			}
		case Inconclusive:
			if jc.Skipped == nil || !strings.Contains(jc.Skipped.Message, "vm.clone.committed") {
				t.Fatalf("inconclusive case not a <skipped> with its reason: %+v", jc.Skipped)
			}
		case Error:
			if jc.Error == nil {
				t.Fatalf("error case without <error>")
			}
		}
		flaky := false
		for _, p := range jc.Props {
			if p.Name == "flaky" && p.Value == "true" {
				flaky = true
			}
		}
		if flaky != (c.Attempts > 1) {
			t.Fatalf("%s: flaky property %v with %d attempts", c.ID, flaky, c.Attempts)
		}
		if c.Attempts > 1 && !strings.Contains(jc.SystemOut, "FLAKY") {
			t.Fatalf("%s: retried case has no system-out note", c.ID)
		}
	}
}

// hostileXML is hostile as it reads back from XML: the control character is
// not representable and comes back as U+FFFD.
func hostileXML() string { return strings.ReplaceAll(hostile, "\x01", "\uFFFD") }

func TestMarkdownHasOneTableRowPerCaseAndReproForEachProblem(t *testing.T) {
	r := sampleResults()
	data, err := Markdown(r)
	if err != nil {
		t.Fatal(err)
	}
	md := string(data)
	lines := strings.Split(md, "\n")
	hdr := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "| case | fault | landed phase | window margin | verdict | time to converge | failed invariants |") {
			hdr = i
		}
	}
	if hdr < 0 {
		t.Fatal("no case table")
	}
	unescapedPipe := regexp.MustCompile(`(^|[^\\])\|`)
	for i, c := range r.Cases {
		row := lines[hdr+2+i]
		if !strings.Contains(row, c.ID) {
			t.Fatalf("row %d %q is not case %s", i, row, c.ID)
		}
		// Eight cell borders: hostile text never splits a row.
		if n := len(unescapedPipe.FindAllStringIndex(row, -1)); n != 8 {
			t.Fatalf("row %q has %d cell borders", row, n)
		}
	}
	for _, want := range []string{"**Verdict: INVARIANT VIOLATED**", "backend", "fake", "builtin", "0.05", "ci-runner-3",
		"p50", "p95", "## What broke", "`intent-goal` violated in 1 case(s)",
		"| vm.clone.committed (intended vm.clone.files-copied) | - | **INCONCLUSIVE** |"} {
		if !strings.Contains(md, want) {
			t.Fatalf("report.md lacks %q", want)
		}
	}
	for _, c := range r.Cases {
		inDetails := strings.Contains(md, "### "+mdEscape(c.ID)+" — ")
		if want := c.Problem() || c.Attempts > 1; inDetails != want {
			t.Fatalf("%s (%s): details section present=%v, want %v", c.ID, c.Verdict, inDetails, want)
		}
		if c.Problem() && !strings.Contains(md, "```sh\n"+c.Repro+"\n```") {
			t.Fatalf("%s: no repro block", c.ID)
		}
	}
	// Outside code blocks (which Markdown shows verbatim) no raw HTML.
	prose := regexp.MustCompile("(?s)```.*?```").ReplaceAllString(md, "")
	if strings.Contains(prose, "<script>") {
		t.Fatal("raw <script> in markdown prose")
	}
}

// A selftest run holds the same case id twice (with and without a bug
// switch); it must load, gate and render like any run.
func TestRunWithRepeatedCaseIDLoadsAndRenders(t *testing.T) {
	r := run(Fail, Pass)
	r.Cases[1].ID = r.Cases[0].ID
	r.Cases[0].Repro = "VMCHAOS_REGRESS=failed-sticky " + r.Cases[0].Repro
	dir := t.TempDir()
	if err := WriteAll(dir, r); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if g := Gate(got, nil, DefaultGateOptions()); g.Code != GateFail {
		t.Fatalf("gate code %d:\n%s", g.Code, g)
	}
	page, _ := os.ReadFile(filepath.Join(dir, HTMLFile))
	if !strings.Contains(string(page), `id="case-0"`) || !strings.Contains(string(page), `id="case-1"`) {
		t.Fatal("repeated id collapsed in the HTML")
	}
}

func TestCodeBlockFenceOutlastsBackticksInside(t *testing.T) {
	got := codeBlock("", "a ```` b")
	if !strings.HasPrefix(got, "`````\n") || !strings.HasSuffix(got, "\n`````\n") {
		t.Fatalf("fence too short: %q", got)
	}
}

var svgRe = regexp.MustCompile(`(?s)<svg .*?</svg>`)

func TestHTMLIsSelfContainedEscapedAndDrawsEveryFigure(t *testing.T) {
	r := sampleResults()
	data, err := HTML(r)
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)
	if strings.Contains(page, "<script>alert") {
		t.Fatal("hostile text reached the page unescaped")
	}
	for _, bad := range []string{"<link", " src=", "@import", "url("} {
		if strings.Contains(page, bad) {
			t.Fatalf("page references an external asset (%q)", bad)
		}
	}
	if n := strings.Count(page, "https://") + strings.Count(strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, ""), "http://"); n != 0 {
		t.Fatalf("%d external URLs in a self-contained page", n)
	}
	svgs := svgRe.FindAllString(page, -1)
	timelines, histograms := 0, 0
	for _, s := range svgs {
		var root struct {
			XMLName xml.Name
			Lines   []struct {
				Class string `xml:"class,attr"`
			} `xml:"line"`
			Rects []struct {
				Class string `xml:"class,attr"`
				Title string `xml:"title"`
			} `xml:"rect"`
		}
		if err := xml.Unmarshal([]byte(s), &root); err != nil {
			t.Fatalf("SVG fragment is not well-formed XML: %v\n%s", err, s)
		}
		classes := map[string]int{}
		for _, l := range root.Lines {
			classes[l.Class]++
		}
		switch {
		case strings.Contains(s, `aria-label="case timeline"`):
			timelines++
			if classes["vfault"] != 1 {
				t.Fatalf("timeline without its fault marker: %v", classes)
			}
		case strings.Contains(s, `aria-label="convergence time histogram"`):
			histograms++
			total := 0
			for _, rc := range root.Rects {
				if strings.HasPrefix(rc.Class, "bar") {
					var n int
					if _, err := fmtSscan(rc.Title, &n); err != nil {
						t.Fatalf("bar title %q", rc.Title)
					}
					total += n
				}
			}
			st := Convergence(r.Cases)
			if total != st.N+st.Never {
				t.Fatalf("histogram holds %d cases, want %d", total, st.N+st.Never)
			}
		}
	}
	// Sweeps: the two scenarios run at five offsets, one dot per case, and
	// a landed-phase strip (the sample's offsets all landed in one phase,
	// except the inconclusive one).
	sweeps := 0
	for _, s := range svgs {
		if strings.Contains(s, `aria-label="sweep"`) {
			sweeps++
			if n := strings.Count(s, `<circle class="pt v-`); n != 5 {
				t.Fatalf("sweep with %d dots, want 5", n)
			}
			if !strings.Contains(s, "landed in vm.clone.files-copied") {
				t.Fatal("sweep without its landed-phase strip")
			}
		}
	}
	if sweeps != 2 {
		t.Fatalf("%d sweep charts, want 2", sweeps)
	}
	if timelines != len(r.Cases) || histograms != 1 {
		t.Fatalf("%d timelines (want %d), %d histograms", timelines, len(r.Cases), histograms)
	}
	// Converged cases show the convergence line; the failed one never converged.
	if got := strings.Count(page, `class="vconv"`); got != len(r.Cases)-2 {
		t.Fatalf("%d convergence markers, want %d", got, len(r.Cases)-2)
	}
	// The matrix: one coloured cell per case, with the failing one red.
	if got := strings.Count(page, `<a class="cell v-`); got != len(r.Cases) {
		t.Fatalf("%d matrix cells, want %d", got, len(r.Cases))
	}
	// A scenario run once is a tile, not a matrix row.
	one := sampleResults()
	one.Cases[2].Scenario = "one-off"
	onePage, _ := HTML(one)
	if !strings.Contains(string(onePage), `<a class="tile v-pass" href="#case-2"`) || strings.Count(string(onePage), `<a class="cell v-`) != len(one.Cases)-1 {
		t.Fatal("one-off scenario not shown as a tile")
	}
	if !strings.Contains(page, `<a class="cell v-fail" href="#case-4"`) {
		t.Fatal("failing case not red in the matrix")
	}
	for _, c := range r.Cases {
		if !strings.Contains(page, ">"+htmlEsc(c.ID)+"<") {
			t.Fatalf("case %s missing", c.ID)
		}
	}
	// Needs attention: one row per case that is not a clean pass, with why.
	att := regexp.MustCompile(`(?s)<table class="attention">.*?</table>`).FindString(page)
	if got := strings.Count(att, "<tr><td><span class=\"verdict"); got != 4 {
		t.Fatalf("needs-attention table has %d rows, want 4 (fail, inconclusive, error, flaky)", got)
	}
	for _, want := range []string{"invariant(s) intent-goal, one-vm-per-name", "fault landed in vm.clone.committed", "passed only after 2 attempts", htmlEsc(r.Cases[7].Repro)} {
		if !strings.Contains(att, want) {
			t.Fatalf("needs-attention table lacks %q", want)
		}
	}
	// Violated invariants with evidence; the ones that held listed by name.
	if !strings.Contains(page, `<td>✗ intent-goal</td><td><pre>vm-a: lifecycle failed (want ready) after 30s`) ||
		!strings.Contains(page, `<span class="ok-mark">✓ 1 held:</span> <code>ledger-clean</code>`) {
		t.Fatal("failing case's invariants not shown as violated + held")
	}
	// The "only problems" filter hides exactly the clean passes.
	if got := strings.Count(page, `<tr class="ok">`); got != 8 {
		t.Fatalf("%d rows marked ok, want 8", got)
	}
	if !strings.Contains(page, htmlEsc(r.Cases[4].Repro)) || !strings.Contains(page, `<details class="case" id="case-4" open>`) {
		t.Fatal("failing case not open with its repro")
	}
}

func htmlEsc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;", "+", "&#43;").Replace(s)
}

func fmtSscan(s string, n *int) (int, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, errors.New("empty")
	}
	return 1, json.Unmarshal([]byte(f[0]), n)
}

func TestHTMLOfEmptyRunRenders(t *testing.T) {
	for _, r := range []*Results{{}, {Cases: []Case{{ID: "x", Verdict: Pass}}}} {
		if _, err := HTML(r); err != nil {
			t.Fatal(err)
		}
		if _, err := Markdown(r); err != nil {
			t.Fatal(err)
		}
		if _, err := JUnit(r); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSummaryNamesProblemsReprosAndReportPath(t *testing.T) {
	r := sampleResults()
	r.Dir = "/tmp/run-x"
	var b bytes.Buffer
	Summary(&b, r)
	out := b.String()
	for _, want := range []string{"INVARIANT VIOLATED", "12 cases: 9 pass, 1 fail, 1 inconclusive, 1 error (1 retried)",
		"FAIL", r.Cases[4].ID, "intent-goal, one-vm-per-name", "repro: " + r.Cases[4].Repro, "INCONCLUSIVE", r.Cases[7].Repro,
		"ERROR", "flaky", "/tmp/run-x/report.html", "p95"} {
		if !strings.Contains(out, want) {
			t.Fatalf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.ContainsRune(out, '\x01') {
		t.Fatal("control character reached the terminal")
	}
	if strings.Contains(out, r.Cases[0].Repro) {
		t.Fatal("summary lists a clean pass")
	}
}

func TestSummaryCapsProblemsFailuresFirst(t *testing.T) {
	r := &Results{RunID: "big"}
	for i := range 40 {
		v := Inconclusive
		if i == 39 {
			v = Fail
		}
		r.Cases = append(r.Cases, Case{ID: fmt.Sprintf("c%02d", i), Verdict: v, Attempts: 1})
	}
	var b bytes.Buffer
	Summary(&b, r)
	out := b.String()
	if !strings.Contains(out, "… and 15 more case(s)") {
		t.Fatalf("no cap note:\n%s", out)
	}
	if strings.Index(out, "c39") > strings.Index(out, "c00") {
		t.Fatal("the failure is not listed before the inconclusive cases")
	}
}

func TestSelftestTableAndFiles(t *testing.T) {
	rows := []SelftestRow{
		{Bug: "stale-create-blocking-lock", Seed: "002", Scenario: "seed002-stale-create-live-clone", WithBugVerdict: Fail,
			WithBugInvariant: "one-vm-per-name", WithoutBugVerdict: Pass, OK: true, Repro: "VMCHAOS_REGRESS=stale-create-blocking-lock vmchaos repro --scenario seed002-stale-create-live-clone"},
		{Bug: "failed-sticky", Seed: "001 #5", Scenario: "seed001-transient-failed", WithBugVerdict: Pass,
			WithoutBugVerdict: Pass, OK: false, Note: "not detected: passed with the bug on"},
	}
	var b bytes.Buffer
	if err := FormatSelftest(&b, rows); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"BUG", "stale-create-blocking-lock", "one-vm-per-name (one-vm-per-name)", "- (intent-goal)",
		"MISSED", "1/2 bugs caught", "MISSED: failed-sticky", "not run: event-stream-pointer-snapshot"} {
		if !strings.Contains(out, want) {
			t.Fatalf("table lacks %q:\n%s", want, out)
		}
	}
	dir := t.TempDir()
	if err := WriteSelftest(dir, rows); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OK   bool          `json:"ok"`
		Rows []SelftestRow `json:"rows"`
	}
	data, _ := os.ReadFile(filepath.Join(dir, SelftestJSONFile))
	if err := json.Unmarshal(data, &doc); err != nil || doc.OK || !reflect.DeepEqual(doc.Rows, rows) {
		t.Fatalf("selftest.json: ok=%v err=%v rows=%+v", doc.OK, err, doc.Rows)
	}
	md, _ := os.ReadFile(filepath.Join(dir, SelftestMarkdownFile))
	for _, want := range []string{"# vmchaos selftest — FAIL", "## Track record",
		"| `stale-create-blocking-lock` | 002 | reconcile-stale-create takes the ops lock blocking",
		"| `seed002-stale-create-live-clone` | one-vm-per-name | `" + rows[0].Repro + "` |",
		"**not caught** (`seed001-transient-failed`)", "| `metrics-process-local` | 001 obs |", "**not run**",
		"**MISSED**", "## Missed", "Note: not detected: passed with the bug on"} {
		if !strings.Contains(string(md), want) {
			t.Fatalf("selftest.md lacks %q:\n%s", want, md)
		}
	}
	if !TallySelftest(rows[:1]).OK() || TallySelftest(nil).OK() {
		t.Fatal("tally OK wrong")
	}
}

func TestPercentileNearestRank(t *testing.T) {
	s := []float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}
	for p, want := range map[float64]float64{0.5: 50, 0.95: 100, 0.9: 90, 0: 10, 1: 100} {
		if got := Percentile(s, p); got != want {
			t.Fatalf("p%v = %v, want %v", p, got, want)
		}
	}
	if Percentile(nil, 0.5) != 0 {
		t.Fatal("empty percentile")
	}
	sorted := append([]float64(nil), s...)
	sort.Float64s(sorted)
	_ = io.Discard
}

// TestHTMLTagsBalance reads the whole page with encoding/xml in its HTML
// mode and checks that every element the template opens is closed in order:
// a template slip (an unclosed <td> or <details>) shows up here.
func TestHTMLTagsBalance(t *testing.T) {
	data, err := HTML(sampleResults())
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.Strict = false
	dec.AutoClose = xml.HTMLAutoClose
	dec.Entity = xml.HTMLEntity
	var stack []string
	void := map[string]bool{"meta": true, "input": true, "br": true, "hr": true, "img": true, "link": true}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("page does not parse: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if !void[el.Name.Local] {
				stack = append(stack, el.Name.Local)
			}
		case xml.EndElement:
			if void[el.Name.Local] {
				continue
			}
			if len(stack) == 0 || stack[len(stack)-1] != el.Name.Local {
				t.Fatalf("</%s> closes %v", el.Name.Local, stack)
			}
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) != 0 {
		t.Fatalf("unclosed elements: %v", stack)
	}
}

func TestMarkdownSummaryForCIJobs(t *testing.T) {
	r := sampleResults()
	base := sampleResults()
	base.Cases[4].Verdict = Pass
	g := Gate(r, base, DefaultGateOptions())
	md := MarkdownSummary(r, g, 2)
	for _, want := range []string{"### vmchaos: INVARIANT VIOLATED (exit 1)", "backend fake", "REGRESSION clone-sigkill-sweep@25ms passed in baseline",
		"| FAIL | `clone-sigkill-sweep@25ms` | invariant(s) intent-goal, one-vm-per-name", "`" + r.Cases[4].Repro + "`",
		"| ERROR | `save-stop-sweep@75ms`", "… and 2 more"} {
		if !strings.Contains(md, want) {
			t.Fatalf("summary lacks %q:\n%s", want, md)
		}
	}
	if strings.Index(md, "| FAIL") > strings.Index(md, "| ERROR") {
		t.Fatal("failures are not listed first")
	}
	clean := MarkdownSummary(run(Pass), Gate(run(Pass), nil, DefaultGateOptions()), 10)
	if !strings.Contains(clean, "PASS (exit 0)") || strings.Contains(clean, "| verdict |") {
		t.Fatalf("clean run summary:\n%s", clean)
	}
}

// In a selftest run dir the reports lead with the selftest table, whichever
// of results.json and selftest.json was written first.
func TestSelftestTableHeadsTheRunReports(t *testing.T) {
	rows := []SelftestRow{{Bug: "failed-sticky", Seed: "001 #5", Scenario: "s001-5-transient-failed", WithBugVerdict: Fail,
		WithBugInvariant: "intent-goal", WithoutBugVerdict: Pass, OK: true, Repro: "VMCHAOS_REGRESS=failed-sticky vmchaos repro --scenario s001-5-transient-failed"}}
	for _, selftestFirst := range []bool{false, true} {
		dir := t.TempDir()
		steps := []func() error{
			func() error { return WriteAll(dir, run(Fail, Pass)) },
			func() error { return WriteSelftest(dir, rows) },
		}
		if selftestFirst {
			steps[0], steps[1] = steps[1], steps[0]
		}
		for _, s := range steps {
			if err := s(); err != nil {
				t.Fatal(err)
			}
		}
		page, _ := os.ReadFile(filepath.Join(dir, HTMLFile))
		md, _ := os.ReadFile(filepath.Join(dir, MarkdownFile))
		if !strings.Contains(string(page), "SELFTEST PASS — 1 of 1 bugs caught, 1 of 1 checks ok") || !strings.Contains(string(page), htmlEsc(rows[0].Repro)) {
			t.Fatalf("selftestFirst=%v: html lacks the selftest section", selftestFirst)
		}
		if !strings.HasPrefix(string(md), "# vmchaos report — r\n\n**Selftest: PASS** — 1 of 1 bugs caught, 1 of 1 checks ok.") || !strings.Contains(string(md), "| `failed-sticky` | 001 #5 |") {
			t.Fatalf("selftestFirst=%v: report.md lacks the selftest table:\n%s", selftestFirst, md)
		}
	}
}

func TestWriteAllRecordsTheBuild(t *testing.T) {
	old := Version
	Version = "v9.9.9-test"
	defer func() { Version = old }()
	dir := t.TempDir()
	r := run(Pass)
	if err := WriteAll(dir, r); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil || !strings.HasPrefix(got.Build, "v9.9.9-test") {
		t.Fatalf("build %q, %v", got.Build, err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, MarkdownFile))
	if !strings.Contains(string(md), "v9.9.9-test") {
		t.Fatal("report.md does not name the build")
	}
	// A build already recorded (e.g. by the shards of a merge) is kept.
	r.Build = "shard-build"
	if err := WriteAll(dir, r); err != nil || r.Build != "shard-build" {
		t.Fatalf("build overwritten: %q %v", r.Build, err)
	}
}
