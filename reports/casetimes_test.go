package reports

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRecordCaseTimesMergesPerBackendAndScale: each run's durations go
// into the file under its backend and time scale, merged with what
// earlier runs recorded (a later run of a case replaces its time); a
// missing file reads as empty and a corrupt one is replaced.
func TestRecordCaseTimesMergesPerBackendAndScale(t *testing.T) {
	path := filepath.Join(t.TempDir(), CaseTimesFile)
	if ct, err := LoadCaseTimes(path); err != nil || len(ct.Of("fake", 0.05)) != 0 {
		t.Fatalf("missing file: %v %v", ct, err)
	}
	run := func(backend string, scale float64, cases ...Case) *Results {
		return &Results{Backend: backend, TimeScale: scale, Cases: cases}
	}
	if err := RecordCaseTimes(path, run("fake", 0.05, Case{ID: "a", DurationMs: 900}, Case{ID: "b", DurationMs: 2500})); err != nil {
		t.Fatal(err)
	}
	if err := RecordCaseTimes(path, run("fake", 0.05, Case{ID: "a", DurationMs: 1100}, Case{ID: "c"})); err != nil {
		t.Fatal(err)
	}
	if err := RecordCaseTimes(path, run("fake", 1, Case{ID: "a", DurationMs: 18000})); err != nil {
		t.Fatal(err)
	}
	ct, err := LoadCaseTimes(path)
	if err != nil {
		t.Fatal(err)
	}
	got := ct.Of("fake", 0.05)
	want := map[string]time.Duration{"a": 1100 * time.Millisecond, "b": 2500 * time.Millisecond}
	if len(got) != len(want) || got["a"] != want["a"] || got["b"] != want["b"] {
		t.Errorf("fake@0.05 = %v, want %v (c never ran: no time)", got, want)
	}
	if got := ct.Of("fake", 1); got["a"] != 18*time.Second || len(got) != 1 {
		t.Errorf("fake@1 = %v", got)
	}
	if err := os.WriteFile(path, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCaseTimes(path); err == nil {
		t.Error("a corrupt file read without error")
	}
	if err := RecordCaseTimes(path, run("fake", 0.05, Case{ID: "d", DurationMs: 1})); err != nil {
		t.Fatal(err)
	}
	if ct, err := LoadCaseTimes(path); err != nil || len(ct.Of("fake", 0.05)) != 1 {
		t.Errorf("corrupt file not replaced: %v %v", ct, err)
	}
}
