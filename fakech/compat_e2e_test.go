package fakech_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmchaos/vmchaos/chapi"
)

// TestRestoreOptionsByVersion: v51's RestoreConfig has only source_url,
// prefault and net_fds, so a JSON "resume":true is ignored and the VM stays
// Paused, and --restore ...,resume=on is an unknown option (exit 1); v52
// added resume and memory_restore_mode. CH: vmm/src/config.rs RestoreConfig
// and RestoreConfig::parse in v51.0 and v52.0.
func TestRestoreOptionsByVersion(t *testing.T) {
	p, c, _, _, dir := bootVM(t)
	snap := snapshotVM(t, c, dir)
	p.kill9()
	for _, tc := range []struct {
		compat    string
		wantState string
	}{{"v51", chapi.StatePaused}, {"v52", chapi.StateRunning}, {"v53", chapi.StateRunning}} {
		t.Run(tc.compat, func(t *testing.T) {
			env := baseEnv("FAKECH_COMPAT=" + tc.compat)
			sock := filepath.Join(vmDir(t, "VMR"+tc.compat), "api.sock")
			p2, c2 := startReady(t, sock, env, "--api-socket", "path="+sock)
			ctx := ctxT(t)
			if err := c2.Restore(ctx, chapi.RestoreConfig{SourceURL: "file://" + snap, Resume: true, MemoryRestoreMode: "Copy"}); err != nil {
				t.Fatal(err)
			}
			if info, err := c2.Info(ctx); err != nil || info.State != tc.wantState {
				t.Fatalf("after a JSON restore with resume:true: %v %v, want %s", info.State, err, tc.wantState)
			}
			// The restored VMM holds the disk's advisory lock: end it first.
			p2.kill9()
			sock2 := filepath.Join(vmDir(t, "VMC"+tc.compat), "api.sock")
			args := []string{"--api-socket", "path=" + sock2, "--restore", "source_url=file://" + snap + ",resume=on"}
			if tc.compat == "v51" {
				p3 := start(t, sock2, env, args...)
				if code := p3.wait(); code != 1 || !strings.Contains(p3.stderr.String(), "unknown option: resume") {
					t.Fatalf("v51 --restore resume=on: exit %d\n%s", code, p3.stderr.String())
				}
				return
			}
			p3, c3 := startReady(t, sock2, env, args...)
			defer p3.kill9()
			if info, err := c3.Info(ctx); err != nil || info.State != chapi.StateRunning {
				t.Fatalf("--restore resume=on: %v %v", info.State, err)
			}
		})
	}
}

// TestPingAnswersBeforeTheCLIVMExists: CH binds and serves the API socket,
// then its main thread parses the command-line config and sends
// create+boot to the VMM thread; a ping in between answers 200 while
// vm.info says "VM is not created". CH: cloud-hypervisor/src/main.rs
// start_vmm.
func TestPingAnswersBeforeTheCLIVMExists(t *testing.T) {
	ctl := t.TempDir()
	dir := vmDir(t, "VMPING")
	g := newGuest(t, dir)
	sock := filepath.Join(dir, "api.sock")
	start(t, sock, baseEnv("VMCHAOS_FAILPOINTS=ch.cli.start=pause", "VMCHAOS_FAILPOINT_CTL="+ctl), bootArgs(sock, g.path, loopbackIP())...)
	if _, err := waitParked(t, ctl, "ch.cli.start"); err != nil {
		t.Fatal(err)
	}
	c := chapi.New(sock)
	ctx := ctxT(t)
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("vmm.ping before the CLI VM exists: %v", err)
	}
	if e := chError(t, firstErr(c.Info(ctx))); e.Innermost() != "VM is not created" {
		t.Fatalf("vm.info before the CLI VM exists: %v", e)
	}
	release(t, ctl, "ch.cli.start")
	if info, err := c.WaitVM(ctx); err != nil || info.State != chapi.StateRunning {
		t.Fatalf("after the CLI boot: %v %v", info.State, err)
	}
}

