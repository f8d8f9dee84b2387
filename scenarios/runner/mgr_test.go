package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/internal/needs"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/stackbin"
)

// brokenVmctl writes a wrapper around the bundled vmctl whose behaviour the
// shell snippet `when` changes for some verbs ("$*" is the argv); every other
// call runs vmctl itself. It is the manager under test: a real binary whose
// own failures the runner must judge.
func brokenVmctl(t *testing.T, bin, when string) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "vmctl")
	script := "#!/bin/sh\nSTATE=" + dir + "\n" + when + "\nexec " + filepath.Join(bin, "vmctl") + " \"$@\"\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// mgrCaseRun runs the manager case id against the manager binary mbin.
func mgrCaseRun(t *testing.T, bin, mbin, id string) reports.Case {
	t.Helper()
	r, err := New(context.Background(), Options{ReportDir: t.TempDir(), Scale: 0.05, Seed: 1, BinDir: bin,
		Manager: "vmctl", ManagerBin: mbin})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}()
	m, err := NewManager("vmctl", manager.Options{Bin: mbin})
	if err != nil {
		t.Fatal(err)
	}
	phases := map[manager.Verb][]string{manager.VerbSnapshotSave: {"ch.snapshot.memory-written"}, manager.VerbClone: {"ch.restore.begin"}}
	for _, c := range scenarios.ExpandManager(m, phases, nil) {
		if c.ID == id {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			rc := r.RunCase(ctx, c)
			t.Logf("%s: %s (%s) %s", id, rc.Verdict, rc.Culprit, rc.Reason)
			for _, inv := range rc.Invariants {
				if !inv.OK {
					t.Logf("  %s: %s", inv.Name, inv.Evidence)
				}
			}
			return rc
		}
	}
	t.Fatalf("no case %s", id)
	return reports.Case{}
}

func failedInv(rc reports.Case, name string) (reports.Invariant, bool) {
	for _, inv := range rc.Invariants {
		if inv.Name == name && !inv.OK {
			return inv, true
		}
	}
	return reports.Invariant{}, false
}

// Issue 32 item 5: a manager that fails its own setup, fixture, calibration
// or event stream is a fail with that evidence, never inconclusive; the
// same wrapper without the breakage passes (so the fails are the
// breakage's).
func TestManagerOwnFailuresAreFails(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs manager cases against the bundled vmctl; run without -short")
	}
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, when, id, inv, want string
	}{
		{"passes unbroken", ":", "mgr-snapshot-save-kill-at-ch.snapshot.memory-written", "", ""},
		{"fixture create fails", `case "$*" in "vm run"*) echo "Error: out of quota" >&2; exit 1;; esac`,
			"mgr-vmm-kill9", ManagerSetup, "out of quota"},
		{"calibration fails", `case "$*" in *"--name calib-1"*) echo "Error: clone refused" >&2; exit 1;; esac`,
			"mgr-clone-kill-at-35%", ManagerCalibration, "clone refused"},
		{"event stream dies", `case "$*" in *"status --event"*) exit 3;; esac`,
			"mgr-snapshot-save-kill-at-ch.snapshot.memory-written", EventsMatchState, "the event stream exited 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := mgrCaseRun(t, bin, brokenVmctl(t, bin, tc.when), tc.id)
			if tc.inv == "" {
				if rc.Verdict != reports.Pass {
					t.Fatalf("unbroken wrapper: %s %s %+v", rc.Verdict, rc.Reason, rc.Invariants)
				}
				return
			}
			inv, ok := failedInv(rc, tc.inv)
			if rc.Verdict != reports.Fail || rc.Culprit != "product" || !ok || !strings.Contains(inv.Evidence, tc.want) {
				t.Fatalf("verdict %s (culprit %s, %s), %s failed %v: %q; want a product fail naming %q",
					rc.Verdict, rc.Culprit, rc.Reason, tc.inv, ok, inv.Evidence, tc.want)
			}
		})
	}
}

