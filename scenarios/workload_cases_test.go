package scenarios

import (
	"slices"
	"testing"
)

// TestJudgesCutIsDecidedFromTheCase: the cut is compulsory where a guest
// runs the writer and the case takes or restores a snapshot after it
// started, whatever Expect says (issue 31 item 4).
func TestJudgesCutIsDecidedFromTheCase(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"wl-save-held-paused", true},                            // a direct save under workload
		{"wl-save-killed-paused-sigkill-child", true},            // the agent's save, killed
		{"park-snapshot-save-paused-sigkill-main", true},         // a hibernate under workload
		{"mx-hibernate-agent-hibernate-saved-sigkill-vmm", true}, // Expect.Ledger is false: still judged
		{"gap-wake-restores-snapshot", true},                     // a wake of a hibernate taken under workload
		{"powercut-delete-hibernated-snapshot-rm-done", true},    // the setup hibernated under workload (ends deleted)
		{"s000-vmm-kill-event", false},                           // a writer, no snapshot
		{"s001-h-create-restart", false},                         // a create: a clone of the base, no writer
		{"s002-clone-sigkill-59ms-daemon", false},                // a clone with no writer
	} {
		s, ok := Lookup(tc.id)
		if !ok {
			t.Fatalf("no scenario %s", tc.id)
		}
		if got := s.JudgesCut(); got != tc.want {
			t.Errorf("%s: JudgesCut %v, want %v", tc.id, got, tc.want)
		}
	}
	for _, s := range Catalogue {
		if s.Expect.Workload && !s.JudgesCut() {
			t.Errorf("%s expects the workload but the rule does not judge its cut", s.ID)
		}
	}
}

// TestKilledSaveCasesCoverEveryPhaseAndKind: every save phase × {SIGKILL of
// the agent, of the save child, power cut}, each labelled workload, a fast
// representative or two.
func TestKilledSaveCasesCoverEveryPhaseAndKind(t *testing.T) {
	cases, err := Expand("fake")
	if err != nil {
		t.Fatal(err)
	}
	wl, err := Filter(cases, "workload")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	fast := 0
	for _, c := range wl {
		f := c.Scenario.Faults[0]
		if f.Kind == "none" {
			continue
		}
		got[f.Trigger+" × "+f.Kind] = true
		if f.Kind == "sigkill-child" && f.Child != "snapshot-save" {
			t.Errorf("%s: kills child %q", c.ID, f.Child)
		}
		if !c.Scenario.Expect.Workload || !c.Scenario.JudgesCut() {
			t.Errorf("%s does not judge the cut", c.ID)
		}
		if slices.Contains(c.Labels, "speed:fast") {
			fast++
		}
	}
	for _, p := range wlSavePoints {
		for _, k := range []string{"sigkill-main", "sigkill-child", FaultPowerCut} {
			if !got["park "+p+" × "+k] {
				t.Errorf("no killed-save case parks at %s with %s", p, k)
			}
		}
	}
	if fast < 1 || fast > 2 {
		t.Errorf("%d killed-save cases in speed:fast, want 1 or 2", fast)
	}
}
