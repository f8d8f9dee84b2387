package vmctl

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
)

// TestStartIsIdempotentAndRebootsDeadVMM: start on a live VM changes
// nothing; after kill -9 the record reads stopped (stale) and start boots the
// VM again from its disk (synced data kept, RAM lost).
func TestStartIsIdempotentAndRebootsDeadVMM(t *testing.T) {
	s := newStack(t, "0.02")
	a := s.runVM("a")
	s.ok("vm", "exec", "a", "--", "touch /var/lib/disk-file && sync && touch /run/ram-file")
	s.ok("vm", "start", "a")
	if v := s.vm("a"); v.Pid != a.Pid || v.State != StateRunning {
		t.Fatalf("start on a live VM changed it: %+v", v)
	}
	if err := syscall.Kill(a.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "stale", func() bool { return s.list()[0].State == StateStale })
	if r := s.run("check"); r.code == 0 || !strings.Contains(r.stdout, "no-running-with-dead-vmm") {
		t.Fatalf("check should flag the dead VMM: %s", r)
	}
	s.ok("vm", "start", "a")
	s.waitGuest("a")
	if v := s.vm("a"); v.Pid == a.Pid || v.VMMState != "Running" {
		t.Fatalf("not rebooted: %+v", v)
	}
	out := s.ok("vm", "exec", "a", "--", "ls /var/lib /run")
	if !strings.Contains(out, "disk-file") || strings.Contains(out, "ram-file") {
		t.Fatalf("after a cold boot want the synced file and not the RAM one: %q", out)
	}
	s.check()
}

// TestGCRemovesWhatNoOwnerHolds: pending records and staging dirs whose
// lease is free, unreferenced VM dirs (and their VMMs), temp index files;
// a pending record whose save is alive is left alone.
func TestGCRemovesWhatNoOwnerHolds(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	// A dead save's pending record and a dead save's staging dir.
	if r := s.runEnv([]string{failpoint.EnvFailpoints + "=snapshot.save.pending=kill"}, "snapshot", "save", "--name", "p", "a"); r.signal != syscall.SIGKILL {
		t.Fatal(r)
	}
	if r := s.runEnv([]string{failpoint.EnvFailpoints + "=snapshot.save.captured=kill"}, "snapshot", "save", "--name", "c", "a"); r.signal != syscall.SIGKILL {
		t.Fatal(r)
	}
	s.ok("vm", "net", "a", "--nics", "1") // the captured-kill left the VMM paused
	// A live save parked after its pending insert (it holds a's ops lock).
	pid, wait := s.park("snapshot.save.pending", nil, "snapshot", "save", "--name", "live", "a")
	// Unreferenced VM dirs and a temp file of a commit that died.
	junk := newID()
	os.MkdirAll(s.m.vmDir(junk), 0o755)
	os.MkdirAll(s.m.vmRunDir(junk), 0o755)
	tmp := filepath.Join(s.root, ".vms.json.tmp-123")
	os.WriteFile(tmp, []byte("x"), 0o644)

	var rep GCReport
	if err := json.Unmarshal([]byte(s.ok("gc")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Pending) != 1 || len(rep.Staging) != 1 || len(rep.Orphans) != 1 || rep.Orphans[0] != junk || len(rep.TempFile) != 1 {
		t.Fatalf("gc report: %+v", rep)
	}
	names := map[string]string{}
	for _, sn := range s.snaps() {
		names[sn.Name] = sn.State
	}
	if len(names) != 1 || names["live"] != SnapPending {
		t.Fatalf("gc must keep only the live save's pending record: %v", names)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	wait()
	s.ok("gc")
	if len(s.snaps()) != 0 {
		t.Fatalf("pending record of the dead save survived: %+v", s.snaps())
	}
	s.check()
}

// TestExportImportThroughPipes: export to stdout, import from stdin.
func TestExportImportThroughPipes(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	s.ok("snapshot", "save", "--name", "base", "a")
	archive := s.ok("snapshot", "export", "base", "-o", "-")
	s2 := newStack(t, "0.02", "VMCTL_SSH_KEY="+s.key)
	cmd := s2.command(nil, "snapshot", "import", "-", "-o", "json")
	cmd.Stdin = strings.NewReader(archive)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("import: %v %s", err, errb.String())
	}
	var sn Snapshot
	if err := json.Unmarshal(out.Bytes(), &sn); err != nil || sn.Name != "base" || sn.State != SnapReady {
		t.Fatalf("import: %+v %v", sn, err)
	}
	// The name is taken now: a second import of it is refused by name.
	cmd = s2.command(nil, "snapshot", "import", "-")
	cmd.Stdin = strings.NewReader(archive)
	if b, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(b), `already exists (held by `+sn.ID+`)`) {
		t.Fatalf("second import: %v %s", err, b)
	}
	s2.ok("vm", "clone", "--name", "b", "base")
	s2.waitGuest("b")
	s2.check()
	s.check()
}