// TestKill9MidSnapshotLeavesCHsDebris: CH writes config.json, then
// state.json, then memory-ranges (vm.rs Vm::send, memory_manager.rs
// MemoryManager::send); a kill -9 during the memory write leaves the first
// two complete and memory-ranges partial — v53 pre-sizes it (set_len), v51
// grows it. A retry into that directory fails on config.json.
func TestKill9MidSnapshotLeavesCHsDebris(t *testing.T) {
	for _, compat := range []string{"v51", "v53"} {
		t.Run(compat, func(t *testing.T) {
			ctl := t.TempDir()
			p, c, _, _, dir := bootVM(t, "FAKECH_COMPAT="+compat, "VMCHAOS_FAILPOINTS=ch.snapshot.memory-writing=pause", "VMCHAOS_FAILPOINT_CTL="+ctl)
			ctx := ctxT(t)
			if err := c.Pause(ctx, false); err != nil {
				t.Fatal(err)
			}
			snap := filepath.Join(dir, "snap")
			if err := os.Mkdir(snap, 0o755); err != nil {
				t.Fatal(err)
			}
			go func() { _ = c.Snapshot(context.Background(), snap) }()
			if _, err := waitParked(t, ctl, "ch.snapshot.memory-writing"); err != nil {
				t.Fatal(err)
			}
			p.kill9()
			for _, f := range []string{"config.json", "state.json"} {
				var v map[string]any
				decodeJSONFile(t, filepath.Join(snap, f), &v)
			}
			b, err := os.ReadFile(filepath.Join(snap, "memory-ranges"))
			if err != nil {
				t.Fatalf("memory-ranges: %v", err)
			}
			var m map[string]any
			if json.Unmarshal(b, &m) == nil {
				t.Fatal("memory-ranges is complete after a kill -9 mid-write")
			}
			zeroTail := len(b) > 0 && b[len(b)-1] == 0
			if (compat == "v53") != zeroTail {
				t.Fatalf("%s: memory-ranges of %d bytes, zero tail %v: want a pre-sized file only in v53", compat, len(b), zeroTail)
			}
			_, c2, _, _, _ := bootVM(t)
			if err := c2.Pause(ctx, false); err != nil {
				t.Fatal(err)
			}
			e := chError(t, c2.Snapshot(ctx, snap))
			if !chapi.HasMessage(e, "Error creating VM config snapshot file") {
				t.Fatalf("snapshot into the debris: %v", e)
			}
		})
	}
}

// TestFlagsByVersion: clap refuses a flag its release does not define
// (exit 2): --no-shutdown and --log-format arrived in v52, --rtc in v53.
// CH: cloud-hypervisor/src/main.rs create_app, v51.0/v52.0/v53.0.
func TestFlagsByVersion(t *testing.T) {
	for _, tc := range []struct {
		flag []string
		ok   map[string]bool
	}{
		{[]string{"--no-shutdown"}, map[string]bool{"v51": false, "v52": true, "v53": true}},
		{[]string{"--log-format", "json"}, map[string]bool{"v51": false, "v52": true, "v53": true}},
		{[]string{"--rtc", "base=utc"}, map[string]bool{"v51": false, "v52": false, "v53": true}},
		{[]string{"--pvpanic"}, map[string]bool{"v51": true, "v52": true, "v53": true}},
	} {
		for compat, ok := range tc.ok {
			sock := filepath.Join(vmDir(t, "VMF"+compat), "api.sock")
			args := append([]string{"--api-socket", "path=" + sock, "--firmware", "/nonexistent"}, tc.flag...)
			env := baseEnv("FAKECH_COMPAT=" + compat)
			if !ok {
				p := start(t, sock, env, args...)
				if code := p.wait(); code != 2 || !strings.Contains(p.stderr.String(), "unexpected argument '"+tc.flag[0]+"'") {
					t.Fatalf("%s %v: exit %d, want 2 (unknown flag)\n%s", compat, tc.flag, code, p.stderr.String())
				}
				continue
			}
			p, _ := startReady(t, sock, env, args...) // fails the test unless the VM boots
			p.kill9()
		}
	}
}

