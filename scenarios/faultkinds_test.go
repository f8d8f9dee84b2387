package scenarios

import (
	"testing"

	"github.com/vmchaos/vmchaos/injector"
)

// TestFaultKindsComeFromTheInjectorsList: a scenario may use every kind of
// the injector's one list (power-cut included) under its own name, and the
// scenario-only kinds; nothing else.
func TestFaultKindsComeFromTheInjectorsList(t *testing.T) {
	want := map[string]bool{"failpoint": true, "none": true, FaultSigkillDirect: true}
	for _, k := range injector.FaultKinds {
		if k.Name() != injector.FaultSigkillHitter {
			want[k.Name()] = true
		}
	}
	if !want[FaultPowerCut] {
		t.Fatalf("the injector's list has no %s", FaultPowerCut)
	}
	for k := range want {
		if !FaultKinds[k] {
			t.Errorf("scenarios.FaultKinds lacks %s", k)
		}
	}
	for k := range FaultKinds {
		if !want[k] {
			t.Errorf("scenarios.FaultKinds has %s, which is neither the injector's nor scenario-only", k)
		}
	}
}
