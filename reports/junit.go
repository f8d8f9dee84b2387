package reports

import (
	"encoding/xml"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// JUnit XML shapes, in the dialect Jenkins, GitLab, GitHub test reporters and
// Maven surefire readers share: <testsuites><testsuite><testcase>, with
// <failure>, <error> or <skipped>, then <system-out>.
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Skipped  int          `xml:"skipped,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string      `xml:"name,attr"`
	Tests      int         `xml:"tests,attr"`
	Failures   int         `xml:"failures,attr"`
	Errors     int         `xml:"errors,attr"`
	Skipped    int         `xml:"skipped,attr"`
	Time       string      `xml:"time,attr"`
	Timestamp  string      `xml:"timestamp,attr,omitempty"`
	Hostname   string      `xml:"hostname,attr,omitempty"`
	Properties *junitProps `xml:"properties,omitempty"`
	Cases      []junitCase `xml:"testcase"`
	SystemOut  string      `xml:"system-out,omitempty"`
}

type junitProps struct {
	Props []junitProp `xml:"property"`
}

type junitProp struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Name       string        `xml:"name,attr"`
	Classname  string        `xml:"classname,attr"`
	Time       string        `xml:"time,attr"`
	Properties *junitProps   `xml:"properties,omitempty"`
	Skipped    *junitMessage `xml:"skipped,omitempty"`
	Error      *junitMessage `xml:"error,omitempty"`
	Failure    *junitMessage `xml:"failure,omitempty"`
	// FlakyFailures are Surefire's rerun records: one per run of a flaky
	// case (`--repeat`) that did not pass.
	FlakyFailures []junitMessage `xml:"flakyFailure,omitempty"`
	SystemOut     *junitText     `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr,omitempty"`
	Body    string `xml:",cdata"`
}

// junitText is multi-line text kept readable in the raw file (CDATA rather
// than &#xA; escapes).
type junitText struct {
	Text string `xml:",cdata"`
}

// JUnit renders junit.xml: one testsuite for the run, one testcase per case
// (classname = scenario, name = case id). fail → <failure> naming the failed
// invariants with evidence and the repro command; error → <error>;
// inconclusive → <skipped> (so it is never counted as passed). A case that
// needed retries gets a "flaky" property and a note in <system-out>.
func JUnit(r *Results) ([]byte, error) {
	counts := CountVerdicts(r.Cases)
	suite := junitSuite{
		Name:     "vmchaos " + orDefault(r.RunID, "run"),
		Tests:    counts.Total,
		Failures: counts.Fail + counts.Flaky,
		Errors:   counts.Error + counts.Unknown,
		Skipped:  counts.Inconclusive,
		Hostname: r.Host,
	}
	if !r.StartedAt.IsZero() {
		suite.Timestamp = r.StartedAt.UTC().Format("2006-01-02T15:04:05")
	}
	var total float64
	for _, c := range r.Cases {
		total += max(c.DurationMs, 0)
	}
	if !r.StartedAt.IsZero() && r.FinishedAt.After(r.StartedAt) {
		total = float64(r.FinishedAt.Sub(r.StartedAt)) / float64(time.Millisecond)
	}
	suite.Time = seconds(total)
	props := []junitProp{
		{"run_id", r.RunID}, {"backend", r.Backend}, {"supervisor", r.Supervisor},
		{"time_scale", fmt.Sprint(r.TimeScale)}, {"seed", fmt.Sprint(r.Seed)},
	}
	for _, p := range []junitProp{{"build", r.Build}, {"shard", r.Shard}, {"label_filter", r.Filter}, {"regress", strings.Join(r.Regress, ",")},
		{"shards", strings.Join(r.Shards, ",")}, {"missing_shards", strings.Join(r.MissingShards, ",")}} {
		if p.Value != "" {
			props = append(props, p)
		}
	}
	var flaky []string
	for _, c := range r.Cases {
		if c.Attempts > 1 || c.Verdict == Flaky {
			flaky = append(flaky, c.ID)
		}
	}
	if len(flaky) > 0 {
		props = append(props, junitProp{"flaky_cases", strings.Join(flaky, ",")})
	}
	suite.Properties = &junitProps{props}
	suite.SystemOut = Convergence(r.Cases).String()

	for _, c := range r.Cases {
		suite.Cases = append(suite.Cases, junitTestcase(c))
	}
	doc := junitSuites{
		Name: suite.Name, Tests: suite.Tests, Failures: suite.Failures, Errors: suite.Errors,
		Skipped: suite.Skipped, Time: suite.Time, Suites: []junitSuite{suite},
	}
	out, err := xml.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode junit: %w", err)
	}
	return append(append([]byte(xml.Header), out...), '\n'), nil
}

