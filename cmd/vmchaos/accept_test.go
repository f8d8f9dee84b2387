package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/reports"
)

// TestAcceptSetJoinsFlagAndFile: pairs and bare ids come from the flag and
// the file alike; each bare id warns once on stderr, a pair never does.
func TestAcceptSetJoinsFlagAndFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "accept")
	if err := os.WriteFile(f, []byte("# cocoon findings\nmgr-a:one-vm-per-name\n\n mgr-b  # clone, old form\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var warn bytes.Buffer
	got, err := acceptSet([]string{"mgr-c:intent-goal", "mgr-c:no-orphan-vmm", " "}, f, &warn)
	if err != nil {
		t.Fatal(err)
	}
	want := reports.AcceptSet{
		Pairs: map[string]map[string]bool{"mgr-a": {"one-vm-per-name": true}, "mgr-c": {"intent-goal": true, "no-orphan-vmm": true}},
		Cases: map[string]bool{"mgr-b": true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if w := warn.String(); strings.Count(w, "warning:") != 1 || !strings.Contains(w, "mgr-b:INVARIANT") {
		t.Fatalf("want one warning naming the bare id mgr-b, got %q", w)
	}
	if _, err := acceptSet(nil, filepath.Join(t.TempDir(), "missing"), &warn); err == nil {
		t.Fatal("a missing accept file must be an error")
	}
	if _, err := acceptSet([]string{"mgr-a:"}, "", &warn); err == nil {
		t.Fatal("a pair without its invariant must be an error")
	}
	if got, err := acceptSet(nil, "", &warn); err != nil || !got.Empty() {
		t.Fatalf("no accept: %+v %v", got, err)
	}
}

// TestGateAcceptFlagEndToEnd runs `report gate --accept` on a results.json
// whose accepted case also fails a second invariant: the gate must fail
// (exit 1) and name it; accepting both passes; a bare id passes with a
// warning on stderr.
func TestGateAcceptFlagEndToEnd(t *testing.T) {
	dir := t.TempDir()
	res := &reports.Results{RunID: "r", Backend: "fake", TimeScale: 0.05, Cases: []reports.Case{{
		ID: "mgr-x", Scenario: "mgr-x", Verdict: reports.Fail, ConvergeMs: 10, Attempts: 1, Repro: "vmchaos repro --scenario mgr-x",
		Invariants: []reports.Invariant{{Name: "one-vm-per-name", Evidence: "two vms named a"}, {Name: "no-orphan-vmm", Evidence: "pid 7"}},
	}}}
	if err := reports.WriteAll(dir, res); err != nil {
		t.Fatal(err)
	}
	gate := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		c := newReportGateCmd()
		c.SetOut(&out)
		c.SetErr(&errb)
		c.SetArgs(append(args, dir))
		err := c.Execute()
		code := 0
		if ge, ok := err.(*reports.GateError); ok {
			code = ge.Code
		} else if err != nil {
			t.Fatalf("gate %v: %v", args, err)
		}
		return code, out.String(), errb.String()
	}
	code, out, _ := gate("--accept", "mgr-x:one-vm-per-name")
	if code != reports.GateFail || !strings.Contains(out, "FAIL mgr-x: not accepted: no-orphan-vmm") {
		t.Fatalf("a new invariant inside an accepted case must fail the gate: exit %d\n%s", code, out)
	}
	if code, out, _ = gate("--accept", "mgr-x:one-vm-per-name,mgr-x:no-orphan-vmm"); code != reports.GatePass || !strings.Contains(out, "ACCEPTED mgr-x") {
		t.Fatalf("both findings accepted: exit %d\n%s", code, out)
	}
	code, out, errOut := gate("--accept", "mgr-x")
	if code != reports.GatePass || !strings.Contains(errOut, "warning: --accept mgr-x: a bare case id") {
		t.Fatalf("a bare id keeps working with a warning: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
}
