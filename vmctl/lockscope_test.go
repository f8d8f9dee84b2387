package vmctl

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestNetCompletesWhileSaveParkedAtPending: the save's ops lock covers pause,
// capture and resume only. A save parked at snapshot.save.pending holds its
// build lease and pending record but not the VM, so vm net (and vm start) on
// the same VM complete; the save then finishes untouched (seed 001 #3's
// structure: the VM is free while a dead save's child still holds its lease).
func TestNetCompletesWhileSaveParkedAtPending(t *testing.T) {
	s := newStack(t, "0.05")
	s.runVM("a")
	_, wait := s.park("snapshot.save.pending", nil, "snapshot", "save", "--name", "s", "a", "-o", "json")
	var pend *Snapshot
	for _, sn := range s.snaps() {
		if sn.Name == "s" {
			pend = &sn
		}
	}
	if pend == nil || pend.State != SnapPending {
		t.Fatalf("no pending record while parked: %+v", s.snaps())
	}
	net := s.background(nil, "vm", "net", "a", "--nics", "0")
	eventually(t, "vm net while the save is parked at snapshot.save.pending", net.exited)
	if r := net.wait(t); r.code != 0 {
		t.Fatalf("vm net: %s", r)
	}
	if v := s.vm("a"); len(v.Network) != 0 || v.VMMState != "Running" {
		t.Fatalf("after vm net --nics 0: %+v", v)
	}
	start := s.background(nil, "vm", "start", "a")
	eventually(t, "vm start while the save is parked", start.exited)
	if r := start.wait(t); r.code != 0 {
		t.Fatalf("vm start: %s", r)
	}
	// The build lease is still held: the parked save owns its record.
	s.fails("rm: "+fmt.Sprintf(MsgSnapInUse, pend.ID), "snapshot", "rm", pend.ID)
	s.release("snapshot.save.pending")
	r := wait()
	if r.code != 0 {
		t.Fatalf("save after release: %s", r)
	}
	var fin Snapshot
	if err := json.Unmarshal([]byte(r.stdout), &fin); err != nil || fin.ID != pend.ID || fin.State != SnapReady {
		t.Fatalf("save output %q (%v), want ready %s", r.stdout, err, pend.ID)
	}
	s.ok("vm", "net", "a", "--nics", "1")
	s.waitGuest("a")
	s.ok("vm", "clone", "--name", "b", "s")
	s.waitGuest("b")
	s.check()
}

// TestSaveKilledBeforeItsLeaseLeavesACaptureGCRemoves: a save SIGKILLed
// between the release of the ops lock and its build lease leaves its capture
// in the VM's dir: check reports it, gc removes it, the VM is untouched.
func TestSaveKilledBeforeItsLeaseLeavesACaptureGCRemoves(t *testing.T) {
	s := newStack(t, "0.05")
	s.runVM("a")
	r := s.runEnv([]string{"VMCHAOS_FAILPOINTS=snapshot.save.unlocked=kill"}, "snapshot", "save", "--name", "s", "a")
	if r.signal != syscall.SIGKILL {
		t.Fatalf("save not killed: %s", r)
	}
	id := s.vm("a").ID
	caps, _ := filepath.Glob(filepath.Join(s.root, "vms", id, capturePrefix+"*"))
	if len(caps) != 1 {
		t.Fatalf("want one capture dir, got %v", caps)
	}
	if c := s.run("check"); c.code != 1 || !strings.Contains(c.stdout, "no-leftover-staging") {
		t.Fatalf("check must report the dead capture: %s", c)
	}
	if len(s.snaps()) != 0 {
		t.Fatalf("a save killed before its lease left a record: %+v", s.snaps())
	}
	s.ok("gc")
	if _, err := os.Stat(caps[0]); !os.IsNotExist(err) {
		t.Fatalf("gc left %s (%v)", caps[0], err)
	}
	s.ok("snapshot", "save", "--name", "s", "a")
	s.check()
}