func junitTestcase(c Case) junitCase {
	jc := junitCase{Name: c.ID, Classname: orDefault(c.Scenario, "vmchaos"), Time: seconds(c.DurationMs)}
	var props []junitProp
	if c.Attempts > 1 {
		props = append(props, junitProp{"flaky", "true"}, junitProp{"attempts", fmt.Sprint(c.Attempts)})
	}
	if c.Verdict == Flaky {
		props = append(props, junitProp{"flaky", "true"})
	}
	if len(c.Runs) > 1 {
		props = append(props, junitProp{"runs", fmt.Sprint(len(c.Runs))}, junitProp{"run_verdicts", RunTally(c.Runs)})
	}
	if c.Window != nil {
		props = append(props, junitProp{"window_margin", c.MarginLabel()})
	}
	props = append(props, junitProp{"verdict", c.Verdict}, junitProp{"landed_phase", c.LandedPhase},
		junitProp{"converge_ms", fmt.Sprint(c.ConvergeMs)})
	if c.SeedRef != "" {
		props = append(props, junitProp{"seed_ref", c.SeedRef})
	}
	jc.Properties = &junitProps{props}

	switch c.Verdict {
	case Pass:
	case Fail:
		jc.Failure = &junitMessage{Message: failureSummary(c), Type: "invariant-violated", Body: caseDetailText(c)}
	case Inconclusive:
		jc.Skipped = &junitMessage{Message: skippedPrefix(c) + oneLine(orDefault(c.Reason, "fault did not land as intended"))}
	case Flaky:
		// not a pass (the gate says so too); Surefire's <flakyFailure>
		// names each run that did not pass
		jc.Failure = &junitMessage{Message: "flaky: " + RunTally(c.Runs), Type: "flaky", Body: caseDetailText(c)}
		for i, r := range c.Runs {
			if r.Verdict != Pass {
				jc.FlakyFailures = append(jc.FlakyFailures, junitMessage{Message: fmt.Sprintf("run %d: %s", i+1, oneLine(orDefault(r.Reason, r.Verdict))),
					Type: r.Verdict, Body: xmlSafe(r.Repro)})
			}
		}
	default: // error, or a verdict this version does not know
		jc.Error = &junitMessage{Message: oneLine(orDefault(c.Reason, "harness error")), Type: orDefault(c.Verdict, "error"), Body: caseDetailText(c)}
	}
	var out strings.Builder
	if c.Attempts > 1 {
		fmt.Fprintf(&out, "FLAKY: verdict %s after %d attempts (earlier attempts did not reach it)\n", c.Verdict, c.Attempts)
	}
	fmt.Fprintf(&out, "scenario %s: %s\nfault %s, trigger %s, offset %s, landed phase %s\nconverge %s, duration %s\n",
		c.Scenario, c.Title, c.Fault, c.Trigger, c.OffsetLabel(), orDefault(c.LandedPhase, "-"), FormatMs(c.ConvergeMs), FormatMs(c.DurationMs))
	if c.Verdict == Inconclusive && c.Reason != "" {
		fmt.Fprintf(&out, "reason: %s\n", c.Reason)
	}
	if c.Repro != "" {
		fmt.Fprintf(&out, "repro: %s\n", c.Repro)
	}
	for _, k := range sortedKeys(c.Logs) {
		fmt.Fprintf(&out, "log %s: %s\n", k, c.Logs[k])
	}
	jc.SystemOut = &junitText{xmlSafe(out.String())}
	if jc.Failure != nil {
		jc.Failure.Body = xmlSafe(jc.Failure.Body)
	}
	if jc.Error != nil {
		jc.Error.Body = xmlSafe(jc.Error.Body)
	}
	return jc
}

// caseDetailText is the plain-text account of why a case did not pass: every
// failed invariant with its evidence, the ledger problems, the injections and
// the repro command. It is the body of junit failures.
func caseDetailText(c Case) string {
	var b strings.Builder
	if c.Reason != "" {
		fmt.Fprintf(&b, "reason: %s\n", c.Reason)
	}
	for _, inv := range c.Invariants {
		if inv.OK {
			continue
		}
		fmt.Fprintf(&b, "invariant %s violated", inv.Name)
		if ev := strings.TrimSpace(inv.Evidence); ev != "" {
			fmt.Fprintf(&b, ":\n%s", indent(ev, "    "))
		}
		b.WriteString("\n")
	}
	for _, l := range c.Ledger {
		if l.OK {
			continue
		}
		fmt.Fprintf(&b, "ledger %s: stable %d, lost %d %v, phantom %d %v, in-flight %d", l.Guest, l.Stable, l.Lost, l.LostNames, l.Phantom, l.PhantomNames, l.InFlight)
		if l.Message != "" {
			fmt.Fprintf(&b, ": %s", l.Message)
		}
		b.WriteString("\n")
	}
	for _, inj := range c.Injections {
		fmt.Fprintf(&b, "injection %s (%s): %s\n", inj.Fault, inj.Trigger, injectionText(inj))
	}
	if c.Repro != "" {
		fmt.Fprintf(&b, "repro: %s\n", c.Repro)
	}
	return b.String()
}

func injectionText(inj Injection) string {
	s := fmt.Sprintf("landed in %s (intended %s)", orDefault(inj.LastPhase, "?"), orDefault(inj.IntendedPhase, "?"))
	if !inj.Landed {
		s = "DID NOT LAND: " + s
	}
	s += injectionErrorText(inj)
	if inj.VictimPID != 0 {
		s += fmt.Sprintf(", victim pid %d", inj.VictimPID)
	}
	if inj.Err != "" {
		s += ", error: " + inj.Err
	}
	return s
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

func seconds(ms float64) string {
	if ms < 0 {
		ms = 0
	}
	return fmt.Sprintf("%.3f", ms/1000)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// xmlSafe replaces what XML 1.0 cannot carry at all (most control
// characters, invalid UTF-8, U+FFFE/U+FFFF) with U+FFFD. encoding/xml does
// this for attributes and escaped text but not inside CDATA.
func xmlSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			return r
		case r < 0x20, r == 0xFFFE, r == 0xFFFF, r == utf8.RuneError:
			return '\uFFFD'
		case r >= 0xD800 && r <= 0xDFFF:
			return '\uFFFD'
		}
		return r
	}, s)
}

// skippedPrefix heads a skipped testcase's message: "not run: " when the
// host lacked what the case needs (culprit precondition, listed in not_run),
// else "inconclusive: ".
func skippedPrefix(c Case) string {
	if c.Culprit == "precondition" {
		return "not run: "
	}
	return "inconclusive: "
}
