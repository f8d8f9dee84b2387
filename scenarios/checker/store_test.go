package checker

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/scenarios/stack"
)

// A quiescent case (a manager case after its recovery: every verb exited)
// needs no lock holder to know a creating record, a pending snapshot or a
// VMM under a stopped record has no owner: they fail whoever holds a lock.
func TestQuiescentNeedsNoLockHolder(t *testing.T) {
	in, p := clean()
	in.Quiescent = true
	p.VMs = append(p.VMs, manager.VM{ID: "C1", Name: "x", State: manager.StateCreating})
	p.OpsHolders["C1"] = holder // a holder of the case: not an owner once all verbs exited
	p.VMs[1].State = manager.StateStopped
	p.OpsHolders["D1"] = holder
	got := byName(Evaluate(in, p))
	if inv := got[NoOrphanCreating]; inv.OK || !strings.Contains(inv.Evidence, "every verb of the case has exited") {
		t.Errorf("creating record in a quiescent case: %+v", inv)
	}
	if inv := got[NoPendingWithoutLease]; inv.OK || !strings.Contains(inv.Evidence, "snapshot S1 (b) is pending") {
		t.Errorf("pending snapshot in a quiescent case: %+v", inv)
	}
	if inv := got[NoOrphanVMM]; inv.OK || !strings.Contains(inv.Evidence, `record is "stopped" and every verb of the case has exited`) {
		t.Errorf("VMM under a stopped record in a quiescent case: %+v", inv)
	}
}

// noLocks is a manager that exposes no lock file (cocoon).
type noLocks struct{ manager.Observer }

func (noLocks) Name() string                  { return "nolocks" }
func (noLocks) OpsLockPath(string) string     { return "" }
func (noLocks) LeasePath(string) string       { return "" }
func (noLocks) VMMOf([]string) (string, bool) { return "", false }
func (noLocks) VMs(context.Context) ([]manager.VM, error) {
	return []manager.VM{{ID: "A1", Name: "src", State: manager.StateRunning, PID: 1}}, nil
}
func (noLocks) Snapshots(context.Context) ([]manager.Snapshot, error) { return nil, nil }
func (noLocks) Check(context.Context) (manager.CheckReport, error) {
	return manager.CheckReport{}, manager.ErrNotSupported
}
func (noLocks) APISocket(string) string                { return "/nonexistent/api.sock" }
func (noLocks) APISockets() (map[string]string, error) { return map[string]string{}, nil }

// A manager without lock files gives no holder: outside a quiescent case
// that fails /proc/locks (an operation may be in flight), in one it is no
// error.
func TestNoLockPathFailsUnlessQuiescent(t *testing.T) {
	for _, q := range []bool{false, true} {
		p := &Poll{VMs: []manager.VM{{ID: "A1"}}}
		p.collectLocks(TagScan{Tag: "X=none"}, noLocks{}, q)
		err := p.Err(SrcLocks)
		if !q && (err == nil || !errors.Is(err, manager.ErrNotSupported)) {
			t.Errorf("not quiescent: /proc/locks read as %v", err)
		}
		if q && err != nil {
			t.Errorf("quiescent: %v", err)
		}
	}
}

// An invariant reading a source the manager does not expose (cocoon: no
// check verb) is left out, never reported as held.
func TestWithoutSourceLeavesInvariantOut(t *testing.T) {
	in, p := clean()
	in.Without = map[Source]bool{SrcCheck: true}
	got := byName(Evaluate(in, p))
	for _, name := range []string{NoTombstone, IndexesConsistent, NoLeftoverStaging, BaseSnapshotKept} {
		if inv, ok := got[name]; ok {
			t.Errorf("%s judged without its source: %+v", name, inv)
		}
	}
	if _, ok := got[OneVMPerName]; !ok {
		t.Error("one-vm-per-name left out")
	}
}

