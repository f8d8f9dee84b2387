package checker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios/stack"
	"golang.org/x/sys/unix"
)

// holder is a lock holder that is a process of the case.
var holder = []manager.Holder{{PID: 7, Kind: "FLOCK", Mode: "WRITE", Argv: []string{"/bin/vmctl", "vm", "clone", "base"}}}

// clean is a converged stack: a ready intent "a" on vm A1 (guest answers,
// post_clone done), a hibernated intent "b" whose snapshot is pushed, a
// deleted intent "c", a running direct VM "d", the base snapshot, and a
// pending snapshot whose lease a builder of the case holds.
func clean() (*Input, *Poll) {
	in := &Input{
		Goals:      map[string]string{"a": GoalReady, "b": GoalHibernated, "c": GoalDeleted},
		Generation: map[string]int64{"a": 2},
		DirectVMs:  []string{"d"},
		AdoptedIDs: map[string]string{"a": "A1"},
		BaseName:   "base",
		Stack:      &stack.Stack{}, // the agent catalogue on the fake backend
		// the store before the verb: vm A1's dirs and the base snapshot's
		Store:       func() ([]string, error) { return nil, nil },
		StoreBefore: NewStoreListing([]string{"vms", "vms/A1", "snapshots", "snapshots/S0", "run"}, []manager.VM{{ID: "A1"}}, []manager.Snapshot{{ID: "S0"}}),
	}
	p := &Poll{
		// now: D1 and S1 are new records, their dirs are theirs; run/A1
		// is an existing VM's run dir made again
		StoreDirs: []string{"vms", "vms/A1", "vms/D1", "vms/D1/disk", "snapshots", "snapshots/S0", "snapshots/S1", "run", "run/A1"},
		Views: map[string]AgentView{
			"a": {Name: "a", Lifecycle: GoalReady, ObservedGeneration: 2, VMID: "A1", PostClone: "done"},
			"b": {Name: "b", Lifecycle: GoalHibernated},
		},
		VMs: []manager.VM{
			{ID: "A1", Name: "a", State: manager.StateRunning, Address: "127.0.0.2:22", PID: 11},
			{ID: "D1", Name: "d", State: manager.StateRunning, PID: 12},
		},
		Snaps: []manager.Snapshot{
			{ID: "S0", Name: "base", State: manager.SnapReady},
			{ID: "S1", Name: "b", State: manager.SnapPending},
		},
		Check:        manager.CheckReport{OK: true},
		VMMs:         map[string][]stack.Proc{"A1": {{PID: 11}}, "D1": {{PID: 12}}},
		VMMState:     map[string]string{"A1": "Running", "D1": "Running"},
		Sockets:      map[string]string{"A1": "/run/A1/api.sock", "D1": "/run/D1/api.sock"},
		OpsHolders:   map[string][]manager.Holder{},
		LeaseHolders: map[string][]manager.Holder{"S1": holder},
		Pushed:       map[string]error{"b": nil},
		Boot:         map[string]BootProbe{"a": {BootID: "boot-1"}},
		// A1 is a clone of the base snapshot: its restored tree keeps the
		// base source's NIC nb0, which the base's config had attached.
		Trees: map[string]VMMTree{
			"A1": vmmTree(map[string]string{"_disk0": "", "na1": macA}, "nb0"),
			"D1": vmmTree(map[string]string{"_disk0": "", "nd1": macD}),
		},
		Captured: map[string]CapturedTree{"S0": {Name: "base", Devices: map[string]string{"_disk0": "", "nb0": macB},
			Nodes: []CapturedNode{{ID: "_disk0", Kind: "disk", Slot: 3}, {ID: "nb0", Kind: "net", Slot: 4}}}},
	}
	p.VMs[0].NICs = []manager.NIC{{ID: "na1", MAC: macA}}
	p.VMs[1].NICs = []manager.NIC{{ID: "nd1", MAC: macD}}
	for _, src := range allSources {
		p.got(src, nil)
	}
	return in, p
}

var allSources = []Source{SrcAgent, SrcVMs, SrcSnaps, SrcCheck, SrcProcs, SrcLocks, SrcSockets, SrcStore, SrcDevTree}

func byName(invs []reports.Invariant) map[string]reports.Invariant {
	out := map[string]reports.Invariant{}
	for _, i := range invs {
		out[i.Name] = i
	}
	return out
}

