package lazyfs

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/durable"
)

// mounted serves a fresh tree at a temp dir, or skips with the reason FUSE
// is unavailable here.
func mounted(t *testing.T) *Mounted {
	t.Helper()
	if why := Available(); why != "" {
		t.Skip("missing host feature: " + why + ": run as root on a host with /dev/fuse (modprobe fuse)")
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := Mount(dir, NewTree())
	if err != nil {
		t.Fatal(err)
	}
	hostNS, _ := os.Readlink("/proc/1/ns/mnt")
	ownNS, _ := os.Readlink("/proc/self/ns/mnt")
	t.Logf("mounted in mount namespace %s (host's: %s)", ownNS, hostNS)
	cur := m
	t.Cleanup(func() { _ = cur.Unmount() })
	return m
}

func writeFile(t *testing.T, p, s string, fsync bool) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	if fsync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func syncDir(t *testing.T, d string) {
	t.Helper()
	if err := durable.SyncDir(d); err != nil {
		t.Fatal(err)
	}
}

func read(p string) string {
	b, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return "<absent>"
	}
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// TestPowerCutThroughTheMount runs the model's cases as a program would:
// open, write, fsync, rename, fsync of the directory, then the power cut
// (unmount, drop, mount again) and a read of what survived.
func TestPowerCutThroughTheMount(t *testing.T) {
	for _, tc := range []struct {
		name   string
		do     func(t *testing.T, d string)
		before map[string]string // as read before the cut
		want   map[string]string // as read after it
	}{
		{"write without fsync is lost", func(t *testing.T, d string) {
			writeFile(t, filepath.Join(d, "f"), "data", false)
			syncDir(t, d)
		}, map[string]string{"f": "data"}, map[string]string{"f": ""}},
		{"create without dir fsync is lost", func(t *testing.T, d string) {
			writeFile(t, filepath.Join(d, "f"), "data", true)
		}, map[string]string{"f": "data"}, map[string]string{"f": "<absent>"}},
		{"fsync of file and dir keeps it", func(t *testing.T, d string) {
			writeFile(t, filepath.Join(d, "f"), "data", true)
			syncDir(t, d)
		}, map[string]string{"f": "data"}, map[string]string{"f": "data"}},
		{"rename without dir fsync is lost", func(t *testing.T, d string) {
			writeFile(t, filepath.Join(d, "index"), "old", true)
			syncDir(t, d)
			writeFile(t, filepath.Join(d, "index.tmp"), "new", true)
			if err := os.Rename(filepath.Join(d, "index.tmp"), filepath.Join(d, "index")); err != nil {
				t.Fatal(err)
			}
		}, map[string]string{"index": "new", "index.tmp": "<absent>"}, map[string]string{"index": "old", "index.tmp": "<absent>"}},
		{"durable.WriteFile survives", func(t *testing.T, d string) {
			writeFile(t, filepath.Join(d, "index"), "old", true)
			syncDir(t, d)
			if err := durable.WriteFile(filepath.Join(d, "index"), []byte("new"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, map[string]string{"index": "new"}, map[string]string{"index": "new"}},
		{"temp, rename, dir fsync without the file's fsync leaves an empty file", func(t *testing.T, d string) {
			writeFile(t, filepath.Join(d, "index"), "old", true)
			syncDir(t, d)
			writeFile(t, filepath.Join(d, "index.tmp"), "new", false)
			if err := os.Rename(filepath.Join(d, "index.tmp"), filepath.Join(d, "index")); err != nil {
				t.Fatal(err)
			}
			syncDir(t, d)
		}, map[string]string{"index": "new"}, map[string]string{"index": ""}},
		{"fdatasync keeps the data", func(t *testing.T, d string) {
			p := filepath.Join(d, "f")
			writeFile(t, p, "", true)
			syncDir(t, d)
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteString("line\n"); err != nil {
				t.Fatal(err)
			}
			if err := unix.Fdatasync(int(f.Fd())); err != nil {
				t.Fatal(err)
			}
		}, map[string]string{"f": "line\n"}, map[string]string{"f": "line\n"}},
		{"mkdir without parent fsync loses the whole subtree", func(t *testing.T, d string) {
			sub := filepath.Join(d, "sub")
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(sub, "f"), "x", true)
			syncDir(t, sub)
		}, map[string]string{"sub/f": "x"}, map[string]string{"sub/f": "<absent>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mounted(t)
			d := filepath.Join(m.Dir, "d")
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
			syncDir(t, m.Dir)
			tc.do(t, d)
			// what is lost is lost to the cut: before it, every write reads back
			for name, want := range tc.before {
				if got := read(filepath.Join(d, name)); got != want {
					t.Fatalf("before the cut %s = %q, want %q", name, got, want)
				}
			}
			m2, err := m.PowerCut()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m2.Unmount() })
			for name, want := range tc.want {
				if got := read(filepath.Join(d, name)); got != want {
					t.Errorf("after the cut %s = %q, want %q", name, got, want)
				}
			}
		})
	}
}

// TestMountServesWhatTheStackNeeds: unix sockets bind and connect there,
// flock excludes across processes, symlinks and rename(2) over work.
func TestMountServesWhatTheStackNeeds(t *testing.T) {
	m := mounted(t)
	sock := filepath.Join(m.Dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("hello"))
			c.Close()
		}
	}()
	c, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(buf); err != nil || string(buf) != "hello" {
		t.Fatalf("socket on the mount: %q %v", buf, err)
	}
	c.Close()

	lock := filepath.Join(m.Dir, "vm.lock")
	f, err := os.OpenFile(lock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	// another process must find it held
	out, err := exec.Command("flock", "-n", lock, "true").CombinedOutput()
	if err == nil {
		t.Fatalf("flock -n on a held lock succeeded: %s", out)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("flock", "-n", lock, "true").CombinedOutput(); err != nil {
		t.Fatalf("flock -n on a free lock: %v %s", err, out)
	}

	if err := os.Symlink("vm.lock", filepath.Join(m.Dir, "ln")); err != nil {
		t.Fatal(err)
	}
	if tgt, err := os.Readlink(filepath.Join(m.Dir, "ln")); err != nil || tgt != "vm.lock" {
		t.Fatalf("readlink: %q %v", tgt, err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB, several FUSE writes
	if err := durable.WriteFile(filepath.Join(m.Dir, "disk.img"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(m.Dir, "disk.img")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	es, err := os.ReadDir(m.Dir)
	if err != nil || len(es) != 4 {
		t.Fatalf("readdir: %d entries, %v", len(es), err)
	}
}

// TestNothingReachesTheTreeAfterTheCut: a descriptor still open on the old
// mount (a process the cut missed, or a mount namespace that copied the
// mount) must not change what survived: its writes fail and the tree keeps
// the durable contents.
func TestNothingReachesTheTreeAfterTheCut(t *testing.T) {
	m := mounted(t)
	p := filepath.Join(m.Dir, "f")
	writeFile(t, p, "durable", true)
	syncDir(t, m.Dir)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m2, err := m.PowerCut() // our own descriptor keeps the old mount alive
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m2.Unmount() })
	if _, err := f.WriteAt([]byte("LATE!!!"), 0); err == nil {
		if err := f.Sync(); err == nil {
			t.Error("a write and fsync through the old mount succeeded after the cut")
		}
	}
	if got := read(p); got != "durable" {
		t.Errorf("after the cut f = %q, want %q", got, "durable")
	}
}
