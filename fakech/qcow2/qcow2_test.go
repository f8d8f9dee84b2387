package qcow2

import (
	"bytes"
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/internal/needs"
)

func qemuImg(t *testing.T) string {
	t.Helper()
	return needs.Binary(t, "", "qemu-img", "install qemu-utils (Debian; scripts/setup.sh installs it)")
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func sum(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestCreateWriteReadThroughChain: our own base and overlay; writes go to
// the overlay only, reads see base data where the overlay has none.
func TestCreateWriteReadThroughChain(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	if err := Create(base, 8<<20, "", ""); err != nil {
		t.Fatal(err)
	}
	b, err := Open(base, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteAt([]byte("base-data"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteAt([]byte("far"), 5<<20); err != nil {
		t.Fatal(err)
	}
	b.Close()
	before := sum(t, base)
	top := filepath.Join(dir, "top.qcow2")
	if err := Create(top, 8<<20, "base.qcow2", "qcow2"); err != nil {
		t.Fatal(err)
	}
	o, err := Open(top, true)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := o.WriteAt([]byte("TOP"), 2); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 9)
	if _, err := o.ReadAt(got, 0); err != nil || string(got) != "baTOPdata" {
		t.Fatalf("read through the chain: %q %v", got, err)
	}
	far := make([]byte, 3)
	if _, err := o.ReadAt(far, 5<<20); err != nil || string(far) != "far" {
		t.Fatalf("unwritten overlay cluster from the base: %q %v", far, err)
	}
	if end, err := o.AllocatedEnd(); err != nil || end != 5<<20+1<<16 {
		t.Fatalf("allocated end %d %v", end, err)
	}
	if sum(t, base) != before {
		t.Fatal("a write to the overlay changed the base")
	}
}

// TestQemuImgOverlayIsReadAndWrittenLikeQemu: a base made by qemu-img convert
// from raw bytes and an overlay made by qemu-img create -b: we read the chain
// as qemu does, our writes land in the overlay, qemu-img check stays clean and
// qemu-img convert of the overlay sees exactly what we read.
func TestQemuImgOverlayIsReadAndWrittenLikeQemu(t *testing.T) {
	qi := qemuImg(t)
	dir := t.TempDir()
	raw := filepath.Join(dir, "base.raw")
	content := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320000 bytes: spans clusters
	if err := os.WriteFile(raw, append(content, make([]byte, 4<<20-len(content))...), 0o644); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "base.qcow2")
	run(t, qi, "convert", "-f", "raw", "-O", "qcow2", raw, base)
	top := filepath.Join(dir, "top.qcow2")
	run(t, qi, "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", top)
	before := sum(t, base)

	o, err := Open(top, true)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(content))
	if _, err := o.ReadAt(got, 0); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("read of a qemu-img overlay differs from its base (%v)", err)
	}
	if end, err := o.AllocatedEnd(); err != nil || end < int64(len(content)) {
		t.Fatalf("allocated end %d %v, want >= %d", end, err, len(content))
	}
	patch := []byte(strings.Repeat("W", 70000)) // crosses a 64 KiB cluster boundary
	if _, err := o.WriteAt(patch, 60000); err != nil {
		t.Fatal(err)
	}
	if _, err := o.WriteAt([]byte("tail"), 3<<20); err != nil {
		t.Fatal(err)
	}
	if err := o.Sync(); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 4<<20)
	if _, err := o.ReadAt(want, 0); err != nil {
		t.Fatal(err)
	}
	o.Close()
	if sum(t, base) != before {
		t.Fatal("writing the overlay changed the base")
	}
	if out := run(t, qi, "check", top); !strings.Contains(out, "No errors were found") {
		t.Fatalf("qemu-img check of our writes:\n%s", out)
	}
	flat := filepath.Join(dir, "flat.raw")
	run(t, qi, "convert", "-O", "raw", top, flat)
	b, err := os.ReadFile(flat)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want) || !bytes.Equal(b[60000:130000], patch) || string(b[3<<20:3<<20+4]) != "tail" {
		t.Fatal("qemu-img reads the overlay differently from us")
	}
}

// TestQemuImgAcceptsOurImages: qemu-img check and info accept what Create
// writes, with its backing file.
func TestQemuImgAcceptsOurImages(t *testing.T) {
	qi := qemuImg(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "b.qcow2")
	if err := Create(base, 16<<20, "", ""); err != nil {
		t.Fatal(err)
	}
	top := filepath.Join(dir, "t.qcow2")
	if err := Create(top, 16<<20, "b.qcow2", "qcow2"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{base, top} {
		if out := run(t, qi, "check", p); !strings.Contains(out, "No errors were found") {
			t.Fatalf("qemu-img check %s:\n%s", p, out)
		}
	}
	if out := run(t, qi, "info", top); !strings.Contains(out, "backing file: b.qcow2") || !strings.Contains(out, "file format: qcow2") {
		t.Fatalf("qemu-img info:\n%s", out)
	}
}

func TestRefusesWhatItDoesNotSupport(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x")
	if err := os.WriteFile(p, []byte("not qcow2 at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(p, false); err == nil || !strings.Contains(err.Error(), ErrNotQcow2.Error()) {
		t.Fatalf("open of a non-qcow2 file: %v", err)
	}
	q := filepath.Join(dir, "q")
	if err := Create(q, 1<<20, "", ""); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(q)
	b[75] |= 2 // incompatible feature "corrupt"
	if err := os.WriteFile(q, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(q, false); err == nil || !strings.Contains(err.Error(), "incompatible features") {
		t.Fatalf("open of a corrupt-flagged image: %v", err)
	}
}

// FuzzOpen: arbitrary bytes as an image never panic, and reads stay inside
// the disk.
func FuzzOpen(f *testing.F) {
	dir := f.TempDir()
	seed := filepath.Join(dir, "seed.qcow2")
	if err := Create(seed, 1<<20, "", ""); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(seed)
	f.Add(b[:4096])
	f.Add([]byte("QFI\xfb"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "f.qcow2")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		im, err := Open(p, false)
		if err != nil {
			return
		}
		defer im.Close()
		if end, err := im.AllocatedEnd(); err == nil && end > im.Size() {
			t.Fatalf("allocated end %d beyond size %d", end, im.Size())
		}
		buf := make([]byte, min(im.Size(), 4096))
		_, _ = im.ReadAt(buf, 0)
	})
}