// TestStateInvariantTables: per invariant, a fixture that violates it fails
// with evidence; each of its data sources erroring makes it fail (never
// pass); the clean fixture passes.
func TestStateInvariantTables(t *testing.T) {
	cases := []struct {
		inv     string
		violate func(in *Input, p *Poll)
		want    string // in the evidence
	}{
		{IntentGoal, func(in *Input, p *Poll) { p.Views["b"] = AgentView{Name: "b", Lifecycle: "failed", Message: "boom"} }, "b: want hibernated, is failed: boom"},
		{IntentGoal, func(in *Input, p *Poll) { p.VMMs["A1"] = nil }, "a: ready but vm A1"},
		{IntentGoal, func(in *Input, p *Poll) { p.Pushed["b"] = errors.New("manifest: no such file") }, "b: hibernated but its snapshot is not in the registry: manifest"},
		{IntentGoal, func(in *Input, p *Poll) { delete(p.Pushed, "b") }, "b: hibernated but the registry was not read"},
		{IntentGoal, func(in *Input, p *Poll) { p.Boot["a"] = BootProbe{Err: errors.New("connection refused")} }, "a: ready but its guest does not answer over SSH: connection refused"},
		{IntentGoal, func(in *Input, p *Poll) { delete(p.Boot, "a") }, "its guest was not asked"},
		{IntentGoal, func(in *Input, p *Poll) { v := p.Views["a"]; v.PostClone = "running"; p.Views["a"] = v }, `post_clone is "running"`},
		{IntentGoal, func(in *Input, p *Poll) { in.Generation["a"] = 3 }, "observed generation 2 < 3"},
		{IntentGoal, func(in *Input, p *Poll) {
			p.VMs = append(p.VMs, manager.VM{ID: "B1", Name: "b", State: manager.StateRunning})
		}, "b: hibernated but vm B1 still exists"},
		{IntentGoal, func(in *Input, p *Poll) { p.Views["c"] = AgentView{Name: "c", Lifecycle: "deleting"} }, "c: want deleted, agent still has it"},
		{OneVMPerName, func(in *Input, p *Poll) {
			p.VMs = append(p.VMs, manager.VM{ID: "A2", Name: "a", State: manager.StateStopped})
		}, "a: 2 vms"},
		{OneVMPerName, func(in *Input, p *Poll) { p.VMMs["D1"] = nil }, `d: vm D1 is "running"`},
		{NoOrphanCreating, func(in *Input, p *Poll) {
			p.VMs = append(p.VMs, manager.VM{ID: "C1", Name: "x", State: manager.StateCreating})
		}, "vm C1 (x) is creating and its ops lock is free"},
		{NoOrphanCreating, func(in *Input, p *Poll) {
			p.VMs = append(p.VMs, manager.VM{ID: "C1", Name: "x", State: manager.StateCreating})
			p.OpsHolders["C1"] = []manager.Holder{{PID: 99, Kind: "FLOCK", Mode: "WRITE"}}
		}, "is held only by pid 99 FLOCK WRITE (not a process of this case)"},
		{NoOrphanVMM, func(in *Input, p *Poll) { p.VMMs["A1"] = append(p.VMMs["A1"], stack.Proc{PID: 13}) }, "vm A1 has 2 VMM processes"},
		{NoOrphanVMM, func(in *Input, p *Poll) { p.VMMs["Z9"] = []stack.Proc{{PID: 14}} }, "for vm Z9 has no record"},
		{NoOrphanVMM, func(in *Input, p *Poll) { p.VMs[1].State = manager.StateStopped }, `record is "stopped" and no operation holds its ops lock`},
		{NoRunningWithDeadVMM, func(in *Input, p *Poll) { p.VMs[1].State = manager.StateStale }, `reads "stopped (stale)"`},
		{NoRunningWithDeadVMM, func(in *Input, p *Poll) { delete(p.VMMs, "D1") }, "vm D1 (d) reads \"running\" and its VMM is dead"},
		// a start killed between launching its VMM and recording its pid:
		// the next start's VMM (pid 77, recorded) died beside the orphan
		{NoRunningWithDeadVMM, func(in *Input, p *Poll) { p.VMs[1].PID = 77 }, "vm D1 (d) reads running under VMM pid 77, which is dead; the VM's live VMM is another: pid 12"},
		{NoOrphanVMM, func(in *Input, p *Poll) { p.VMs[1].PID = 77 }, "VMM pid 12  runs under vm D1 (d) whose record names VMM pid 77"},
		{NoPausedRunning, func(in *Input, p *Poll) { p.VMMState["A1"] = "Paused" }, "vm A1: record running, VMM says Paused"},
		{NoPendingWithoutLease, func(in *Input, p *Poll) { delete(p.LeaseHolders, "S1") }, "snapshot S1 (b) is pending and its lease is free"},
		{NoPendingWithoutLease, func(in *Input, p *Poll) {
			p.LeaseHolders["S1"] = []manager.Holder{{PID: 98, Kind: "FLOCK", Mode: "WRITE"}}
		}, "held only by pid 98"},
		{NoTombstone, func(in *Input, p *Poll) { p.Check = violations(manager.CheckTombstone, "vm tombstone T1") }, "vm tombstone T1"},
		{IndexesConsistent, func(in *Input, p *Poll) { p.Check = violations(manager.CheckIndexes, `vm name "ghost" maps to G1`) }, `"ghost"`},
		{IndexesConsistent, func(in *Input, p *Poll) { p.Check = violations(manager.CheckStoreLoadable, "vms.json: unexpected EOF") }, "unexpected EOF"},
		{NoVmctlChild, func(in *Input, p *Poll) {
			p.Vmctls = []stack.Proc{{PID: 20, Argv: []string{"vmctl", "snapshot", "save", "b"}}}
		}, "pid 20 vmctl snapshot save b"},
		{NoLeftoverSockets, func(in *Input, p *Poll) { p.Sockets["E1"] = "/run/E1/api.sock" }, "/run/E1/api.sock"},
		{NoLeftoverStaging, func(in *Input, p *Poll) {
			p.Check = violations(manager.CheckLeftoverStaging, "staging dir S7 without a live builder")
		}, "staging dir S7"},
		{NoUnreferencedDirs, func(in *Input, p *Poll) {
			p.Check = violations(manager.CheckUnreferencedDirs, "/run/Q1 has no record")
		}, "/run/Q1 has no record"},
		{BaseSnapshotKept, func(in *Input, p *Poll) { p.Snaps = p.Snaps[1:] }, `snapshot "base" is gone`},
		{BaseSnapshotKept, func(in *Input, p *Poll) {
			p.Check = violations(manager.CheckSnapshotData, "snapshot S0 ready but stat: no such file")
		}, "S0 ready but"},
		{VMsAdopted, func(in *Input, p *Poll) { p.VMs[0].ID = "A9"; p.VMMs["A9"] = p.VMMs["A1"] }, "a was A1 before the fault, now A9"},
		{PostCloneMarkerBound, func(in *Input, p *Poll) { v := p.Views["b"]; v.PostClone = "done"; p.Views["b"] = v }, `b: post_clone "done" with no VM bound`},
		{NoLeftoverTempDirs, func(in *Input, p *Poll) {
			p.StoreDirs = append(p.StoreDirs, "run/A1/snapshot-123", "run/A1/snapshot-123/mem")
		}, "<store>/run/A1/snapshot-123 is new since before the verb"},
		{NoLeftoverTempDirs, func(in *Input, p *Poll) { p.StoreDirs = append(p.StoreDirs, "snapshots/.staging/S9") }, "snapshots/.staging"},
		{RecordsHaveData, func(in *Input, p *Poll) {
			p.Check = violations(CheckVMData, "vm A1 (a) is running but its disk: no such file")
		}, "its disk"},
		{RecordsHaveData, func(in *Input, p *Poll) {
			p.Check = violations(manager.CheckSnapshotData, "snapshot S1 ready but stat state.json: no such file")
		}, "S1 ready but"},
		{DeviceTreeConsistent, func(in *Input, p *Poll) {
			p.Trees["D1"].Nodes["na1"] = chapi.DeviceNode{ID: "na1", Parent: "_virtio-pci-na1"}
		},
			"vm D1 (d): stale node: na1 is in the VMM's device tree, not in its config"},
		{DeviceTreeConsistent, func(in *Input, p *Poll) {
			s := p.Captured["S0"]
			s.Nodes[1].Ejecting = true
			p.Captured["S0"] = s
		}, "the save captured net nb0 with its eject pending"},
	}
	in, p := clean()
	for _, inv := range Evaluate(in, p) {
		if !inv.OK {
			t.Fatalf("clean fixture: %s fails: %s", inv.Name, inv.Evidence)
		}
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.inv] = true
		in, p := clean()
		c.violate(in, p)
		got := byName(Evaluate(in, p))[c.inv]
		if got.OK || !strings.Contains(got.Evidence, c.want) {
			t.Errorf("%s violated: OK=%v evidence %q, want it to contain %q", c.inv, got.OK, got.Evidence, c.want)
		}
	}
	for _, inv := range State {
		if !covered[inv.Name] {
			t.Errorf("%s has no violating fixture", inv.Name)
		}
		if len(inv.Needs) == 0 {
			t.Errorf("%s names no data source", inv.Name)
		}
		// every source it reads, failing alone, makes it fail
		for _, src := range inv.Needs {
			in, p := clean()
			p.fail(src, errors.New("exit 1: boom"))
			got := byName(Evaluate(in, p))[inv.Name]
			if got.OK || !strings.Contains(got.Evidence, string(src)) || !strings.Contains(got.Evidence, "boom") {
				t.Errorf("%s with %s failing: OK=%v evidence %q", inv.Name, src, got.OK, got.Evidence)
			}
		}
	}
}

