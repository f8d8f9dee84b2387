package fakech_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
)

// trace is the harness side of VMCHAOS_TRACE: a unixgram socket collecting
// fakech's failpoint datagrams.
type trace struct {
	path   string
	mu     sync.Mutex
	events []failpoint.Event
	signal chan struct{}
}

func newTrace(t *testing.T) *trace {
	t.Helper()
	// Unix socket paths are short (108 bytes); t.TempDir() can be long.
	dir, err := os.MkdirTemp("", "fktr")
	if err != nil {
		t.Fatal(err)
	}
	tr := &trace{path: filepath.Join(dir, "t.sock"), signal: make(chan struct{}, 1)}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: tr.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			ev, err := failpoint.ParseEvent(buf[:n])
			if err != nil {
				continue
			}
			tr.mu.Lock()
			tr.events = append(tr.events, ev)
			tr.mu.Unlock()
			select {
			case tr.signal <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
		os.RemoveAll(dir)
	})
	return tr
}

// waitPoint returns the first event of point, waiting for it.
func (tr *trace) waitPoint(t *testing.T, point string) failpoint.Event {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		tr.mu.Lock()
		for _, e := range tr.events {
			if e.Point == point {
				tr.mu.Unlock()
				return e
			}
		}
		tr.mu.Unlock()
		select {
		case <-tr.signal:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no %s event in the trace", point)
		}
	}
}

