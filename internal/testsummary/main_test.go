package main

import (
	"os"
	"strings"
	"testing"
)

// TestMixedRun reads real `go test -json` output (testdata/mixed.json: a
// pass, a fail with output, a skip with its reason, a subtest, a package
// that does not build) and must report each and fail.
func TestMixedRun(t *testing.T) {
	f, err := os.Open("testdata/mixed.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out strings.Builder
	s, err := summarize(f, &out)
	if err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"SKIPPED (1)",
		"example.com/tsum/a TestSkips: a_test.go:13: missing binary: no qemu-img on PATH: install qemu-utils",
		"--- FAIL example.com/tsum/a TestFails\n=== RUN   TestFails\n    a_test.go:8: got 3\n    a_test.go:9: want 4\n",
		"--- FAIL package example.com/tsum/b\n# example.com/tsum/b [example.com/tsum/b.test]\nb/b_test.go:5:33: undefined: undefined\n",
		"3 passed, 1 failed, 1 skipped (2 package(s) failed)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if s.ok() {
		t.Error("a run with a failed test and a broken build reads ok")
	}
}

func TestPassingRunIsOKAndPassesTextThrough(t *testing.T) {
	in := `{"Action":"start","Package":"p"}
# a vet note, not JSON
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestB","Output":"--- SKIP: TestB (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestB"}
{"Action":"pass","Package":"p"}
`
	var out strings.Builder
	s, err := summarize(strings.NewReader(in), &out)
	if err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"# a vet note, not JSON\n", "ok    p\n", "p TestB: no reason given", "1 passed, 0 failed, 1 skipped\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if !s.ok() {
		t.Errorf("a passing run reads failed:\n%s", got)
	}
}

// TestNothingReadFails: no events (go test never ran) is not a pass.
func TestNothingReadFails(t *testing.T) {
	var out strings.Builder
	s, err := summarize(strings.NewReader(""), &out)
	if err != nil {
		t.Fatal(err)
	}
	if s.ok() || !strings.Contains(out.String(), "go test did not run") {
		t.Errorf("empty input: ok %v, output %q", s.ok(), out.String())
	}
}
