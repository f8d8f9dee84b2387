package runner

import (
	"reflect"
	"testing"

	"github.com/vmchaos/vmchaos/scenarios/checker"
)

// TestAdoptionBaselineIsTheReadyIntentsBeforeTheFault: the baseline of
// vms-adopted is what was listed before the fault (preFault), kept for the
// intents that must end ready, and never nil, so an empty one is judged (and
// fails) instead of leaving the invariant out.
func TestAdoptionBaselineIsTheReadyIntentsBeforeTheFault(t *testing.T) {
	cr := &caseRun{goals: map[string]string{"a": checker.GoalReady, "b": checker.GoalDeleted, "c": checker.GoalHibernated}}
	cr.adoptBaseline()
	if cr.adopted == nil || len(cr.adopted) != 0 {
		t.Fatalf("nothing listed: baseline %v, want empty and not nil", cr.adopted)
	}
	cr.preFault = map[string]string{"a": "A1", "b": "B1", "c": "C1", "calib-0": "K1"}
	cr.adoptBaseline()
	if want := map[string]string{"a": "A1"}; !reflect.DeepEqual(cr.adopted, want) {
		t.Fatalf("baseline %v, want %v", cr.adopted, want)
	}
}