// TestEverySourceIsNeededBySomeInvariant: an errored source that no
// invariant reads would be missing data nobody notices.
func TestEverySourceIsNeededBySomeInvariant(t *testing.T) {
	used := map[Source]bool{}
	for _, inv := range State {
		for _, s := range inv.Needs {
			used[s] = true
		}
	}
	for _, s := range []Source{SrcAgent, SrcVMs, SrcSnaps, SrcCheck, SrcProcs, SrcLocks, SrcSockets} {
		if !used[s] {
			t.Errorf("source %s is read but no invariant needs it", s)
		}
	}
}

// TestSnapsErrorNeverPasses is the regression of the old hole: a failing
// `snapshot list` left the snapshot list empty, and an empty list has no
// pending snapshot and no missing base.
func TestSnapsErrorNeverPasses(t *testing.T) {
	in, p := clean()
	p.Snaps = nil
	p.fail(SrcSnaps, errors.New("vmctl snapshot list -o json: exit 1"))
	got := byName(Evaluate(in, p))
	for _, n := range []string{NoPendingWithoutLease, BaseSnapshotKept} {
		if got[n].OK {
			t.Errorf("%s passed with snapshot list failing", n)
		}
	}
}

func violations(inv, ev string) manager.CheckReport {
	return manager.CheckReport{Violations: []manager.Violation{{Invariant: inv, Evidence: ev}}}
}

