package fakech

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/fakech/guestimg"
)

func testGuest(t testing.TB) (*guest, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.img")
	img, err := guestimg.Build(p, guestimg.Options{Hostname: "unit"})
	if err != nil {
		t.Fatal(err)
	}
	g := newGuest(p, img, 0)
	g.setRunning(true)
	return g, p
}

func sh(g *guest, line string) (string, string, int) {
	var o, e bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st := g.run(ctx, line, &o, &e)
	return o.String(), e.String(), st
}

func TestShellCommands(t *testing.T) {
	g, _ := testGuest(t)
	for _, tc := range []struct {
		line   string
		out    string
		status int
	}{
		{"mkdir -p /var/lib/vmchaos/ledger && touch /var/lib/vmchaos/ledger/m1 && ls -1 /var/lib/vmchaos/ledger", "m1\n", 0},
		{"ls /var/lib/vmchaos", "ledger\n", 0},
		{"ls /var/lib/vmchaos/ledger/m1", "/var/lib/vmchaos/ledger/m1\n", 0},
		{"ls /nope", "", 2},
		{"echo 'a b'   \"c\" > /run/f && cat /run/f", "a b c\n", 0},
		{`echo a\ b`, "a b\n", 0},
		{"echo -n x", "x", 0},
		{"cat /run/f /nope", "a b c\n", 1},
		{"false || echo recovered", "recovered\n", 0},
		{"true && false; echo after", "after\n", 0},
		{"false && echo skipped", "", 1},
		{"rm /run/f && cat /run/f", "", 1},
		{"rm -f /run/f", "", 0},
		{"rm /var/lib/vmchaos", "", 1},
		{"rm -r /var/lib/vmchaos && ls /var/lib", "", 0},
		{"mkdir /root/d && mkdir /root/d", "", 1},
		{"mkdir -p /root/d", "", 0},
		{"touch /no/such/dir/f", "", 1},
		{"touch /root/d/f && mkdir -p /root/d/f/g", "", 1},
		{"echo x > /no/dir/f", "", 2},
		{"sha256sum /etc/hostname", "", 0},
		{"hostname", "unit\n", 0},
		{"cat /proc/sys/kernel/random/boot_id", g.bootID + "\n", 0},
		{"touch /proc/sys/kernel/random/boot_id", "", 1},
		{"dhclient -r", "", 0},
		{"dhclient eth0", "", 1},
		{"ls -l", "", 2},
		{"ls | wc -l", "", 2},
		{"echo unterminated 'quote", "", 2},
		{"&& true", "", 2},
		{"true &&", "", 2},
		{"sleep 0", "", 0},
		{"sleep x", "", 1},
		{"reboot", "", 127},
		{"", "", 0},
	} {
		out, errOut, st := sh(g, tc.line)
		if st != tc.status || (tc.out != "" && out != tc.out) {
			t.Errorf("%q: status %d out %q err %q; want %d %q", tc.line, st, out, errOut, tc.status, tc.out)
		}
	}
	if !g.dhcp {
		t.Error("dhclient -r did not mark the lease released")
	}
}

