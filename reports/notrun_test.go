package reports

import (
	"strings"
	"testing"
)

// notRunRun is a run of a pass and case c1 the host could not run (no KVM).
func notRunRun() *Results {
	r := run(Pass, Inconclusive)
	r.Cases[1].Culprit, r.Cases[1].Reason = "precondition", "real backend unavailable: absent: no /dev/kvm"
	r.NotRun = []NotRun{{Case: "c1", Reason: r.Cases[1].Reason, Missing: "KVM (/dev/kvm: absent)", Kind: MissingHostFeature}}
	return r
}

func TestGateNotRunIsNeverAPass(t *testing.T) {
	r := notRunRun()
	g := Gate(r, nil, DefaultGateOptions())
	if g.Code != GateInconclusive {
		t.Fatalf("gate code %d, want %d (a not-run case is not a pass)\n%s", g.Code, GateInconclusive, g)
	}
	if !strings.Contains(g.String(), "NOT RUN c1: missing host-feature KVM (/dev/kvm: absent)") {
		t.Errorf("gate does not name the not-run case and what it lacks:\n%s", g)
	}
	if strings.Contains(g.String(), "INCONCLUSIVE c1") {
		t.Errorf("the not-run case is listed twice:\n%s", g)
	}
	if !strings.Contains(g.Lines[len(g.Lines)-1], "1 not run (missing host-feature KVM (/dev/kvm: absent) ×1)") {
		t.Errorf("tally lacks the not-run count: %q", g.Lines[len(g.Lines)-1])
	}
}

func TestGateAllowNotRun(t *testing.T) {
	opt := DefaultGateOptions()
	opt.AllowNotRun = true
	g := Gate(notRunRun(), nil, opt)
	if g.Code != GatePass || !strings.Contains(g.String(), "NOT RUN c1") {
		t.Errorf("--allow-not-run: code %d, want 0 with the case still listed:\n%s", g.Code, g)
	}
	// other inconclusive cases still count
	r := notRunRun()
	r.Cases = append(r.Cases, Case{ID: "c2", Verdict: Inconclusive, Reason: "fault did not land"})
	if g := Gate(r, nil, opt); g.Code != GateInconclusive {
		t.Errorf("--allow-not-run excused a landing miss: code %d\n%s", g.Code, g)
	}
	// a run where nothing ran proves nothing, allowed or not
	r = notRunRun()
	r.Cases = r.Cases[1:]
	if g := Gate(r, nil, opt); g.Code != GateInconclusive || !strings.Contains(g.String(), "not one selected case ran") {
		t.Errorf("--allow-not-run with every case not run: code %d\n%s", g.Code, g)
	}
}

func TestValidateNotRun(t *testing.T) {
	r := notRunRun()
	if err := Validate(r); err != nil {
		t.Fatalf("valid run refused: %v", err)
	}
	r.NotRun[0].Case = "nope"
	if err := Validate(r); err == nil || !strings.Contains(err.Error(), `"nope" is not among`) {
		t.Errorf("not_run naming no case: err %v", err)
	}
	r = notRunRun()
	r.Cases[1].Verdict = Pass
	if err := Validate(r); err == nil || !strings.Contains(err.Error(), "verdict is pass") {
		t.Errorf("not_run case that passed: err %v", err)
	}
}

func TestNotRunInSummaryAndReports(t *testing.T) {
	r := notRunRun()
	var b strings.Builder
	Summary(&b, r)
	if !strings.Contains(b.String(), "1 not run (missing host-feature KVM (/dev/kvm: absent) ×1)") {
		t.Errorf("summary lacks the not-run line:\n%s", b.String())
	}
	md, err := Markdown(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "## Not run") || !strings.Contains(string(md), "| c1 | KVM (/dev/kvm: absent) | host-feature |") {
		t.Errorf("report.md lacks the Not run section:\n%s", md)
	}
	html, err := HTML(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(html), `<h2 id="not-run">Not run (1)</h2>`) || !strings.Contains(string(html), "<code>c1</code></td><td>KVM") {
		t.Errorf("report.html lacks the Not run section")
	}
	junit, err := JUnit(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(junit), `message="not run: real backend unavailable`) {
		t.Errorf("junit.xml does not say the case was not run:\n%s", junit)
	}
	if b.Reset(); NotRunSummary(nil) != "" {
		t.Errorf("NotRunSummary(nil) = %q, want empty", NotRunSummary(nil))
	}
}

func TestMergeKeepsNotRun(t *testing.T) {
	a, b := notRunRun(), run(Pass)
	b.Cases[0].ID = "c9"
	m, err := Merge(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.NotRun) != 1 || m.NotRun[0].Case != "c1" {
		t.Errorf("merged not_run = %+v, want c1's entry", m.NotRun)
	}
}
