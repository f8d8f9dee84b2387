package scenarios

import (
	"slices"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
)

// TestPowerCutCasesCoverEveryPhaseByRule: every vmctl and agent point of
// create, clone, save, hibernate, wake and delete gets a power-cut case, by
// the rule (operation, point), and the fast subset takes at most three.
func TestPowerCutCasesCoverEveryPhaseByRule(t *testing.T) {
	cases, err := Expand("fake")
	if err != nil {
		t.Fatal(err)
	}
	cut, err := Filter(cases, "fault:power-cut")
	if err != nil {
		t.Fatal(err)
	}
	parked := map[string]bool{}
	fast := 0
	for _, c := range cut {
		f := c.Scenario.Faults[0]
		if f.Kind != FaultPowerCut {
			t.Errorf("%s: fault %s %q", c.ID, f.Kind, f.Trigger)
		}
		if p, ok := strings.CutPrefix(f.Trigger, "park "); ok {
			parked[p] = true
		}
		if slices.Contains(c.Labels, "speed:fast") {
			fast++
		}
	}
	if fast == 0 || fast > 3 {
		t.Errorf("%d power-cut cases in speed:fast, want 1..3", fast)
	}
	for _, p := range failpoint.Catalogue {
		agent := p.Proc == "nodeagent" && slices.Contains([]string{"create", "hibernate", "wake", "delete"}, p.Op)
		vmctl := p.Proc == "vmctl" && slices.Contains([]string{"clone", "save", "net", "rm", "snapshot-rm", "store"}, p.Op)
		if (agent || vmctl) && !parked[p.Name] {
			t.Errorf("no power-cut case parks at %s (%s %s)", p.Name, p.Proc, p.Op)
		}
	}
	// the rule is a function of the pair: a point the operation never
	// passes has no case
	for _, p := range failpoint.Catalogue {
		if p.Name == "snapshot.save.paused" {
			if _, ok := PowerCutScenario(OpCreate, p); ok {
				t.Error("a create power-cut case parked at a save point")
			}
			if s, ok := PowerCutScenario(OpHibernate, p); !ok || s.Faults[0].Trigger != "park snapshot.save.paused" {
				t.Errorf("hibernate at snapshot.save.paused: %v %+v", ok, s.Faults)
			}
		}
	}
}