// Issue 32 item 5: a /proc read that fails for another reason than the
// process having exited fails the scan, and every invariant reading
// processes fails with it (the old managerlayer tagged() skipped it).
func TestTagScanErrorFailsProcessInvariants(t *testing.T) {
	const tag = "VMCHAOS_TEST_TAGSCAN=1"
	cmd := exec.Command("sleep", "30")
	cmd.Env = append(os.Environ(), tag)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	scan := TagScan{Tag: tag}
	procs, err := scan.ScanProcesses()
	if err != nil || len(procs) != 1 || procs[0].PID != cmd.Process.Pid {
		t.Fatalf("scan found %v, %v; want the tagged sleep", procs, err)
	}
	old := procRead
	t.Cleanup(func() { procRead = old })
	procRead = func(path string) ([]byte, error) {
		if strings.HasSuffix(path, "/environ") {
			return nil, &os.PathError{Op: "open", Path: path, Err: syscall.EIO}
		}
		return old(path)
	}
	if _, err := scan.ScanProcesses(); err == nil || !errors.Is(err, syscall.EIO) {
		t.Fatalf("an unreadable environ scanned as %v", err)
	}
	in := &Input{Manager: noLocks{}, Procs: scan, Agentless: true, Quiescent: true, Without: map[Source]bool{SrcCheck: true}}
	p := Collect(context.Background(), in, func() int64 { return 1 })
	got := byName(Evaluate(in, p))
	for _, name := range []string{OneVMPerName, NoOrphanVMM, NoRunningWithDeadVMM, NoPausedRunning} {
		if inv, ok := got[name]; !ok || inv.OK || !strings.Contains(inv.Evidence, string(SrcProcs)) {
			t.Errorf("%s with a failed /proc scan: %+v (judged %v)", name, inv, ok)
		}
	}
	// an exited process is no error
	procRead = func(path string) ([]byte, error) {
		return nil, &os.PathError{Op: "open", Path: path, Err: syscall.ESRCH}
	}
	if _, err := scan.ScanProcesses(); err != nil {
		t.Fatalf("exited processes failed the scan: %v", err)
	}
	_ = stack.Proc{}
}

// The manager's own layout, learned from a successful unarmed run (cocoon
// makes root/cni on first use), is not a leftover; a dead verb's temp dir
// inside it still is, and so is any other new dir.
func TestLeftoverDirsSparesTheLearnedLayout(t *testing.T) {
	before := NewStoreListing([]string{"root", "root/vms", "root/vms/A1"}, []manager.VM{{ID: "A1", Name: "src"}}, nil)
	layout := NewLayout(before, []string{"root", "root/vms", "root/vms/A1", "root/cni", "root/vms/B7", "root/vms/B7/run"},
		[]manager.VM{{ID: "A1", Name: "src"}, {ID: "B7", Name: "calib"}}, nil)
	if len(layout) != 1 || !layout["root/cni"] {
		t.Fatalf("layout %v: want only root/cni (B7's dirs are its record's)", layout)
	}
	before.Layout = layout
	in := &Input{StoreBefore: before}
	vms := []manager.VM{{ID: "A1", Name: "src"}}
	if ev := checkLeftoverDirs(in, &Poll{VMs: vms, StoreDirs: []string{"root", "root/vms", "root/vms/A1", "root/cni"}}); len(ev) != 0 {
		t.Fatalf("layout dir reported: %v", ev)
	}
	ev := checkLeftoverDirs(in, &Poll{VMs: vms, StoreDirs: []string{"root", "root/vms", "root/vms/A1", "root/cni", "root/cni/tmp-9", "root/.staging"}})
	if len(ev) != 2 || !strings.Contains(ev[0], "root/.staging") || !strings.Contains(ev[1], "root/cni/tmp-9") {
		t.Fatalf("leftovers %v: want root/.staging and root/cni/tmp-9", ev)
	}
	before.Layout = nil
	if ev := checkLeftoverDirs(in, &Poll{VMs: vms, StoreDirs: []string{"root", "root/vms", "root/vms/A1", "root/cni"}}); len(ev) != 1 {
		t.Fatalf("without a learned layout root/cni is new: %v", ev)
	}
}

// creatingObs is noLocks with a creating record.
type creatingObs struct{ noLocks }

func (creatingObs) VMs(context.Context) ([]manager.VM, error) {
	return []manager.VM{{ID: "C1", Name: "web", State: manager.StateCreating}}, nil
}

// Without a per-VM ops lock (cocoon), an agent case's poll that finds no
// verb of the manager running (Input.InFlight) is judged as a quiescent one:
// a creating record then has no owner. While a verb runs, the lock source
// fails: nothing proven, never a pass.
func TestInFlightDecidesQuiet(t *testing.T) {
	const tag = "VMCHAOS_TEST_INFLIGHT=1"
	cmd := exec.Command("sleep", "30")
	cmd.Env = append(os.Environ(), tag)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	for _, running := range []bool{true, false} {
		in := &Input{Manager: creatingObs{}, Procs: TagScan{Tag: tag}, Agentless: true, Without: map[Source]bool{SrcCheck: true},
			InFlight: func(ps []stack.Proc) []stack.Proc {
				if running {
					return ps // the tagged sleep stands for a `vm clone` in flight
				}
				return nil
			}}
		p := Collect(context.Background(), in, func() int64 { return 1 })
		inv := byName(Evaluate(in, p))[NoOrphanCreating]
		switch {
		case running && (inv.OK || !strings.Contains(inv.Evidence, "nothing proven") || p.Quiet):
			t.Errorf("a verb in flight: %+v (quiet %v), want nothing proven", inv, p.Quiet)
		case !running && (inv.OK || !strings.Contains(inv.Evidence, "vm C1 (web) is creating and its ops lock has no owner: no verb of the manager is running")):
			t.Errorf("no verb in flight: %+v, want the orphan named", inv)
		}
	}
}
