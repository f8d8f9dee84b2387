package fakech_test

import (
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/internal/needs"
)

// TestQcow2OverlayGuestBootsAndWritesTheTop: a fake guest image converted to
// qcow2 by qemu-img, with an overlay from qemu-img create -b, boots with its
// files and SSH (reads go through the chain); a synced write lands in the
// overlay, the base never changes, qemu-img check stays clean, and the next
// boot of the overlay sees the write.
func TestQcow2OverlayGuestBootsAndWritesTheTop(t *testing.T) {
	qi := needs.Binary(t, "", "qemu-img", "install qemu-utils (Debian; scripts/setup.sh installs it)")
	dir := vmDir(t, "VMQCOW")
	g := newGuest(t, dir)
	base := filepath.Join(dir, "base.qcow2")
	top := filepath.Join(dir, "top.qcow2")
	for _, args := range [][]string{
		{"convert", "-f", "raw", "-O", "qcow2", g.path, base},
		// the overlay is larger than its (image-sized) base: room to write
		{"create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", top, "64M"},
	} {
		if out, err := exec.Command(qi, args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
		}
	}
	sum := func(p string) [32]byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return sha256.Sum256(b)
	}
	baseSum := sum(base)
	ip := loopbackIP()
	sock := filepath.Join(dir, "api.sock")
	p, _ := startReady(t, sock, baseEnv(), bootArgs(sock, top, ip)...)
	if out, _, st := g.sshRun(t, ip, "hostname"); st != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("guest on a qcow2 overlay: status %d %q", st, out)
	}
	if out, errOut, st := g.sshRun(t, ip, "mkdir -p /var/lib/q && touch /var/lib/q/in-overlay && sync"); st != 0 {
		t.Fatalf("guest write on the overlay: status %d %q %q", st, out, errOut)
	}
	p.kill9()
	if sum(base) != baseSum {
		t.Fatal("the guest's write changed the backing file")
	}
	if out, err := exec.Command(qi, "check", top).CombinedOutput(); err != nil || !strings.Contains(string(out), "No errors were found") {
		t.Fatalf("qemu-img check of the overlay after the guest's writes: %v\n%s", err, out)
	}
	sock2 := filepath.Join(dir, "api2.sock")
	startReady(t, sock2, baseEnv(), bootArgs(sock2, top, ip)...)
	if _, _, st := g.sshRun(t, ip, "ls /var/lib/q/in-overlay"); st != 0 {
		t.Fatal("the synced write is not in the overlay at the next boot")
	}
}

// TestFakeImageAsQcow2Boots: the image `vmchaos image fake --format qcow2`
// writes (guestimg.SaveQcow2) boots with its files, and a synced write
// reaches it.
func TestFakeImageAsQcow2Boots(t *testing.T) {
	dir := vmDir(t, "VMQIMG")
	g := newGuest(t, dir)
	q := filepath.Join(dir, "guest.qcow2")
	if err := g.img.SaveQcow2(q, 64<<20); err != nil {
		t.Fatal(err)
	}
	ip := loopbackIP()
	sock := filepath.Join(dir, "api.sock")
	p, _ := startReady(t, sock, baseEnv(), bootArgs(sock, q, ip)...)
	if _, _, st := g.sshRun(t, ip, "touch /var/lib/synced-q && sync"); st != 0 {
		t.Fatal("guest on a qcow2 image: write failed")
	}
	p.kill9()
	sock2 := filepath.Join(dir, "api2.sock")
	startReady(t, sock2, baseEnv(), bootArgs(sock2, q, ip)...)
	if _, _, st := g.sshRun(t, ip, "ls /var/lib/synced-q"); st != 0 {
		t.Fatal("synced write lost from the qcow2 image")
	}
}