// TestSyncSemantics: disk writes live in the page cache until sync; the
// image file changes only then; RAM paths never reach it.
func TestSyncSemantics(t *testing.T) {
	g, p := testGuest(t)
	sh(g, "mkdir -p /var/lib/x && echo one > /var/lib/x/f && touch /run/ram /tmp/t /dev/shm/s")
	img, _ := guestimg.Load(p)
	if _, ok := img.Files["/var/lib/x/f"]; ok {
		t.Fatal("unsynced write reached the image file")
	}
	if _, _, st := sh(g, "sync"); st != 0 {
		t.Fatal("sync failed")
	}
	img, _ = guestimg.Load(p)
	if string(img.Files["/var/lib/x/f"]) != "one\n" || !contains(img.Dirs, "/var/lib/x") {
		t.Fatalf("synced image: files %v dirs %v", keys(img.Files), img.Dirs)
	}
	for _, ram := range []string{"/run/ram", "/tmp/t", "/dev/shm/s"} {
		if _, ok := img.Files[ram]; ok {
			t.Fatalf("RAM file %s reached the disk", ram)
		}
	}
	// A capture carries only what differs from the synced image.
	sh(g, "rm /var/lib/x/f && touch /var/lib/y && mkdir /var/lib/z")
	m := g.capture()
	if len(m.Dirty.Written) != 1 || m.Dirty.Written["/var/lib/y"] == nil || len(m.Dirty.Deleted) != 1 || !contains(m.Dirty.DirsAdded, "/var/lib/z") {
		t.Fatalf("dirty diff %+v", m.Dirty)
	}
	if m.RAM.Files["/run/ram"] == nil || m.BootID != g.bootID {
		t.Fatalf("RAM capture %+v", m.RAM)
	}
	// Restoring applies the diff over the synced disk.
	img, _ = guestimg.Load(p)
	r := restoreGuest(p, img, m)
	r.setRunning(true)
	if out, _, _ := sh(r, "ls /var/lib; ls /var/lib/x; cat /proc/sys/kernel/random/boot_id"); out != "x\ny\nz\n"+g.bootID+"\n" {
		t.Fatalf("restored view %q", out)
	}
}

func TestPausedGuestBlocksCommandsAndBootCountdownFreezes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "disk.img")
	img, _ := guestimg.Build(p, guestimg.Options{})
	g := newGuest(p, img, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := g.wait(ctx); err == nil {
		t.Fatal("a guest that never ran answered")
	}
	g.setRunning(true)
	g.setRunning(false)
	if rem := g.remainingBoot(); rem < 59*time.Minute {
		t.Fatalf("boot countdown ran while paused: %v left", rem)
	}
	g.kill()
	if err := g.wait(context.Background()); err != errGuestGone {
		t.Fatalf("wait on a dead guest: %v", err)
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// FuzzGuestShell: any command line a client sends over SSH exec gives an exit
// status, never a panic.
func FuzzGuestShell(f *testing.F) {
	for _, s := range []string{
		"mkdir -p /var/lib/vmchaos/ledger/x && touch /var/lib/vmchaos/ledger/x/m && sync",
		"ls -1 /var/lib/vmchaos/ledger; cat /proc/sys/kernel/random/boot_id",
		"echo 'q w' \"e\\\"r\" > /run/a >> /run/b",
		"rm -rf / ; ls /",
		"a && || b",
		"sleep 0.001 && dhclient -r",
	} {
		f.Add(s)
	}
	g, _ := testGuest(f)
	f.Fuzz(func(t *testing.T, line string) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		var o, e bytes.Buffer
		if st := g.run(ctx, line, &o, &e); st < 0 || st > 255 {
			t.Fatalf("status %d", st)
		}
	})
}

// TestNoCommandRunsWhilePaused: a command that got past the gate just before
// a pause must not run until the resume (else an acked write could miss the
// snapshot taken while paused).
func TestNoCommandRunsWhilePaused(t *testing.T) {
	g, _ := testGuest(t)
	g.mu.Lock() // a pause in progress holds g.mu while it flips the gate
	done := make(chan int, 1)
	go func() {
		_, _, st := sh(g, "touch /run/late")
		done <- st
	}()
	time.Sleep(20 * time.Millisecond) // let the command pass wait() and queue on g.mu
	g.gateMu.Lock()
	g.bootRemaining = max(0, time.Until(g.readyAt))
	g.running = false
	g.signal()
	g.gateMu.Unlock()
	g.mu.Unlock()
	time.Sleep(50 * time.Millisecond)
	g.mu.Lock()
	_, ran := g.ram.Files["/run/late"]
	g.mu.Unlock()
	if ran {
		t.Fatal("a command ran while the guest was paused")
	}
	g.setRunning(true)
	if st := <-done; st != 0 {
		t.Fatalf("command after resume: status %d", st)
	}
	if _, ok := g.ram.Files["/run/late"]; !ok {
		t.Fatal("command did not run after resume")
	}
}