// saveRecovery runs the save case parked after its memory was written
// against a vmctl wrapped by when, and returns its verdict and recovery.
func saveRecovery(t *testing.T, when string) (reports.Case, reports.Invariant) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: runs a manager case against the bundled vmctl; run without -short")
	}
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	rc := mgrCaseRun(t, bin, brokenVmctl(t, bin, when), "mgr-snapshot-save-kill-at-ch.snapshot.memory-written")
	for _, inv := range rc.Invariants {
		if inv.Name == RecoveryVerbSucceeds {
			return rc, inv
		}
	}
	t.Fatalf("no %s: %s %s %+v", RecoveryVerbSucceeds, rc.Verdict, rc.Reason, rc.Invariants)
	return rc, reports.Invariant{}
}

// A retry refused with the holder's id (seed 001 #3: "already in use by
// <ID>") is recovered as the field does: rm of the holder by its id, then
// the SAME name again, never a new one.
func TestSaveRetryKeepsTheNameAndRemovesTheHolder(t *testing.T) {
	// the second save of tgt (the retry; the first is the killed verb) is
	// refused until the holder HOLDER1 is removed
	rc, rec := saveRecovery(t, `case "$*" in
"snapshot save --name tgt"*)
  n=$(cat $STATE/n 2>/dev/null || echo 0); echo $((n+1)) > $STATE/n
  if [ "$n" = 1 ] && [ ! -e $STATE/rm ]; then echo 'Error: save snapshot: snapshot name "tgt" already in use by HOLDER1' >&2; exit 1; fi;;
"snapshot rm HOLDER1") touch $STATE/rm; exit 0;;
esac`)
	if rc.Verdict != reports.Pass || !rec.OK {
		t.Fatalf("%s %s: %+v", rc.Verdict, rc.Reason, rc.Invariants)
	}
	for _, want := range []string{"refused by holder HOLDER1, so snapshot-rm snapshot=HOLDER1: ok", "retry: snapshot-save vm=src name=tgt: ok"} {
		if !strings.Contains(rec.Evidence, want) {
			t.Errorf("recovery evidence %q lacks %q", rec.Evidence, want)
		}
	}
	if strings.Contains(rec.Evidence, "tgt-") {
		t.Errorf("the retry chose another name: %s", rec.Evidence)
	}
}

// A clone killed after its placeholder whose manager's own recovery frees
// nothing (its stale-create verb and gc do nothing, as cocoon's gc leaves a
// dead clone's record) fails name-freed-by-recovery naming the holder, even
// though the embedder's rm by id then lets the retry succeed; the bundled
// vmctl's recovery frees the name.
func TestDeadClonePlaceholderHoldingTheNameFails(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs a manager case against the bundled vmctl; run without -short")
	}
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	const id = "mgr-clone-kill-at-ch.restore.begin"
	for _, tc := range []struct {
		name, when string
		ok         bool
		want       string
	}{
		{"vmctl", "", true, "was not refused"},
		{"recovery frees nothing", `case "$*" in
"vm reconcile-stale-create"*|gc*) exit 0;;
esac`, false, `still held the name "tgt"`},
	} {
		mbin := filepath.Join(bin, "vmctl")
		if tc.when != "" {
			mbin = brokenVmctl(t, bin, tc.when)
		}
		rc := mgrCaseRun(t, bin, mbin, id)
		var got *reports.Invariant
		for i := range rc.Invariants {
			if rc.Invariants[i].Name == NameFreedByRecovery {
				got = &rc.Invariants[i]
			}
		}
		if got == nil || got.OK != tc.ok || !strings.Contains(got.Evidence, tc.want) {
			t.Fatalf("%s: %s (%s) %+v; want %s ok=%v naming %q", tc.name, rc.Verdict, rc.Reason, got, NameFreedByRecovery, tc.ok, tc.want)
		}
		if !tc.ok && rc.Verdict != reports.Fail {
			t.Fatalf("%s: verdict %s, want fail", tc.name, rc.Verdict)
		}
		t.Logf("%s: %s: %s", tc.name, got.Name, got.Evidence)
	}
}