// TestLocksMatchDeviceAndInode takes a real flock and checks that the
// /proc/locks reading tells a held lock from a free one, on the right file
// (device and inode) and with the holder's pid.
func TestLocksMatchDeviceAndInode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "C1.lock")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	locks, err := ReadLocks()
	if err != nil {
		t.Fatal(err)
	}
	if hs, err := locks.holders(path); err != nil || len(hs) != 0 {
		t.Fatalf("free lock: holders %v, %v", hs, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	locks, err = ReadLocks()
	if err != nil {
		t.Fatal(err)
	}
	hs, err := locks.holders(path)
	if err != nil || len(hs) != 1 || hs[0].PID != os.Getpid() || hs[0].Kind != "FLOCK" || hs[0].Mode != "WRITE" {
		t.Fatalf("held lock: holders %+v, %v", hs, err)
	}
	// the same inode number on another device is another file
	id, _, _ := statID(path)
	other := Locks{fileID{id.Major + 1, id.Minor, id.Ino}: hs}
	if hs, _ := other.holders(path); len(hs) != 0 {
		t.Fatalf("a lock on another device matched: %+v", hs)
	}
	if _, err := (Locks{}).holders(""); !errors.Is(err, manager.ErrNotSupported) {
		t.Fatalf("no lock path: %v", err)
	}
}

func TestParseLocks(t *testing.T) {
	in := `1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF
1: -> FLOCK  ADVISORY  WRITE 1300 fe:00:5678 0 EOF
2: OFDLCK ADVISORY  READ -1 00:1a:42 0 EOF
`
	l, err := parseLocks(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if hs := l[fileID{0xfe, 0, 5678}]; len(hs) != 1 || hs[0].PID != 1234 {
		t.Fatalf("holders = %+v (waiter counted?)", hs)
	}
	if hs := l[fileID{0, 0x1a, 42}]; len(hs) != 1 || hs[0].Mode != "READ" {
		t.Fatalf("OFD holders = %+v", hs)
	}
	if _, err := parseLocks(strings.NewReader("1: FLOCK ADVISORY WRITE 1 zz 0 EOF\n")); err == nil {
		t.Fatal("a garbled /proc/locks parsed")
	}
}

func TestReadLocksErrorIsReported(t *testing.T) {
	old := procLocks
	procLocks = filepath.Join(t.TempDir(), "nope")
	defer func() { procLocks = old }()
	if _, err := ReadLocks(); err == nil {
		t.Fatal("missing /proc/locks read as no locks")
	}
}

// TestNoStateInvariantPassesOnAbsentData (issue #31 item 2): every entry of
// the state table declares its evidence, and fed data that is missing (its
// sources never read), unreadable (a source errored) or empty (the
// evidence it declares absent: no goals, an empty check report, an empty
// snapshot list, no base name, no or an unreadable adoption baseline) it
// fails, naming what is missing. An invariant whose evidence is the read
// itself (an absence claim over a list read whole) has no empty case: its
// empty read is the proof.
func TestNoStateInvariantPassesOnAbsentData(t *testing.T) {
	empty := map[string][]func(in *Input, p *Poll){
		IntentGoal:            {func(in *Input, p *Poll) { in.Goals, in.DirectVMs = nil, nil }},
		NoPendingWithoutLease: {func(in *Input, p *Poll) { p.Snaps = nil }},
		NoTombstone:           {func(in *Input, p *Poll) { p.Check = manager.CheckReport{} }},
		IndexesConsistent:     {func(in *Input, p *Poll) { p.Check = manager.CheckReport{} }},
		NoLeftoverStaging:     {func(in *Input, p *Poll) { p.Check = manager.CheckReport{} }},
		NoUnreferencedDirs:    {func(in *Input, p *Poll) { p.Check = manager.CheckReport{} }},
		RecordsHaveData:       {func(in *Input, p *Poll) { p.Check = manager.CheckReport{} }},
		BaseSnapshotKept:      {func(in *Input, p *Poll) { in.BaseName = "" }, func(in *Input, p *Poll) { p.Check = manager.CheckReport{} }},
		NoLeftoverTempDirs:    {func(in *Input, p *Poll) { in.StoreBefore = nil }},
		DeviceTreeConsistent: {func(in *Input, p *Poll) { p.Trees, p.Captured = nil, nil },
			func(in *Input, p *Poll) { p.Trees["A1"] = VMMTree{} }},
		VMsAdopted: {func(in *Input, p *Poll) { in.AdoptedIDs = map[string]string{} },
			func(in *Input, p *Poll) { in.AdoptedIDs, in.AdoptedErr = nil, errors.New("vmctl vm list: exit 1") }},
	}
	for _, inv := range State {
		t.Run(inv.Name, func(t *testing.T) {
			judge := func(what string, change func(in *Input, p *Poll)) {
				in, p := clean()
				change(in, p)
				got, ok := byName(Evaluate(in, p))[inv.Name]
				if !ok || got.OK || got.Evidence == "" {
					t.Errorf("%s: judged %v, OK=%v evidence %q; want a fail with evidence", what, ok, got.OK, got.Evidence)
				}
			}
			for _, src := range inv.Needs {
				judge("missing "+string(src), func(_ *Input, p *Poll) { delete(p.Read, src) })
				judge("unreadable "+string(src), func(_ *Input, p *Poll) { p.fail(src, errors.New("exit 1")) })
			}
			judge("nothing read at all", func(_ *Input, p *Poll) { *p = Poll{} })
			cases, ok := empty[inv.Name]
			if !ok && inv.Evidence.Of != nil {
				t.Errorf("declares evidence but has no empty fixture")
			}
			if ok && inv.Evidence.Of == nil {
				t.Errorf("has an empty fixture but declares no evidence beyond its read")
			}
			for i, change := range cases {
				judge(fmt.Sprintf("empty #%d", i), change)
			}
		})
	}
	// vms-adopted not asked (Expect.Adopted off) is left out, not held;
	// so is intent-goal in a case that only runs VMs of its own
	in, p := clean()
	in.AdoptedIDs = nil
	if got, ok := byName(Evaluate(in, p))[VMsAdopted]; ok {
		t.Errorf("vms-adopted not asked was judged: %+v", got)
	}
	in.Goals = nil
	if got, ok := byName(Evaluate(in, p))[IntentGoal]; ok {
		t.Errorf("intent-goal of a case with direct VMs only was judged: %+v", got)
	}
}

// TestRecordedVMMPidInTheSandboxNamespace: a manager inside the sandbox's
// pid namespace records its VMM's pid as seen there; that pid names the
// live VMM, and a pid neither host nor namespace pid does not.
func TestRecordedVMMPidInTheSandboxNamespace(t *testing.T) {
	for _, tc := range []struct {
		recorded int
		ok       bool
	}{{12, true}, {5, true}, {0, true}, {6, false}} {
		in, p := clean()
		p.VMMs["D1"] = []stack.Proc{{PID: 12, NSPID: 5}}
		p.VMs[1].PID = tc.recorded
		got := byName(Evaluate(in, p))
		for _, name := range []string{NoRunningWithDeadVMM, NoOrphanVMM} {
			if got[name].OK != tc.ok {
				t.Errorf("record pid %d: %s ok=%v, want %v (%s)", tc.recorded, name, got[name].OK, tc.ok, got[name].Evidence)
			}
		}
	}
}