// snapshotVM pauses and snapshots into <dir>/snap.
func snapshotVM(t *testing.T, c *chapi.Client, dir string) string {
	t.Helper()
	ctx := ctxT(t)
	if err := c.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(dir, "snap")
	if err := os.Mkdir(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.Snapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	return snap
}

func TestSnapshotLayoutAndExistingFilesRefused(t *testing.T) {
	_, c, g, _, dir := bootVM(t)
	snap := snapshotVM(t, c, dir)
	for _, f := range []string{"config.json", "state.json", "memory-ranges"} {
		fi, err := os.Stat(filepath.Join(snap, f))
		if err != nil {
			t.Fatalf("snapshot file %s: %v", f, err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v, want 0600 like CH", f, fi.Mode().Perm())
		}
	}
	var cfg chapi.VmConfig
	decodeJSONFile(t, filepath.Join(snap, "config.json"), &cfg)
	if len(cfg.Disks) != 1 || cfg.Disks[0].Path != g.path {
		t.Fatalf("config.json disks %+v, want the guest image", cfg.Disks)
	}
	info, err := c.Info(ctxT(t))
	if err != nil || info.State != chapi.StatePaused {
		t.Fatalf("after snapshot the VM stays Paused: %+v %v", info.State, err)
	}
	e := chError(t, c.Snapshot(ctxT(t), snap))
	if e.Status != 500 || !chapi.HasMessage(e, "Error creating VM config snapshot file") || e.Innermost() != "File exists (os error 17)" {
		t.Fatalf("snapshot into a dir that holds one: %v", e)
	}
	e = chError(t, c.Snapshot(ctxT(t), filepath.Join(dir, "missing")))
	if !strings.HasPrefix(e.Innermost(), "Destination is not a directory") {
		t.Fatalf("snapshot into a missing dir: %v", e)
	}
}

// TestRestoreKeepsRAMAndBootID is hibernate/wake: a RAM file and an unsynced
// disk write survive snapshot → kill -9 → restore into a fresh process; the
// boot id is the same, the VM comes back Paused, and resumes.
func TestRestoreKeepsRAMAndBootID(t *testing.T) {
	p, c, g, ip, dir := bootVM(t)
	bootID, _, _ := g.sshRun(t, ip, "cat /proc/sys/kernel/random/boot_id")
	if out, errOut, st := g.sshRun(t, ip, "mkdir -p /run/vmchaos && touch /run/vmchaos/ram-marker && echo page-cache > /var/lib/unsynced"); st != 0 {
		t.Fatalf("guest write: %d %s %s", st, out, errOut)
	}
	snap := snapshotVM(t, c, dir)
	p.kill9()

	sock2 := filepath.Join(vmDir(t, "VMRESTORED"), "api.sock")
	_, c2 := startReady(t, sock2, baseEnv(), "--api-socket", "path="+sock2)
	ctx := ctxT(t)
	if err := c2.Restore(ctx, chapi.RestoreConfig{SourceURL: "file://" + snap}); err != nil {
		t.Fatal(err)
	}
	info, err := c2.Info(ctx)
	if err != nil || info.State != chapi.StatePaused {
		t.Fatalf("after restore: %v %v, want Paused", info.State, err)
	}
	if e := chError(t, c2.Restore(ctx, chapi.RestoreConfig{SourceURL: "file://" + snap})); e.Innermost() != "VM is already created" {
		t.Fatalf("second restore: %v", e)
	}
	if err := c2.Resume(ctx, false); err != nil {
		t.Fatal(err)
	}
	if info, _ := c2.Info(ctx); info.State != chapi.StateRunning {
		t.Fatalf("after resume: %v", info.State)
	}
	// The restored config keeps the NIC, so the guest answers on its address.
	out, _, st := g.sshRun(t, ip, "ls /run/vmchaos && cat /var/lib/unsynced && cat /proc/sys/kernel/random/boot_id")
	if st != 0 || out != "ram-marker\npage-cache\n"+bootID {
		t.Fatalf("after restore: status %d, output %q; want the RAM marker, the unsynced write and boot id %q", st, out, bootID)
	}
}

// TestUnsyncedDiskWriteLostOnKill9: writes reach the image file only on
// `sync`; a kill -9 loses the rest, and RAM is gone after the next boot.
func TestUnsyncedDiskWriteLostOnKill9(t *testing.T) {
	p, _, g, ip, dir := bootVM(t)
	bootID, _, _ := g.sshRun(t, ip, "cat /proc/sys/kernel/random/boot_id")
	g.sshRun(t, ip, "mkdir -p /var/lib/vmchaos/ledger && touch /var/lib/vmchaos/ledger/synced && sync")
	g.sshRun(t, ip, "touch /var/lib/vmchaos/ledger/unsynced /run/ram")
	p.kill9()

	sock := filepath.Join(dir, "api2.sock")
	_, _ = startReady(t, sock, baseEnv(), bootArgs(sock, g.path, ip)...)
	out, _, st := g.sshRun(t, ip, "ls -1 /var/lib/vmchaos/ledger")
	if st != 0 || out != "synced\n" {
		t.Fatalf("after kill -9 and a fresh boot: %q (status %d), want only the synced marker", out, st)
	}
	if _, errOut, st := g.sshRun(t, ip, "ls /run/ram"); st == 0 {
		t.Fatalf("RAM file survived a fresh boot: %s", errOut)
	}
	newID, _, _ := g.sshRun(t, ip, "cat /proc/sys/kernel/random/boot_id")
	if newID == bootID || len(newID) != 37 {
		t.Fatalf("boot id %q after a fresh boot, old %q", newID, bootID)
	}
}

func TestGuestShellOverSSH(t *testing.T) {
	_, _, g, ip, _ := bootVM(t)
	for _, tc := range []struct {
		cmd     string
		status  int
		out     string
		errPart string
	}{
		{"touch /root/a && ls /root", 0, "a\n", ""},
		{"ls -a /root", 0, ".ssh\na\n", ""},
		{"hostname", 0, g.img.Hostname + "\n", ""},
		{"echo hello world > /tmp/f; cat /tmp/f", 0, "hello world\n", ""},
		{"echo x >> /tmp/f && cat /tmp/f", 0, "hello world\nx\n", ""},
		{"sha256sum /tmp/f", 0, "", ""},
		{"cat /nope", 1, "", "No such file or directory"},
		{"rm /nope; rm -f /nope", 0, "", "cannot remove"},
		{"false && echo no", 1, "", ""},
		{"nosuchcmd", 127, "", "not found"},
		{"dhclient -r", 0, "", ""},
		{"true", 0, "", ""},
		{"mkdir /a/b", 1, "", "No such file or directory"},
	} {
		out, errOut, st := g.sshRun(t, ip, tc.cmd)
		if st != tc.status || (tc.out != "" && out != tc.out) || !strings.Contains(errOut, tc.errPart) {
			t.Errorf("%q: status %d out %q err %q; want %d %q %q", tc.cmd, st, out, errOut, tc.status, tc.out, tc.errPart)
		}
	}
	// Host key pinning: a client expecting another key is refused.
	other := newGuest(t, t.TempDir())
	other.img.SSHPort = g.img.SSHPort
	other.signer = g.signer
	if _, _, _, err := other.trySSH(ip, "true", 10*time.Second); err == nil || !strings.Contains(err.Error(), "host key mismatch") {
		t.Fatalf("connecting with another pinned host key: %v", err)
	}
	// An unauthorized client key is refused.
	stranger := newGuest(t, t.TempDir())
	stranger.img = g.img
	if _, _, _, err := stranger.trySSH(ip, "true", 10*time.Second); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("unauthorized key: %v", err)
	}
}

func TestNICRemoveClosesListenerAddOpens(t *testing.T) {
	trace := newTrace(t)
	_, c, g, ip, dir := bootVM(t, "VMCHAOS_TRACE="+trace.path)
	addr := net.JoinHostPort(ip, strconv.Itoa(guestimg.DefaultSSHPort))
	g.sshRun(t, ip, "true")
	ctx := ctxT(t)
	if err := c.RemoveDevice(ctx, "_net1"); err != nil {
		t.Fatal(err)
	}
	if ev := trace.waitPoint(t, "ch.net.removed"); ev.VM != filepath.Base(dir) || ev.Attrs["nic"] != "_net1" {
		t.Fatalf("ch.net.removed event %+v", ev)
	}
	// The listener closes when the guest acks the eject (eject_ack of
	// running time later), not when remove-device returns.
	trace.waitPoint(t, "ch.eject.acked")
	if !eventuallyRefused(addr, 10*time.Second) {
		t.Fatalf("guest address %s still answers after the eject was acked", addr)
	}
	info, _ := c.Info(ctx)
	if len(info.Config.Net) != 0 {
		t.Fatalf("removed NIC still in config: %+v", info.Config.Net)
	}
	dev, err := c.AddNet(ctx, chapi.NetConfig{IP: ip, Mac: "52:54:00:00:00:01"})
	if err != nil {
		t.Fatal(err)
	}
	if dev.ID != "_net2" {
		t.Fatalf("hot-plugged NIC id %q, want _net2 from the shared counter", dev.ID)
	}
	trace.waitPoint(t, "ch.net.added")
	if out, _, st := g.sshRun(t, ip, "hostname"); st != 0 || out == "" {
		t.Fatalf("guest not reachable after add-net: %d %q", st, out)
	}
	if _, err := c.AddNet(ctx, chapi.NetConfig{IP: "192.168.1.1"}); !chapi.HasMessage(err, "not in 127.0.0.0/8") {
		t.Fatalf("non-loopback add-net: %v", err)
	}
}

// TestPausedGuestDoesNotAnswer: a paused guest hangs SSH clients until resumed.
func TestPausedGuestDoesNotAnswer(t *testing.T) {
	_, c, g, ip, _ := bootVM(t)
	ctx := ctxT(t)
	if err := c.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := g.trySSH(ip, "true", 300*time.Millisecond); err == nil {
		t.Fatalf("paused guest answered SSH")
	}
	if err := c.Resume(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, _, st := g.sshRun(t, ip, "true"); st != 0 {
		t.Fatalf("resumed guest: status %d", st)
	}
}
