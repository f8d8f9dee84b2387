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
	opt.Accept, _, _ = ParseAccept([]string{"c1"})
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

// TestGateAcceptPairs: a CASE:INVARIANT pair accepts only that invariant;
// a second invariant failing in the accepted case fails the gate and is
// named, also as a regression against the baseline; a bare id accepts the
// whole case; a pair that no longer fails is pointed out.
func TestGateAcceptPairs(t *testing.T) {
	twoBad := run(Pass, Fail)
	twoBad.Cases[1].Invariants = append(twoBad.Cases[1].Invariants, Invariant{Name: "no-orphan-vmm", Evidence: "pid 7 left"})
	opt := DefaultGateOptions()
	var err error
	opt.Accept, _, err = ParseAccept([]string{"c1:intent-goal"})
	if err != nil {
		t.Fatal(err)
	}
	if g := Gate(run(Pass, Fail), nil, opt); g.Code != GatePass || !strings.Contains(g.String(), "ACCEPTED c1") {
		t.Fatalf("the accepted pair alone: code %d\n%s", g.Code, g)
	}
	g := Gate(twoBad, nil, opt)
	if g.Code != GateFail || !strings.Contains(g.String(), "FAIL c1: not accepted: no-orphan-vmm") {
		t.Fatalf("a new invariant inside an accepted case must fail the gate: code %d\n%s", g.Code, g)
	}
	if g := Gate(twoBad, run(Pass, Pass), opt); g.Code != GateFail || !strings.Contains(g.String(), "REGRESSION c1") {
		t.Fatalf("a regression with an unaccepted invariant must fail: code %d\n%s", g.Code, g)
	}
	// a failure that names no invariant cannot be matched by a pair
	noInv := run(Pass, Fail)
	noInv.Cases[1].Invariants = nil
	if g := Gate(noInv, nil, opt); g.Code != GateFail {
		t.Fatalf("an unnamed failure must not be accepted by a pair: code %d\n%s", g.Code, g)
	}
	bare, warnings, err := ParseAccept([]string{"c1", "c1"})
	if err != nil || len(warnings) != 1 {
		t.Fatalf("a bare id warns once: %v %v", warnings, err)
	}
	opt.Accept = bare
	if g := Gate(twoBad, nil, opt); g.Code != GatePass {
		t.Fatalf("a bare id accepts the whole case: code %d\n%s", g.Code, g)
	}
	opt.Accept, _, _ = ParseAccept([]string{"c1:intent-goal", "c1:stable"})
	if g := Gate(run(Pass, Fail), run(Pass, Fail), opt); !strings.Contains(g.String(), "c1:stable no longer fail") {
		t.Fatalf("a stale pair is not pointed out:\n%s", g)
	}
	if _, _, err := ParseAccept([]string{":intent-goal"}); err == nil {
		t.Fatal("a pair without its case must be an error")
	}
}