// A retry refused by a held lease is waited for and repeated under the
// same name.
func TestSaveRetryWaitsForAHeldLease(t *testing.T) {
	rc, rec := saveRecovery(t, `case "$*" in
"snapshot save --name tgt"*)
  n=$(cat $STATE/n 2>/dev/null || echo 0); echo $((n+1)) > $STATE/n
  if [ "$n" = 1 ] || [ "$n" = 2 ]; then echo 'Error: save snapshot: lease: lock held' >&2; exit 1; fi;;
esac`)
	if rc.Verdict != reports.Pass || !rec.OK || strings.Count(rec.Evidence, "refused by a held lease") != 2 ||
		!strings.Contains(rec.Evidence, "retry: snapshot-save vm=src name=tgt: ok") {
		t.Fatalf("%s %s: recovery %q", rc.Verdict, rc.Reason, rec.Evidence)
	}
}

// The stream must end where the store ends: a VMM death it never reported,
// a VM it never showed, or a deleted VM it still shows fail.
func TestDiffStream(t *testing.T) {
	vms := []manager.VM{{ID: "A", Name: "src", State: "running", PID: 10}, {ID: "B", Name: "tgt", State: "running", PID: 11}}
	live := map[int]string{10: "A"}
	ok := []manager.Event{{Type: "ADDED", ID: "A", Name: "src", State: "running"}, {Type: "ADDED", ID: "B", Name: "tgt", State: "running"},
		{Type: "MODIFIED", ID: "B", Name: "tgt", State: "stopped (stale)"}, {Type: "ADDED", ID: "C", Name: "x", State: "running"},
		{Type: "DELETED", ID: "C", Name: "x", State: "running"}}
	if bad := diffStream(vms, live, ok); len(bad) != 0 {
		t.Fatalf("matching stream: %v", bad)
	}
	if bad := diffStream(vms, live, ok[:2]); len(bad) != 1 || !strings.Contains(bad[0], `B "tgt" is stopped (stale), the stream's last event says ADDED "running"`) {
		t.Fatalf("missed VMM death: %v", bad)
	}
	if bad := diffStream(vms, live, ok[2:4]); len(bad) != 2 {
		t.Fatalf("a VM never shown and a gone VM still shown: %v", bad)
	}
}

// Manager cases follow the discovered phases and the verbs the manager
// has (vmctl: no in-place restore), with one filter over their labels.
func TestExpandManagerFollowsPhasesAndVerbs(t *testing.T) {
	m, err := NewManager("vmctl", manager.Options{Bin: "/x/vmctl", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cs := scenarios.ExpandManager(m, map[manager.Verb][]string{manager.VerbClone: {"ch.restore.begin"}, manager.VerbRm: nil}, nil)
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID)
		l := strings.Join(c.Labels, ",")
		if !strings.Contains(l, "layer:manager") || !strings.Contains(l, "manager:vmctl") || !strings.Contains(l, "op:mgr-") || c.Scenario.Mgr == nil {
			t.Errorf("%s: labels %s", c.ID, l)
		}
	}
	got := strings.Join(ids, " ")
	for _, want := range []string{"mgr-clone-kill-at-ch.restore.begin", "mgr-clone-kill-at-35%", "mgr-rm-kill-at-10%", "mgr-vmm-kill9"} {
		if !strings.Contains(got, want) {
			t.Errorf("no case %s in %s", want, got)
		}
	}
	for _, bad := range []string{"mgr-restore-", "mgr-rm-kill-at-ch."} {
		if strings.Contains(got, bad) {
			t.Errorf("unexpected case %s in %s", bad, got)
		}
	}
	sel, err := scenarios.Filter(cs, "case:mgr-clone-kill-at-35pct")
	if err != nil || len(sel) != 1 || sel[0].ID != "mgr-clone-kill-at-35%" {
		t.Fatalf("filter by case label: %v %v", sel, err)
	}
}