// TestGCRemovesASpentRestoreCopy: a clone removes its restore copy once the
// guest runs, but not durably; a power cut right after brings it back (the
// manager-verb power-cut cases found it: mgr-clone-powercut-at-10%). gc
// removes the copy of a VM committed past creating.
func TestGCRemovesASpentRestoreCopy(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	s.ok("snapshot", "save", "--name", "base", "a")
	s.ok("vm", "clone", "--name", "b", "base")
	b := s.vm("b")
	rd := s.m.restoreDir(b.ID)
	if _, err := os.Stat(rd); !os.IsNotExist(err) {
		t.Fatalf("the clone left its restore copy: %v", err)
	}
	// what the power cut brings back: the copy, as before its removal
	if err := os.MkdirAll(rd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rd, "memory-ranges"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	var rep GCReport
	if err := json.Unmarshal([]byte(s.ok("gc")), &rep); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rd); !os.IsNotExist(err) || len(rep.Restores) != 1 || rep.Restores[0] != b.ID {
		t.Fatalf("gc kept the spent restore copy of %s (%v): %+v", b.ID, err, rep)
	}
	s.check()
}

// TestDaemonCollectsDeadSaves: an operator's save killed after its pending
// record leaves the name held with the build lease free; the daemon's pass
// removes it (nothing else would but a manual gc) and keeps a live save's.
func TestDaemonCollectsDeadSaves(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	if r := s.runEnv([]string{failpoint.EnvFailpoints + "=snapshot.save.pending=kill"}, "snapshot", "save", "--name", "p", "a"); r.signal != syscall.SIGKILL {
		t.Fatal(r)
	}
	pid, wait := s.park("snapshot.save.pending", nil, "snapshot", "save", "--name", "live", "a")
	s.ok("daemon", "--once")
	names := map[string]string{}
	for _, sn := range s.snaps() {
		names[sn.Name] = sn.State
	}
	if len(names) != 1 || names["live"] != SnapPending {
		t.Fatalf("after a daemon pass: %v, want only the live save's pending record", names)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	wait()
	s.ok("daemon", "--once")
	if len(s.snaps()) != 0 {
		t.Fatalf("pending record of the killed live save survived the daemon: %+v", s.snaps())
	}
	s.check()
}

// TestFailedBootLeavesNoSocket: a VMM that dies while `vm start` waits for
// its boot (SIGKILL at ch.boot) fails the start, which commits nothing; it
// must not leave the dead VMM's api.sock behind (no daemon pass or later
// verb of a stopped VM cleans it up).
func TestFailedBootLeavesNoSocket(t *testing.T) {
	s := newStack(t, "0.02")
	v := s.runVM("a")
	s.ok("vm", "stop", "a")
	// killed at boot (bootVMM's wait) and right after binding its socket
	// (launchVMM's wait for the first answer)
	for _, point := range []string{"ch.boot", "ch.cli.start"} {
		if r := s.runEnv([]string{failpoint.EnvFailpoints + "=" + point + "=kill"}, "vm", "start", "a"); r.code == 0 {
			t.Fatalf("start over a VMM killed at %s: %+v, want a failure", point, r)
		}
		if _, err := os.Stat(s.m.apiSocket(v.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: api.sock of the dead VMM: %v, want gone", point, err)
		}
	}
	s.ok("vm", "start", "a")
	s.check()
}

// TestDaemonFinishesAnInterruptedNet: a vm net killed after it recorded the
// NIC to eject leaves the record waiting for that eject; nobody reruns an
// operator's verb, so the daemon's pass finishes the change.
func TestDaemonFinishesAnInterruptedNet(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	if r := s.runEnv([]string{failpoint.EnvFailpoints + "=vm.net.removed=kill"}, "vm", "net", "a", "--nics", "0"); r.signal != syscall.SIGKILL {
		t.Fatal(r)
	}
	if v := s.vm("a"); len(v.Ejecting) == 0 {
		t.Fatalf("the killed net left no eject in the record: %+v", v)
	}
	s.ok("daemon", "--once")
	if v := s.vm("a"); len(v.Ejecting) != 0 || v.Config.NICs != 0 || len(v.Network) != 0 {
		t.Fatalf("after a daemon pass: ejecting %v, %d NICs %v: want the change finished", v.Ejecting, v.Config.NICs, v.Network)
	}
	s.check()
}