// TestRunCommitsCreatedAndStartRelocks: vm run commits created, releases the
// ops lock, and its start takes the lock again. Parked at vm.create.created
// the record reads created with a free ops lock (reconcile-stale-create
// answers not-creating, not busy); released, the same process boots it.
func TestRunCommitsCreatedAndStartRelocks(t *testing.T) {
	s := newStack(t, "0.05")
	tr := newTrace(t)
	pid, wait := s.park("vm.create.created", []string{tr.env()}, "vm", "run", "--name", "a", s.image)
	if v := s.vm("a"); v.State != StateCreated || v.Pid != 0 {
		t.Fatalf("parked at vm.create.created: %+v", v)
	}
	if res := s.staleCreate("a"); res.Outcome != OutcomeNotCreating {
		t.Fatalf("ops lock must be free at created: outcome %s", res.Outcome)
	}
	s.release("vm.create.created")
	if r := wait(); r.code != 0 {
		t.Fatalf("run: %s", r)
	}
	if v := s.vm("a"); v.State != StateRunning {
		t.Fatalf("after run: %+v", v)
	}
	var created, relocked int64
	for _, e := range tr.snapshot() {
		if e.Pid != pid {
			continue
		}
		switch e.Point {
		case "vm.create.created":
			created = e.TsNs
		case "vm.start.locked":
			relocked = e.TsNs
		}
	}
	if created == 0 || relocked <= created {
		t.Fatalf("run's start must re-lock after created: created %d relocked %d", created, relocked)
	}
	s.waitGuest("a")
	s.check()
}

// TestLeaseReadersWaitForTheHolder: clone and export of a snapshot whose
// lease a live builder holds (a save parked at snapshot.save.finalized: the
// record is ready, the lease still held) wait instead of failing, and
// complete once it lets go; a holder that never lets go ends the wait with
// the in-use refusal.
func TestLeaseReadersWaitForTheHolder(t *testing.T) {
	s := newStack(t, "0.05")
	s.runVM("a")
	_, wait := s.park("snapshot.save.finalized", nil, "snapshot", "save", "--name", "s", "a")
	var snap Snapshot
	for _, sn := range s.snaps() {
		if sn.Name == "s" {
			snap = sn
		}
	}
	if snap.State != SnapReady {
		t.Fatalf("want the record ready while the builder holds the lease: %+v", snap)
	}
	lease := filepath.Join(s.root, "snapshots", snap.ID+".lease")
	out := filepath.Join(t.TempDir(), "s.tar")
	clone := s.background(nil, "vm", "clone", "--name", "b", "s")
	export := s.background(nil, "snapshot", "export", "s", "-o", out)
	for _, p := range []*proc{clone, export} {
		eventually(t, "reader waiting on the lease", func() bool { return p.exited() || holdsOpen(p.cmd.Process.Pid, lease) })
		if p.exited() {
			t.Fatalf("reader did not wait for the lease: %s", p.wait(t))
		}
	}
	s.release("snapshot.save.finalized")
	if r := wait(); r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	for _, p := range []*proc{clone, export} {
		if r := p.wait(t); r.code != 0 {
			t.Fatalf("reader after the holder let go: %s", r)
		}
	}
	s.waitGuest("b")

	// A holder that stays (this test, exclusive): the wait (30 s × 0.05)
	// ends with the refusal, id last.
	f, err := os.OpenFile(lease, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	s.fails("export: "+fmt.Sprintf(MsgSnapInUse, snap.ID), "snapshot", "export", snap.ID, "-o", out)
	s.fails("clone: "+fmt.Sprintf(MsgSnapInUse, snap.ID), "vm", "clone", "--name", "c", snap.ID)
	f.Close()
	s.check()
}

// holdsOpen reports whether pid has path open.
func holdsOpen(pid int, path string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == path {
			return true
		}
	}
	return false
}