// A verb whose discovery failed yields one discover case that is a product
// fail with the error as evidence (never a pass, never a stop of the whole
// run), and its offset cases still run; vmctl's missing restore is listed
// as not supported, with the capability table, in results.json.
func TestManagerDiscoveryFailureIsOneFailingCase(t *testing.T) {
	m, err := NewManager("vmctl", manager.Options{Bin: "/x/vmctl", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cs := scenarios.ExpandManager(m, map[manager.Verb][]string{}, map[manager.Verb]string{manager.VerbClone: "unarmed run failed: exit 1: unknown shorthand flag: 'o' in -o"})
	var disc *scenarios.Case
	var ids []string
	for i, c := range cs {
		ids = append(ids, c.ID)
		if c.ID == "mgr-clone-discover" {
			disc = &cs[i]
		}
	}
	if disc == nil || !strings.Contains(strings.Join(ids, " "), "mgr-clone-kill-at-35%") || !strings.Contains(strings.Join(ids, " "), "mgr-snapshot-save-kill-at-35%") {
		t.Fatalf("cases %v: want mgr-clone-discover beside the offset cases", ids)
	}
	r := &Runner{opts: Options{Scale: 0.05, ReportDir: t.TempDir()}, mgr: &mgrRun{name: "vmctl", tmp: t.TempDir()}, res: &reports.Results{}}
	rc := r.runMgrCase(context.Background(), *disc, nil, "")
	if rc.Verdict != reports.Fail || rc.Culprit != "product" || len(rc.Invariants) != 1 ||
		rc.Invariants[0].Name != ManagerCalibration || !strings.Contains(rc.Invariants[0].Evidence, "unknown shorthand flag") {
		t.Fatalf("discover case: %s (%s) culprit %q %+v; want a product fail on %s naming the error", rc.Verdict, rc.Reason, rc.Culprit, rc.Invariants, ManagerCalibration)
	}
	caps, err := manager.CapabilitiesOf(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range scenarios.MgrOps {
		if !scenarios.MgrSupports(m, op) {
			r.noteNotSupported(op, caps)
		}
	}
	ns := r.res.NotSupported
	if len(ns) != 1 || ns[0].Missing != "restore" || !strings.HasPrefix(ns[0].Reason, manager.NotSupportedPrefix) || ns[0].Kind != reports.MissingManagerVerb {
		t.Fatalf("not_supported = %+v; want vmctl's restore, reason starting %q", ns, manager.NotSupportedPrefix)
	}
}

// EnvCocoon names a cocoon binary built by the user; vmchaos never builds
// or fetches one.
const EnvCocoon = "VMCHAOS_COCOON"

// Against cocoon the issue-17 cases are findings: the clone killed at
// ch.restore.begin leaves a creating record with its VMM, the save killed
// after the memory was written leaves the VMM Paused and its capture dir;
// the kill -9 of a VMM reaches the event stream.
func TestCocoonReportsTheIssueStates(t *testing.T) {
	cbin := needs.Binary(t, EnvCocoon, "cocoon",
		"build cocoon beside the project (go build in a checkout of github.com/cocoonstack/cocoon) and export "+EnvCocoon+"=/path/to/cocoon, or put it on PATH")
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(context.Background(), Options{ReportDir: t.TempDir(), Scale: 0.05, Seed: 1, BinDir: bin,
		Manager: "cocoon", ManagerBin: cbin})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	all, err := r.ManagerCases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := scenarios.Filter(all, "case:mgr-clone-kill-at-ch.restore.begin || case:mgr-snapshot-save-kill-at-ch.snapshot.memory-written || case:mgr-vmm-kill9")
	if err != nil || len(cs) != 3 {
		t.Fatalf("cases: %d, %v", len(cs), err)
	}
	want := map[string][]string{
		// cocoon's gc leaves the dead clone's record holding the name; the
		// embedder's rm by id then lets the retry through (seed 001 #1, 002)
		"mgr-clone-kill-at-ch.restore.begin":                   {NameFreedByRecovery},
		"mgr-snapshot-save-kill-at-ch.snapshot.memory-written": {RecoveryVerbSucceeds, "no-paused-running", "no-leftover-temp-dirs"},
	}
	for _, c := range cs {
		rc := r.RunCase(ctx, c)
		t.Logf("%s: %s %s", c.ID, rc.Verdict, rc.Reason)
		if c.ID == "mgr-vmm-kill9" {
			// v0.2.7's event stream misses a VMM death after kill -9;
			// cocoon fixed it in 23e26df (v0.2.8): docs/manager.md
			inv, bad := failedInv(rc, VMMDeathSeen)
			if old := cocoonBefore(t, cbin, 0, 2, 8); bad != old {
				t.Errorf("kill9 on a cocoon %s v0.2.8: %s failed=%v (%s), want failed=%v", map[bool]string{true: "before", false: "from"}[old], VMMDeathSeen, bad, inv.Evidence, old)
			}
			continue
		}
		if rc.Verdict != reports.Fail {
			t.Errorf("%s: %s (%s), want fail (fixed in this cocoon? then name its commit)", c.ID, rc.Verdict, rc.Reason)
		}
		for _, name := range want[c.ID] {
			if _, bad := failedInv(rc, name); !bad {
				t.Errorf("%s: %s did not fail: %+v", c.ID, name, rc.Invariants)
			}
		}
		if !strings.Contains(rc.Repro, "--manager cocoon --manager-bin "+cbin) {
			t.Errorf("%s: repro %q", c.ID, rc.Repro)
		}
	}
}

// The holder of a refused name is read from both managers' wording.
func TestRefusedByHolder(t *testing.T) {
	for said, want := range map[string]string{
		`Error: save snapshot: snapshot name "tgt" already in use by MPT5A6ZS2FNZWQGFN24AZLREWQ`: "MPT5A6ZS2FNZWQGFN24AZLREWQ",
		`Error: reserve VM record: vm name "tgt" already exists (id: SGJFKC55W23ABC)`:            "SGJFKC55W23ABC",
		`Error: snapshot save: lease held by a live builder`:                                     "",
	} {
		m := refusedByHolder.FindStringSubmatch(said)
		got := ""
		if m != nil {
			got = m[1]
		}
		if got != want {
			t.Errorf("%q: holder %q, want %q", said, got, want)
		}
	}
}

// cocoonBefore reports whether the cocoon binary's version (its capability
// table's, "v0.2.7-1-g21800e2") is older than major.minor.patch.
func cocoonBefore(t *testing.T, bin string, major, minor, patch int) bool {
	t.Helper()
	m, err := NewManager("cocoon", manager.Options{Bin: bin, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	caps, err := manager.CapabilitiesOf(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	var a, b, c int
	if _, err := fmt.Sscanf(strings.TrimPrefix(caps.Version, "v"), "%d.%d.%d", &a, &b, &c); err != nil {
		t.Fatalf("cocoon version %q: %v", caps.Version, err)
	}
	return a < major || a == major && (b < minor || b == minor && c < patch)
}

// TestVMMPhaseAtIsTheVerbsOwn: the landed phase of an offset kill names
// only VMM phases since the verb started; the fixture's earlier ch.resume
// once read as where a clone killed before its VMM existed had landed.
func TestVMMPhaseAtIsTheVerbsOwn(t *testing.T) {
	evs := []failpoint.Event{{TsNs: 10, Point: "ch.resume"}, {TsNs: 50, Point: "ch.restore.begin"}}
	if got := vmmPhaseAt(evs, 20, 40); got != "" {
		t.Errorf("a kill at 40 of a verb started at 20: %q, want none (ch.resume at 10 is the fixture's)", got)
	}
	if got := vmmPhaseAt(evs, 20, 60); got != "ch.restore.begin" {
		t.Errorf("a kill at 60: %q, want ch.restore.begin", got)
	}
}

// TestRaceCatchesARacerNothingHeldOff: `snapshot rm base` while a clone of
// base is parked reading it. The bundled vmctl refuses (the clone's lease);
// a vmctl whose rm reports success at once, as a manager without a reader's
// lease does (cocoon: docs/manager.md), fails racer-held-off.
func TestRaceCatchesARacerNothingHeldOff(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs a manager case against the bundled vmctl; run without -short")
	}
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	const id = "mgr-race-snapshot-rm-under-clone"
	if rc := mgrCaseRun(t, bin, brokenVmctl(t, bin, ":"), id); rc.Verdict != reports.Pass {
		t.Fatalf("bundled vmctl: %s %s", rc.Verdict, rc.Reason)
	}
	rc := mgrCaseRun(t, bin, brokenVmctl(t, bin, `case "$*" in "snapshot rm base") exit 0;; esac`), id)
	inv, ok := failedInv(rc, RacerHeldOff)
	if rc.Verdict != reports.Fail || !ok || !strings.Contains(inv.Evidence, "exited 0 while clone was parked at ch.restore.begin") {
		t.Fatalf("an rm nothing held off: %s (%s), %s failed %v: %q", rc.Verdict, rc.Reason, RacerHeldOff, ok, inv.Evidence)
	}
}

func TestRaceInvariants(t *testing.T) {
	for _, tc := range []struct {
		name string
		race scenarios.MgrRace
		res  raceResult
		want map[string]bool // invariant → ok
	}{
		{"refused", raceNamed(t, "snapshot-rm-under-clone"), raceResult{racerEndedParked: true, racerCode: 1}, map[string]bool{RacerHeldOff: true, RacedVerbSucceeds: true}},
		{"won while parked", raceNamed(t, "snapshot-rm-under-clone"), raceResult{racerEndedParked: true, racerWonParked: true}, map[string]bool{RacerHeldOff: false, RacedVerbSucceeds: true}},
		{"waited, then both won", raceNamed(t, "two-saves-one-name"), raceResult{}, map[string]bool{RacerHeldOff: false, RacedVerbSucceeds: true}},
		{"the raced verb failed", raceNamed(t, "two-saves-one-name"), raceResult{verbCode: 1, racerCode: 1}, map[string]bool{RacerHeldOff: true, RacedVerbSucceeds: false}},
		{"state only", raceNamed(t, "rm-under-clone"), raceResult{racerWonParked: true}, map[string]bool{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]bool{}
			for _, inv := range raceInvariants(&tc.race, "p", tc.res) {
				got[inv.Name] = inv.OK
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if ok, in := got[k]; !in || ok != v {
					t.Errorf("%s: ok=%v (present %v), want %v", k, ok, in, v)
				}
			}
		})
	}
}

func raceNamed(t *testing.T, name string) scenarios.MgrRace {
	for _, r := range scenarios.MgrRaces {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no race %s", name)
	return scenarios.MgrRace{}
}

// TestDoubleFaultKillsTheParkedVMM: the double fault SIGKILLs the verb at
// its park, then kill -9s the VMM parked there (a second injection on that
// VMM, dead afterwards); the bundled vmctl's recovery (start, save again)
// passes, and a vmctl whose `vm start` claims success without starting
// anything fails the recovery.
func TestDoubleFaultKillsTheParkedVMM(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs a manager case against the bundled vmctl; run without -short")
	}
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	const id = "mgr-snapshot-save-kill-at-ch.snapshot.memory-written-then-vmm-kill9"
	rc := mgrCaseRun(t, bin, brokenVmctl(t, bin, ":"), id)
	if rc.Verdict != reports.Pass || len(rc.Injections) != 2 {
		t.Fatalf("bundled vmctl: %s %s, %d injections", rc.Verdict, rc.Reason, len(rc.Injections))
	}
	second := rc.Injections[1]
	if second.Fault != "sigkill-vmm" || !second.Landed || second.VictimPID <= 0 || alive(second.VictimPID) {
		t.Fatalf("second injection %+v: want a landed sigkill-vmm of a VMM now dead", second)
	}
	rc = mgrCaseRun(t, bin, brokenVmctl(t, bin, `case "$*" in "vm start"*) exit 0;; esac`), id)
	if _, ok := failedInv(rc, RecoveryVerbSucceeds); rc.Verdict != reports.Fail || !ok {
		t.Fatalf("a start that starts nothing: %s (%s), want recovery-verb-succeeds failed", rc.Verdict, rc.Reason)
	}
}
