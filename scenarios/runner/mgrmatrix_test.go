package runner

import (
	"slices"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/stackbin"
)

// noStore hides an adapter's StoreLayout: a manager whose store dirs are
// unknown gets no power-cut case.
type noStore struct{ manager.Manager }

// The matrix: at every discovered VMM phase a power cut and a frozen verb,
// at every offset a power cut; every cell speed:nightly but one
// representative per kind; no power cut for an adapter that names no store
// dirs.
func TestManagerMatrixCells(t *testing.T) {
	m, err := NewManager("vmctl", manager.Options{Bin: "/x/vmctl", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	phases := map[manager.Verb][]string{manager.VerbClone: {"ch.restore.begin", "ch.resume"},
		manager.VerbSnapshotSave: {"ch.snapshot.memory-written"}}
	kinds := map[string]int{}
	var fast []string
	for _, c := range scenarios.ExpandManager(m, phases, nil) {
		mc := c.Scenario.Mgr
		if !mc.PowerCut && !mc.Freeze {
			continue
		}
		kinds[c.Scenario.Faults[0].Kind]++
		if !slices.Contains(c.Labels, "speed:nightly") {
			fast = append(fast, c.ID)
		}
		if mc.Freeze && mc.Trigger != scenarios.MgrTrigPark {
			t.Errorf("%s: a freeze needs a park, has %s", c.ID, mc.Trigger)
		}
	}
	// clone: 2 phases + 3 offsets; save: 1 phase + 3 offsets; rm, stop,
	// start: 3 offsets each (no phase given)
	if kinds[scenarios.MgrFaultPowerCut] != 5+4+9 || kinds[scenarios.MgrFaultFreeze] != 3 {
		t.Errorf("cells per kind %v, want power-cut 18, sigstop-verb 3", kinds)
	}
	slices.Sort(fast)
	if want := []string{"mgr-clone-powercut-at-ch.restore.begin", "mgr-snapshot-save-freeze-at-ch.snapshot.memory-written"}; !slices.Equal(fast, want) {
		t.Errorf("cells outside speed:nightly %v, want %v", fast, want)
	}
	freezes := 0
	for _, c := range scenarios.ExpandManager(noStore{m}, phases, nil) {
		if c.Scenario.Mgr.PowerCut {
			t.Errorf("%s: a power cut for an adapter that names no store dirs", c.ID)
		}
		if c.Scenario.Mgr.Freeze {
			freezes++
		}
	}
	if freezes != 3 {
		t.Errorf("without store dirs: %d freeze cells, want the same 3", freezes)
	}
}

// TestFrozenVerbJudgements: the frozen-verb case passes on the bundled
// vmctl and fails on two test-only doubles of it, each the bug one of its
// judgements targets: a verb that hangs once thawed (verb-ends-after-thaw),
// and a verb that, thawed, kills its work half done and reports success
// (thawed-verb-result-holds: the clone's record is left creating).
func TestFrozenVerbJudgements(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs manager cases against the bundled vmctl; run without -short")
	}
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	real := bin + "/vmctl"
	const id = "mgr-clone-freeze-at-ch.restore.begin"
	// The wrapper runs the clone under test as its child, so the freeze
	// stops both and the SIGCONT reaches the wrapper's trap.
	clone := func(onCont string) string {
		return `case "$*" in *"vm clone --name tgt"*) trap '` + onCont + `' CONT; ` + real + ` "$@" & c=$!; wait $c; wait $c; exit $?;; esac`
	}
	for _, tc := range []struct {
		name, when, inv, want string
	}{
		{"passes unbroken", ":", "", ""},
		{"hangs once thawed", clone(`sleep 600`), VerbEndsAfterThaw, "did not end within"},
		{"reports success over half-done work", clone(`kill -9 $c; exit 0`), ThawedVerbResultHolds, "want running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := mgrCaseRun(t, bin, brokenVmctl(t, bin, tc.when), id)
			if tc.inv == "" {
				if rc.Verdict != reports.Pass {
					t.Fatalf("unbroken: %s %s %+v", rc.Verdict, rc.Reason, rc.Invariants)
				}
				return
			}
			inv, ok := failedInv(rc, tc.inv)
			if rc.Verdict != reports.Fail || !ok || !strings.Contains(inv.Evidence, tc.want) {
				t.Fatalf("verdict %s (%s): %s failed %v: %q; want it failed naming %q (invariants %+v)",
					rc.Verdict, rc.Reason, tc.inv, ok, inv.Evidence, tc.want, rc.Invariants)
			}
			t.Logf("%s: %s", tc.inv, inv.Evidence)
		})
	}
}
