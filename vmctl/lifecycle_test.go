package vmctl

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/chapi"
)

// TestLifecycleOnFakech walks a VM through every verb with the real binaries:
// run → inspect/list → snapshot save → clone → net 0/1 → exec → stop →
// start → rm, then export → import → clone on a second root dir.
func TestLifecycleOnFakech(t *testing.T) {
	s := newStack(t, "0.02")
	a := s.runVM("a")
	if a.State != StateRunning || a.VMMState != chapi.StateRunning || len(a.Network) != 1 {
		t.Fatalf("run: %+v", a)
	}
	if vs := s.list(); len(vs) != 1 || vs[0].ID != a.ID || vs[0].State != StateRunning {
		t.Fatalf("list: %+v", vs)
	}
	// A disk marker written and synced before the save must be in the clone.
	s.ok("vm", "exec", "a", "--", "mkdir -p /var/lib/m && touch /var/lib/m/one && sync")
	s.ok("vm", "exec", "a", "--", "touch /run/ram-marker")
	var snap Snapshot
	if err := json.Unmarshal([]byte(s.ok("snapshot", "save", "--name", "base", "a", "-o", "json")), &snap); err != nil {
		t.Fatal(err)
	}
	if snap.State != SnapReady || snap.Name != "base" || snap.VMID != a.ID {
		t.Fatalf("save: %+v", snap)
	}
	if v := s.vm("a"); v.VMMState != chapi.StateRunning {
		t.Fatalf("source left %s after save", v.VMMState)
	}
	var b VM
	if err := json.Unmarshal([]byte(s.ok("vm", "clone", "--name", "b", "base", "-o", "json")), &b); err != nil {
		t.Fatal(err)
	}
	if b.State != StateRunning || len(b.Network) != 1 || b.Network[0].IP == a.Network[0].IP {
		t.Fatalf("clone: %+v (source %+v)", b, a.Network)
	}
	if out := s.ok("vm", "exec", "b", "--", "ls /var/lib/m"); !strings.Contains(out, "one") {
		t.Fatalf("clone lost the disk marker: %q", out)
	}
	if out := s.ok("vm", "exec", "b", "--", "ls /run"); !strings.Contains(out, "ram-marker") {
		t.Fatalf("clone lost the RAM marker (booted fresh?): %q", out)
	}
	// net 0: the guest is unreachable; net 1: reachable again.
	s.ok("vm", "net", "b", "--nics", "0")
	if v := s.vm("b"); len(v.Network) != 0 || v.Config.NICs != 0 {
		t.Fatalf("net 0: %+v", v)
	}
	s.fails("has no network interface", "vm", "exec", "b", "--", "hostname")
	s.ok("vm", "net", "b", "--nics", "1")
	s.waitGuest("b")
	// exec returns the guest command's exit status.
	if r := s.run("vm", "exec", "b", "--", "no-such-command"); r.code != 127 {
		t.Fatalf("exec status: %s", r)
	}
	s.ok("vm", "stop", "b")
	if v := s.vm("b"); v.State != StateStopped || v.Pid != 0 {
		t.Fatalf("stop: %+v", v)
	}
	s.fails("vm not running", "vm", "exec", "b", "--", "hostname")
	s.ok("vm", "start", "b")
	s.waitGuest("b")
	if out := s.ok("vm", "exec", "b", "--", "ls /var/lib/m"); !strings.Contains(out, "one") {
		t.Fatalf("restart lost the synced disk marker: %q", out)
	}
	s.fails("stop it first or use --force", "vm", "rm", "b")
	s.ok("vm", "rm", "--force", "b")
	s.fails(MsgVMNotFound, "vm", "inspect", "b")
	s.check()

	// export → import → clone on a second root.
	tarPath := filepath.Join(t.TempDir(), "base.tar")
	s.ok("snapshot", "export", "base", "-o", tarPath)
	// The guest image (and so its authorized key) travels with the snapshot.
	s2 := newStack(t, "0.02", "VMCTL_SSH_KEY="+s.key)
	var imp Snapshot
	if err := json.Unmarshal([]byte(s2.ok("snapshot", "import", "--name", "imported", tarPath, "-o", "json")), &imp); err != nil {
		t.Fatal(err)
	}
	if imp.State != SnapReady || imp.Name != "imported" {
		t.Fatalf("import: %+v", imp)
	}
	s2.ok("vm", "clone", "--name", "c", "imported")
	s2.waitGuest("c")
	if out := s2.ok("vm", "exec", "c", "--", "ls /var/lib/m"); !strings.Contains(out, "one") {
		t.Fatalf("imported clone lost the disk marker: %q", out)
	}
	s2.ok("vm", "rm", "--force", "c")
	s2.ok("snapshot", "rm", "imported")
	s2.check()
	s.ok("vm", "rm", "--force", "a")
	s.ok("snapshot", "rm", "base")
	if ss := s.snaps(); len(ss) != 0 {
		t.Fatalf("snapshots left: %+v", ss)
	}
	s.check()
}

// TestExecPinsTheGuestHostKey: vm exec trusts only the host key the VM's
// seed gave its guest. The stack's image holds a host key of its own and no
// authorized key, so a guest that answers took both from the seed; once the
// pinned key is another one, the guest is refused.
func TestExecPinsTheGuestHostKey(t *testing.T) {
	s := newStack(t, "0.02")
	a := s.runVM("a")
	if out := s.ok("vm", "exec", "a", "--", "hostname"); strings.TrimSpace(out) == "" {
		t.Fatalf("vm exec: %q", out)
	}
	// Pin another key behind the running guest's back.
	if err := s.m.writeHostKey(a.ID, nil); err != nil {
		t.Fatal(err)
	}
	r := s.fails("ssh: handshake failed", "vm", "exec", "a", "--", "hostname")
	if !strings.Contains(r.stderr, "host key mismatch") {
		t.Fatalf("want a host key mismatch: %s", r)
	}
}
