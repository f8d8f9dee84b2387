package reports

import (
	"strings"
	"testing"
)

// TestGateAcceptsKnownFindingsByID: an accepted failing case is listed as
// ACCEPTED and does not fail the gate; any other failure still does; an
// accepted case that passes is pointed out.
func TestGateAcceptsKnownFindingsByID(t *testing.T) {
	opt := DefaultGateOptions()
	opt.Accept = map[string]bool{"c1": true}
	g := Gate(run(Pass, Fail), nil, opt)
	if g.Code != GatePass || !strings.Contains(g.String(), "ACCEPTED c1 (known finding): invariant(s) intent-goal") {
		t.Fatalf("accepted failure: code %d\n%s", g.Code, g)
	}
	if g := Gate(run(Fail, Fail), nil, opt); g.Code != GateFail || !strings.Contains(g.String(), "FAIL c0") {
		t.Fatalf("a failure not accepted must fail the gate: code %d\n%s", g.Code, g)
	}
	if g := Gate(run(Pass, Inconclusive), nil, opt); g.Code != GateInconclusive {
		t.Fatalf("accepting a failure must not hide an inconclusive case: code %d\n%s", g.Code, g)
	}
	g = Gate(run(Pass, Pass), nil, opt)
	if g.Code != GatePass {
		t.Fatalf("code %d\n%s", g.Code, g)
	}
	g = Gate(run(Pass, Pass), run(Pass, Fail), opt)
	if !strings.Contains(g.String(), "c1 is accepted as a known finding but passes now") {
		t.Fatalf("a fixed accepted finding is not pointed out:\n%s", g)
	}
	// A regression against the baseline of an accepted case is known too.
	if g := Gate(run(Pass, Fail), run(Pass, Pass), opt); g.Code != GatePass || strings.Contains(g.String(), "REGRESSION") {
		t.Fatalf("accepted regression: code %d\n%s", g.Code, g)
	}
	if g := Gate(run(Pass, Fail), run(Pass, Pass), DefaultGateOptions()); g.Code != GateFail || !strings.Contains(g.String(), "REGRESSION c1") {
		t.Fatalf("without accept the regression must fail: code %d\n%s", g.Code, g)
	}
}