// TestSerialSocketLeftByKill9BlocksTheNextStart: --serial socket=P is a
// plain bind (console_devices.rs pre_create_console_devices), removed only by
// the serial manager's drop (serial_manager.rs); after kill -9 the file stays
// and the next start on P exits 1 with "Address already in use", in v51
// through v53. A clean exit removes it.
func TestSerialSocketLeftByKill9BlocksTheNextStart(t *testing.T) {
	dir := vmDir(t, "VMSERIAL")
	g := newGuest(t, dir)
	sock := filepath.Join(dir, "api.sock")
	serial := filepath.Join(dir, "serial.sock")
	args := []string{"--api-socket", "path=" + sock, "--firmware", "/nonexistent", "--disk", "path=" + g.path,
		"--console", "off", "--serial", "socket=" + serial}
	p, _ := startReady(t, sock, baseEnv(), args...)
	if fi, err := os.Stat(serial); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("serial socket not bound: %v", err)
	}
	conn, err := net.Dial("unix", serial)
	if err != nil {
		t.Fatalf("connect to the serial socket: %v", err)
	}
	conn.Close()
	p.kill9()
	if _, err := os.Stat(serial); err != nil {
		t.Fatalf("kill -9 removed the serial socket: %v", err)
	}
	_ = os.Remove(sock) // v51: the API socket is left too; that is a separate row
	p2 := start(t, sock, baseEnv(), args...)
	if code := p2.wait(); code != 1 {
		t.Fatalf("start over a leftover serial socket: exit %d, want 1\n%s", code, p2.stderr.String())
	}
	out := p2.stderr.String()
	for _, want := range []string{"Error creating VM", "Error creating console device", "Address already in use (os error 98)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("stderr lacks %q:\n%s", want, out)
		}
	}
	_ = os.Remove(serial)
	_ = os.Remove(sock)
	p3, _ := startReady(t, sock, baseEnv(), args...)
	if err := p3.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p3.wait(); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	if _, err := os.Stat(serial); !os.IsNotExist(err) {
		t.Fatalf("a clean exit left the serial socket: %v", err)
	}
}

// TestDiskAdvisoryLockAndInPlaceWrites: the VMM holds an OFD lock on each
// disk image from boot (write for read-write, read for read-only), so a
// second VMM on the same image fails to boot until the first is gone; the
// guest's sync writes through the opened inode (the inode number never
// changes). CH: block/src/fcntl.rs try_acquire_lock, virtio-devices block.rs
// try_lock_image, vm.rs Vm::boot.
func TestDiskAdvisoryLockAndInPlaceWrites(t *testing.T) {
	p, _, g, ip, dir := bootVM(t)
	ino := func() uint64 {
		fi, err := os.Stat(g.path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	before := ino()
	if _, _, st := g.sshRun(t, ip, "mkdir -p /var/lib/m && touch /var/lib/m/synced && sync"); st != 0 {
		t.Fatal("guest write failed")
	}
	if after := ino(); after != before {
		t.Fatalf("sync replaced the image file (inode %d → %d): CH writes through the inode it opened", before, after)
	}
	for i, ro := range []string{"", ",readonly=on"} {
		sock := filepath.Join(dir, fmt.Sprintf("b%d.sock", i))
		q := start(t, sock, baseEnv(), "--api-socket", "path="+sock, "--firmware", "/nonexistent", "--disk", "path="+g.path+ro)
		if code := q.wait(); code != 1 || !strings.Contains(q.stderr.String(), "The file is already locked") ||
			!strings.Contains(q.stderr.String(), "Error locking disk images: Another instance likely holds a lock") {
			t.Fatalf("second VMM on a locked image (%q): exit %d\n%s", ro, code, q.stderr.String())
		}
	}
	p.kill9()
	sock := filepath.Join(dir, "c.sock")
	startReady(t, sock, baseEnv(), bootArgs(sock, g.path, ip)...)
	if _, _, st := g.sshRun(t, ip, "ls /var/lib/m/synced"); st != 0 {
		t.Fatal("the synced write did not reach the image")
	}
}
