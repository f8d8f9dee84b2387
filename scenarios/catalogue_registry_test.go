package scenarios

import (
	"slices"
	"strings"
	"testing"
)

// TestRegistryFaultsAimAtTheRegistry: every fault of a registry kind names
// the registry's unit (else the runner would aim it at the agent) and runs
// in a case with a real registry; every real-registry case carries the
// registry:oci label.
func TestRegistryFaultsAimAtTheRegistry(t *testing.T) {
	n := 0
	for _, s := range Catalogue {
		for _, f := range s.Faults {
			if strings.HasPrefix(f.Kind, "registry-") {
				n++
				if f.Unit != UnitRegistry || s.Env.Registry != RegistryOCI {
					t.Errorf("%s: fault %s on unit %q in a case with registry %q", s.ID, f.Kind, f.Unit, s.Env.Registry)
				}
			}
		}
		if (s.Env.Registry == RegistryOCI) != slices.Contains(s.Labels, LabelRegistryOCI) {
			t.Errorf("%s: registry %q, labels %v", s.ID, s.Env.Registry, s.Labels)
		}
	}
	if n == 0 {
		t.Fatal("no registry fault in the catalogue")
	}
}
