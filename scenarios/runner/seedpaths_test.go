package runner

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
)

func writeRecord(t *testing.T, status map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "vms"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"name": "a", "generation": 3, "status": status})
	if err := os.WriteFile(filepath.Join(dir, "vms", "a.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func readRecord(t *testing.T, dir string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "vms", "a.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestRecordEditsWriteWhatTheySay: each hand edit writes what its step
// names and refuses a record it would make no sense on (a harness error,
// never a silently different case).
func TestRecordEditsWriteWhatTheySay(t *testing.T) {
	bound := func() map[string]any {
		return map[string]any{"lifecycle": "ready", "post_clone": "done", "vm_id": "V1"}
	}
	unbound := func() map[string]any { return map[string]any{"lifecycle": "hibernated"} }

	dir := writeRecord(t, bound())
	if err := editRecord(dir, "a", markPostCloneFailed); err != nil {
		t.Fatal(err)
	}
	doc := readRecord(t, dir)
	st := doc["status"].(map[string]any)
	if doc["op"] != "create" || doc["step"] != "cloned" || doc["failed_generation"] != float64(3) ||
		st["lifecycle"] != "failed" || st["post_clone"] != "failed" || st["failed_reason"] != "post_clone" || st["vm_id"] != "V1" {
		t.Errorf("mark-post-clone-failed wrote %v", doc)
	}
	if err := editRecord(writeRecord(t, unbound()), "a", markPostCloneFailed); err == nil || !strings.Contains(err.Error(), "no VM bound") {
		t.Errorf("mark-post-clone-failed on a record without a VM: %v", err)
	}

	dir = writeRecord(t, map[string]any{"lifecycle": "creating", "post_clone": "running", "vm_id": "V1"})
	if err := editRecord(dir, "a", wipeLifecycle); err != nil {
		t.Fatal(err)
	}
	if st := readRecord(t, dir)["status"].(map[string]any); st["lifecycle"] != nil || st["post_clone"] != "running" {
		t.Errorf("wipe-lifecycle left %v", st)
	}
	if err := editRecord(writeRecord(t, unbound()), "a", wipeLifecycle); err == nil {
		t.Error("wipe-lifecycle without a post_clone marker was accepted")
	}

	dir = writeRecord(t, unbound())
	if err := editRecord(dir, "a", markStaleDone); err != nil {
		t.Fatal(err)
	}
	if st := readRecord(t, dir)["status"].(map[string]any); st["post_clone"] != "done" {
		t.Errorf("mark-post-clone-done left %v", st)
	}
	if err := editRecord(writeRecord(t, bound()), "a", markStaleDone); err == nil {
		t.Error("a stale marker on a bound VM was accepted")
	}
}

// TestStalledAgentShowsItsWedge: a case judgeStall fails as the product's
// (the agent paused at agent.create.begin for good, the double of
// TestStalledAgentFailsAsProduct) also judges wedge-visible, on a real
// fake-backend stack: the bundled agent reports the stuck create on its API
// and metric; with wedge-log-only (the field's agent: log lines only) the
// same case fails wedge-visible.
func TestStalledAgentShowsItsWedge(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts the whole stack; run without -short")
	}
	t.Parallel() // waits out budgets, see runSideBySide
	c, err := scenarios.CaseFor("s001-h-post-clone-running", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	stalled := withScenario(c, func(s *scenarios.Scenario) { s.Env.Failpoints = "agent.create.begin=pause@vm=vm-a" })
	cases := []struct {
		bugs []string
		ok   bool
		want string
	}{
		{nil, true, "reported (no_progress)"},
		{[]string{"wedge-log-only"}, false, "no wedge event on the agent's API names it"},
	}
	// both wait out the 20 s budget: side by side (a park, no clock); the
	// bug names tell their case dirs apart
	ctx, r := newTestRunner(t, 5*time.Minute)
	runs := make([]caseRunArgs, len(cases))
	for i, tc := range cases {
		runs[i] = caseRunArgs{c: stalled, bugs: tc.bugs}
	}
	for i, rc := range runSideBySide(ctx, r, runs) {
		tc := cases[i]
		inv, ok := invariant(rc, checker.WedgeVisible)
		if rc.Verdict != reports.Fail || !ok || inv.OK != tc.ok || !strings.Contains(inv.Evidence, tc.want) {
			t.Fatalf("bugs %v: %s (%s), %s %+v; want a product fail with %s ok=%v naming %q",
				tc.bugs, rc.Verdict, rc.Reason, checker.WedgeVisible, inv, checker.WedgeVisible, tc.ok, tc.want)
		}
		t.Logf("bugs %v: %s: %s", tc.bugs, inv.Name, inv.Evidence)
	}
}
