package scenarios

import (
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/regress"
)

func TestCatalogueIsValid(t *testing.T) {
	if err := Validate(regress.Names()); err != nil {
		t.Fatal(err)
	}
}

// TestValidateRefusesAnUnknownNetMode: a net mode vmctl does not have
// would run the case in fake mode and prove nothing about tap.
func TestValidateRefusesAnUnknownNetMode(t *testing.T) {
	old := Catalogue
	t.Cleanup(func() { Catalogue = old })
	s := Catalogue[0]
	s.ID, s.Env.NetMode = "bad-net-mode", "tun"
	Catalogue = append(append([]Scenario(nil), old...), s)
	if err := Validate(regress.Names()); err == nil || !strings.Contains(err.Error(), `bad-net-mode: net mode "tun"`) {
		t.Fatalf("Validate: %v", err)
	}
}

func TestEveryBugIsTargeted(t *testing.T) {
	for _, b := range regress.Bugs {
		if len(ScenariosTargeting(b.Name)) == 0 {
			t.Errorf("bug %s (seed %s) is targeted by no scenario", b.Name, b.Seed)
		}
	}
}

func TestTriggersNameCataloguedPoints(t *testing.T) {
	for _, s := range Catalogue {
		for _, f := range s.Faults {
			fields := strings.Fields(f.Trigger)
			if len(fields) < 2 || fields[0] == "after-exit" {
				continue
			}
			p := strings.SplitN(strings.SplitN(fields[1], "#", 2)[0], "@", 2)[0]
			if _, ok := failpoint.Lookup(p); !ok {
				t.Errorf("%s: trigger point %q is not in the failpoint catalogue", s.ID, p)
			}
			for _, w := range f.Window {
				if _, ok := failpoint.Lookup(w); w != "" && !ok {
					t.Errorf("%s: window point %q is not in the failpoint catalogue", s.ID, w)
				}
			}
		}
	}
}

func TestExpandGivesFastSubsetCoveringEverySeed(t *testing.T) {
	cases, err := Expand("fake")
	if err != nil {
		t.Fatal(err)
	}
	fast, err := Filter(cases, "speed:fast")
	if err != nil {
		t.Fatal(err)
	}
	seeds := map[string]bool{}
	for _, c := range fast {
		seeds[c.Scenario.SeedRef[:3]] = true
	}
	for _, want := range []string{"000", "001", "002"} {
		if !seeds[want] {
			t.Errorf("fast subset misses seed %s", want)
		}
	}
	if len(fast) >= len(cases) {
		t.Errorf("fast subset (%d) is not smaller than the whole catalogue (%d)", len(fast), len(cases))
	}
}

func TestLabelFilterSelectsExactly(t *testing.T) {
	cases, _ := Expand("fake")
	got, err := Filter(cases, "seed:001 && op:hibernate")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 {
		t.Fatal("no case for seed:001 && op:hibernate")
	}
	for _, c := range got {
		if !strings.HasPrefix(c.Scenario.SeedRef, "001") || c.Scenario.Op != OpHibernate {
			t.Errorf("%s selected by seed:001 && op:hibernate", c.ID)
		}
	}
	for _, c := range cases {
		if strings.HasPrefix(c.Scenario.SeedRef, "001") && c.Scenario.Op == OpHibernate {
			found := false
			for _, g := range got {
				found = found || g.ID == c.ID
			}
			if !found {
				t.Errorf("%s not selected", c.ID)
			}
		}
	}
}

func TestCaseIDsUnique(t *testing.T) {
	cases, _ := Expand("fake")
	seen := map[string]bool{}
	for _, c := range cases {
		if seen[c.ID] {
			t.Errorf("duplicate case id %s", c.ID)
		}
		seen[c.ID] = true
	}
}

func TestFracSweepParsesAndExpandsDeterministicIDs(t *testing.T) {
	got, err := ParseFracSweep("0%..95%/5%")
	if err != nil || len(got) != 20 || got[7] != 0.35 || got[19] != 0.95 {
		t.Fatalf("0%%..95%%/5%% = %v, %v; want 20 fractions 0..0.95", got, err)
	}
	if l, err := ParseFracSweep("2.5%,50%"); err != nil || len(l) != 2 || l[0] != 0.025 || FormatFrac(l[0]) != "2.5%" {
		t.Fatalf("list = %v, %v", l, err)
	}
	for _, bad := range []string{"0ms..3000ms/100ms", "5%..101%/5%", "50%..5%/5%", "0%..50%/0%", "x%"} {
		if _, err := ParseFracSweep(bad); err == nil {
			t.Errorf("ParseFracSweep(%q) accepted", bad)
		}
	}
	cases, err := Expand("fake")
	if err != nil {
		t.Fatal(err)
	}
	var slow, fast []Case
	for _, c := range cases {
		if strings.HasPrefix(c.ID, "sweep-save-stop@") {
			if c.Speed == "slow" {
				slow = append(slow, c)
			} else {
				fast = append(fast, c)
			}
		}
	}
	// coarse fractions are the fast cases; the fine sweep skips them
	coarse, _ := ParseFracSweep(coarseFracs)
	isCoarse := map[float64]bool{}
	for i, c := range fast {
		if i >= len(coarse) || !c.HasFrac || c.HasOff || c.Frac != coarse[i] || c.ID != "sweep-save-stop@"+FormatFrac(coarse[i]) {
			t.Errorf("fast case %d = %s: want an unresolved fraction case at %v", i, c.ID, coarse)
		}
		isCoarse[c.Frac] = true
	}
	if len(fast) != len(coarse) {
		t.Fatalf("sweep-save-stop has %d fast cases, want %d", len(fast), len(coarse))
	}
	var want []float64
	fine, _ := ParseFracSweep(fineFracs)
	for _, f := range fine {
		if !isCoarse[f] {
			want = append(want, f)
		}
	}
	if len(slow) != len(want) {
		t.Fatalf("sweep-save-stop has %d slow cases, want %d", len(slow), len(want))
	}
	for i, c := range slow {
		if !c.HasFrac || c.HasOff || c.Frac != want[i] || c.ID != "sweep-save-stop@"+FormatFrac(want[i]) {
			t.Errorf("slow case %d = %+v: want an unresolved fraction case at %v", i, c.ID, want[i])
		}
	}
	if c, err := CaseForFrac("sweep-save-stop", 0.35, "fake"); err != nil || c.ID != "sweep-save-stop@35%" {
		t.Errorf("CaseForFrac = %q, %v", c.ID, err)
	}
	if _, err := CaseForFrac("s001-2-stop-in-pause-window", 0.35, "fake"); err == nil {
		t.Error("CaseForFrac accepted a scenario without a window")
	}
}
