package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios/suite"
)

// TestSharedOrderTakesTheCaseTimesBesideTheRunDir: with --case-times auto
// a scheduled run orders its shared cases by the file its results root
// holds (the durations the runs before it recorded there); without one,
// with a corrupt one (a hint only), with off or sequential it keeps
// catalogue order; a file named explicitly must exist.
func TestSharedOrderTakesTheCaseTimesBesideTheRunDir(t *testing.T) {
	cases, err := selectCases("fake", "speed:fast", "")
	if err != nil || len(cases) < 10 {
		t.Fatalf("fast subset: %d cases, %v", len(cases), err)
	}
	classes := make([]suite.Class, len(cases))
	for i, c := range cases {
		classes[i], _ = suite.Classify(c)
	}
	catalogue := suite.CatalogueOrder(classes)
	root := t.TempDir()
	dir := filepath.Join(root, "run")
	o := &runCmd{caseTimes: "auto"}
	o.f.backend, o.f.scale = "fake", 0.05
	same := func(name string, got suite.Order) {
		t.Helper()
		if !reflect.DeepEqual(got.Shared, catalogue.Shared) || len(got.AfterLane) != 0 {
			t.Errorf("%s: %+v, want catalogue order", name, got)
		}
	}
	got, err := o.sharedOrder(cases, dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	same("no file yet", got)
	// durations recorded in reverse catalogue order: the last shared case is the shortest
	res := &reports.Results{Backend: "fake", TimeScale: 0.05}
	for k, i := range catalogue.Shared {
		res.Cases = append(res.Cases, reports.Case{ID: cases[i].ID, DurationMs: float64(1000 - k)})
	}
	if err := reports.RecordCaseTimes(caseTimesPath(dir), res); err != nil {
		t.Fatal(err)
	}
	if got, err = o.sharedOrder(cases, dir, 5); err != nil || got.Source != caseTimesPath(dir) {
		t.Fatalf("with the file: %+v, %v", got, err)
	}
	if last := catalogue.Shared[len(catalogue.Shared)-1]; got.Shared[0] != last {
		t.Errorf("first shared case %d, want the shortest, %d", got.Shared[0], last)
	}
	got, _ = o.sharedOrder(cases, dir, 1)
	same("sequential", got)
	o.caseTimes = "off"
	got, _ = o.sharedOrder(cases, dir, 5)
	same("off", got)
	o.caseTimes = "auto"
	if err := os.WriteFile(caseTimesPath(dir), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err = o.sharedOrder(cases, dir, 5)
	if err != nil {
		t.Fatalf("a corrupt hint file failed the run: %v", err)
	}
	same("corrupt file", got)
	o.caseTimes = filepath.Join(root, "missing.json")
	if _, err := o.sharedOrder(cases, dir, 5); err == nil {
		t.Error("a --case-times file that does not exist was accepted")
	}
}
