package vmctl

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func newTestManager(t testing.TB) *Manager {
	t.Helper()
	d, err := os.MkdirTemp("", "vm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	m, err := New(Config{RootDir: d, CHBinary: "/nonexistent/cloud-hypervisor", NetPool: "127.99.0.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestTornIndexIsAnErrorNeverEmpty: every way an index file can be torn or
// corrupt gives ErrCorruptIndex naming the recovery file; none panics and
// none reads as an empty store; a write verb refuses to commit over it.
func TestTornIndexIsAnErrorNeverEmpty(t *testing.T) {
	m := newTestManager(t)
	ctx := context.Background()
	for _, name := range []string{"one", "two"} {
		if err := m.updateVMs(ctx, "", func(ix *vmIndex) error {
			id := newID()
			ix.VMs[id] = &VM{ID: id, Name: name, State: StateStopped}
			ix.Names[name] = id
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	good, err := os.ReadFile(m.vmIndexPath())
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"empty":     nil,
		"truncated": good[:len(good)/2],
		"garbage":   []byte("\x00\x00\x00\x00"),
		"null":      []byte("null"),
		"object":    []byte("{}"),
		"wrongtype": []byte(`{"version":1,"vms":[1,2]}`),
		"badrecord": []byte(`{"version":1,"vms":{"X":null}}`),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(m.vmIndexPath(), b, 0o644); err != nil {
				t.Fatal(err)
			}
			vs, err := m.List(ctx)
			if !errors.Is(err, ErrCorruptIndex) || vs != nil {
				t.Fatalf("List = %v, %v; want ErrCorruptIndex", vs, err)
			}
			if !strings.Contains(err.Error(), m.vmIndexPath()+".prev") {
				t.Fatalf("error does not name the recovery file: %v", err)
			}
			if _, err := m.Create(ctx, CreateOptions{Name: "three", Image: m.vmIndexPath()}); !errors.Is(err, ErrCorruptIndex) {
				t.Fatalf("Create over a corrupt index: %v", err)
			}
			if after, _ := os.ReadFile(m.vmIndexPath()); !bytes.Equal(after, b) {
				t.Fatal("a write verb replaced the corrupt index")
			}
		})
	}
	// Documented recovery: the previous generation (one record) is intact.
	prev, err := os.ReadFile(m.vmIndexPath() + ".prev")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.vmIndexPath(), prev, 0o644); err != nil {
		t.Fatal(err)
	}
	vs, err := m.List(ctx)
	if err != nil || len(vs) != 1 || vs[0].Name != "one" {
		t.Fatalf("recovered from .prev: %v %v", vs, err)
	}
}

// TestTornIndexCLI: the binary prints a clear error and exits 1 (no panic,
// no empty list).
func TestTornIndexCLI(t *testing.T) {
	s := newStack(t, "0.02")
	s.ok("vm", "create", "--name", "a", s.image)
	s.ok("snapshot", "list")
	for _, f := range []string{"vms.json", "snapshots.json"} {
		p := filepath.Join(s.root, f)
		b, _ := os.ReadFile(p)
		if err := os.WriteFile(p, b[:len(b)/3], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"vm", "list", "-o", "json"}, {"snapshot", "list", "-o", "json"}, {"vm", "status", "-n", "0"}} {
		r := s.fails("corrupt index", args...)
		if r.stdout != "" || strings.Contains(r.stderr, "goroutine") {
			t.Fatalf("%v: %s", args, r)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"512": 512 << 20, "512M": 512 << 20, "1G": 1 << 30, "1GiB": 1 << 30, "64k": 64 << 10, "2T": 2 << 40, "0": 0} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "G", "1X", "99999999999999T", "1.5G"} {
		if _, err := ParseSize(in); !errors.Is(err, ErrUsage) {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}

func TestNetPoolAllocatesUniqueAddressesInPool(t *testing.T) {
	p, err := parseNetPool("127.99.3.0/29")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for i := 0; i < 6; i++ {
		ips, err := p.allocate("/root", 1, 0, used)
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		if used[ips[0]] || !strings.HasPrefix(ips[0], "127.99.3.") || ips[0] == "127.99.3.0" || ips[0] == "127.99.3.7" {
			t.Fatalf("bad address %s (used %v)", ips[0], used)
		}
		used[ips[0]] = true
	}
	if _, err := p.allocate("/root", 1, 0, used); err == nil {
		t.Fatal("exhausted pool allocated")
	}
	for _, bad := range []string{"10.0.0.0", "::1/64", "127.0.0.0/31", "x"} {
		if _, err := parseNetPool(bad); err == nil {
			t.Errorf("parseNetPool(%q) accepted", bad)
		}
	}
	if p2, _ := parseNetPool("10.1.0.0/16"); p2.loopback() {
		t.Error("10.1.0.0/16 is not loopback")
	}
}

// TestLocksExcludeAcrossDescriptors: flocks belong to open file
// descriptions, so two opens in one process exclude each other exactly as
// two processes do; shared holders coexist; closing releases.
func TestLocksExcludeAcrossDescriptors(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "x.lock")
	l1, err := lockFile(ctx, p, exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockFile(ctx, p, shared, false); !errors.Is(err, ErrLocked) {
		t.Fatalf("shared while exclusive held: %v", err)
	}
	l1.Unlock()
	s1, err := lockFile(ctx, p, shared, false)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := lockFile(ctx, p, shared, false)
	if err != nil {
		t.Fatalf("two shared holders: %v", err)
	}
	if _, err := lockFile(ctx, p, exclusive, false); !errors.Is(err, ErrLocked) {
		t.Fatalf("exclusive while shared held: %v", err)
	}
	s1.Unlock()
	s2.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	l2, _ := lockFile(ctx, p, exclusive, false)
	cancel()
	if _, err := lockFile(cctx, p, exclusive, true); err == nil {
		t.Fatal("blocking lock ignored its cancelled context")
	}
	l2.Unlock()
	if _, err := os.Stat(p); err != nil {
		t.Fatal("lock file must never be unlinked")
	}
}

func TestRewriteConfigPointsDiskAtCloneAndDropsNICs(t *testing.T) {
	in := []byte(`{"cpus":{"boot_vcpus":2},"disks":[{"path":"/old/disk.img","id":"_disk0"}],"net":[{"ip":"127.1.1.1"}],"extra":{"k":1}}`)
	out, hasSeed, err := rewriteConfig(in, "/new/disk.img", "/new/cidata.img")
	if err != nil || hasSeed {
		t.Fatalf("seed %v, err %v", hasSeed, err)
	}
	s := string(out)
	if !strings.Contains(s, `"path":"/new/disk.img"`) || strings.Contains(s, "127.1.1.1") || !strings.Contains(s, `"extra":{"k":1}`) || !strings.Contains(s, `"_disk0"`) {
		t.Fatalf("rewritten: %s", s)
	}
	for _, bad := range []string{`{}`, `{"disks":[]}`, `{"disks":[1]}`, `x`} {
		if _, _, err := rewriteConfig([]byte(bad), "/d", "/s"); err == nil {
			t.Errorf("rewriteConfig(%s) accepted", bad)
		}
	}
}

// TestRewriteConfigPointsSeedAtClone: a tap-mode snapshot's second disk is
// the source VM's cloud-init seed; the clone gets its own, other disks stay.
func TestRewriteConfigPointsSeedAtClone(t *testing.T) {
	in := []byte(`{"disks":[{"path":"/vms/A/disk.img"},{"path":"/vms/A/cidata.img","readonly":true},{"path":"/data/other.img"}]}`)
	out, hasSeed, err := rewriteConfig(in, "/vms/B/disk.img", "/vms/B/cidata.img")
	if err != nil || !hasSeed {
		t.Fatalf("seed %v, err %v", hasSeed, err)
	}
	want := `{"disks":[{"path":"/vms/B/disk.img"},{"path":"/vms/B/cidata.img","readonly":true},{"path":"/data/other.img"}]}`
	if string(out) != want {
		t.Fatalf("rewritten:\n got %s\nwant %s", out, want)
	}
}

func FuzzDecodeVMIndex(f *testing.F) {
	f.Add([]byte(`{"version":1,"generation":3,"vms":{"A":{"id":"A","name":"a"}},"names":{"a":"A"},"tombstones":{}}`))
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`null`))
	f.Add([]byte(``))
	f.Add([]byte(`{"version":1,"vms":{"A":null}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ix, err := decodeVMIndex("vms.json", b)
		if err != nil {
			return
		}
		if ix.VMs == nil || ix.Names == nil || ix.Tombstones == nil || ix.Version != indexVersion {
			t.Fatalf("decoded index has nil maps or a wrong version: %+v", ix)
		}
		for id, v := range ix.VMs {
			if v == nil || v.ID != id {
				t.Fatalf("malformed record %q accepted", id)
			}
		}
	})
}

func FuzzDecodeSnapIndex(f *testing.F) {
	f.Add([]byte(`{"version":1,"snapshots":{"S":{"id":"S","name":"s","state":"pending"}},"names":{"s":"S"}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ix, err := decodeSnapIndex("snapshots.json", b)
		if err != nil {
			return
		}
		if ix.Snapshots == nil || ix.Names == nil || ix.Tombstones == nil {
			t.Fatal("nil maps")
		}
	})
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"512", "1G", "64KiB", "", "-1", "9223372036854775807T"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err == nil && n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
	})
}

func tarOf(t testing.TB, files map[string]string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	return buf.Bytes()
}

// FuzzReadArchive: an imported archive is outside input; whatever it holds,
// readArchive writes only the known names inside its dir and never panics.
func FuzzReadArchive(f *testing.F) {
	f.Add(tarOf(f, map[string]string{"vmctl.json": `{"name":"x"}`, "config.json": "{}", "state.json": "{}", "disk.img": "d"}))
	f.Add(tarOf(f, map[string]string{"../escape": "x"}))
	f.Add(tarOf(f, map[string]string{"vmctl.json": "not json", "config.json": "{}", "state.json": "{}", "disk.img": "d"}))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d := t.TempDir()
		_ = readArchive(bytes.NewReader(b), filepath.Join(d))
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			known := false
			for _, n := range snapFiles {
				known = known || e.Name() == n
			}
			if !known || e.IsDir() {
				t.Fatalf("archive wrote %q", e.Name())
			}
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(d), "escape")); err == nil {
			t.Fatal("archive escaped its dir")
		}
	})
}
