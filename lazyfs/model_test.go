package lazyfs

import (
	"errors"
	"syscall"
	"testing"
)

// fixture builds a tree with a durable dir "d" under the root.
func fixture(t *testing.T) (*Tree, Ino) {
	t.Helper()
	tr := NewTree()
	d, err := tr.Create(RootIno, "d", KindDir, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Fsync(RootIno); err != nil {
		t.Fatal(err)
	}
	return tr, d.Ino
}

// must unwraps a model call that the test expects to succeed; a failure
// panics, which fails the test with the call's stack.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// content is the contents of dir/name after everything so far, or "<absent>".
func content(t *testing.T, tr *Tree, dir Ino, name string) string {
	t.Helper()
	a, err := tr.Lookup(dir, name)
	if errors.Is(err, syscall.ENOENT) {
		return "<absent>"
	}
	ok(t, err)
	return string(must(tr.Read(a.Ino, 0, 1<<20)))
}

func TestPowerCutModel(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, tr *Tree, d Ino)
		want map[string]string // name in d → contents after the cut
	}{
		{"create without dir fsync is lost", func(t *testing.T, tr *Tree, d Ino) {
			f := must(tr.Create(d, "f", KindFile, 0o644))
			must(tr.Write(f.Ino, 0, []byte("x")))
			ok(t, tr.Fsync(f.Ino))
		}, map[string]string{"f": "<absent>"}},
		{"write without fsync is lost, the durable entry stays (empty)", func(t *testing.T, tr *Tree, d Ino) {
			f := must(tr.Create(d, "f", KindFile, 0o644))
			ok(t, tr.Fsync(d))
			must(tr.Write(f.Ino, 0, []byte("data")))
		}, map[string]string{"f": ""}},
		{"fsync of file and dir keeps it", func(t *testing.T, tr *Tree, d Ino) {
			f := must(tr.Create(d, "f", KindFile, 0o644))
			must(tr.Write(f.Ino, 0, []byte("data")))
			ok(t, tr.Fsync(f.Ino))
			ok(t, tr.Fsync(d))
		}, map[string]string{"f": "data"}},
		{"write after fsync reverts to the fsynced contents", func(t *testing.T, tr *Tree, d Ino) {
			f := must(tr.Create(d, "f", KindFile, 0o644))
			must(tr.Write(f.Ino, 0, []byte("v1")))
			ok(t, tr.Fsync(f.Ino))
			ok(t, tr.Fsync(d))
			must(tr.Write(f.Ino, 0, []byte("V2-longer")))
		}, map[string]string{"f": "v1"}},
		{"truncate without fsync is lost", func(t *testing.T, tr *Tree, d Ino) {
			f := must(tr.Create(d, "f", KindFile, 0o644))
			must(tr.Write(f.Ino, 0, []byte("keep")))
			ok(t, tr.Fsync(f.Ino))
			ok(t, tr.Fsync(d))
			ok(t, tr.Truncate(f.Ino, 0))
		}, map[string]string{"f": "keep"}},
		{"rename without dir fsync is lost", func(t *testing.T, tr *Tree, d Ino) {
			old := must(tr.Create(d, "index", KindFile, 0o644))
			must(tr.Write(old.Ino, 0, []byte("old")))
			ok(t, tr.Fsync(old.Ino))
			ok(t, tr.Fsync(d))
			tmp := must(tr.Create(d, "index.tmp", KindFile, 0o644))
			must(tr.Write(tmp.Ino, 0, []byte("new")))
			ok(t, tr.Fsync(tmp.Ino))
			ok(t, tr.Rename(d, "index.tmp", d, "index"))
		}, map[string]string{"index": "old", "index.tmp": "<absent>"}},
		{"durable write: temp, fsync, rename, dir fsync keeps the new contents", func(t *testing.T, tr *Tree, d Ino) {
			old := must(tr.Create(d, "index", KindFile, 0o644))
			must(tr.Write(old.Ino, 0, []byte("old")))
			ok(t, tr.Fsync(old.Ino))
			ok(t, tr.Fsync(d))
			tmp := must(tr.Create(d, "index.tmp", KindFile, 0o644))
			must(tr.Write(tmp.Ino, 0, []byte("new")))
			ok(t, tr.Fsync(tmp.Ino))
			ok(t, tr.Rename(d, "index.tmp", d, "index"))
			ok(t, tr.Fsync(d))
		}, map[string]string{"index": "new", "index.tmp": "<absent>"}},
		{"rename over with dir fsync but no file fsync: the new name holds an empty file", func(t *testing.T, tr *Tree, d Ino) {
			old := must(tr.Create(d, "index", KindFile, 0o644))
			must(tr.Write(old.Ino, 0, []byte("old")))
			ok(t, tr.Fsync(old.Ino))
			ok(t, tr.Fsync(d))
			tmp := must(tr.Create(d, "index.tmp", KindFile, 0o644))
			must(tr.Write(tmp.Ino, 0, []byte("new")))
			ok(t, tr.Rename(d, "index.tmp", d, "index"))
			ok(t, tr.Fsync(d))
		}, map[string]string{"index": ""}},
		{"unlink without dir fsync is undone", func(t *testing.T, tr *Tree, d Ino) {
			f := must(tr.Create(d, "f", KindFile, 0o644))
			must(tr.Write(f.Ino, 0, []byte("back")))
			ok(t, tr.Fsync(f.Ino))
			ok(t, tr.Fsync(d))
			ok(t, tr.Remove(d, "f", false))
		}, map[string]string{"f": "back"}},
		{"unlink with dir fsync is durable", func(t *testing.T, tr *Tree, d Ino) {
			must(tr.Create(d, "f", KindFile, 0o644))
			ok(t, tr.Fsync(d))
			ok(t, tr.Remove(d, "f", false))
			ok(t, tr.Fsync(d))
		}, map[string]string{"f": "<absent>"}},
		{"fsync of another dir does not make this dir's create durable", func(t *testing.T, tr *Tree, d Ino) {
			must(tr.Create(d, "f", KindFile, 0o644))
			must(tr.Create(RootIno, "g", KindFile, 0o644))
			ok(t, tr.Fsync(RootIno))
		}, map[string]string{"f": "<absent>"}},
		{"cross-dir rename is durable as a whole at the fsync of either dir (here: the source)", func(t *testing.T, tr *Tree, d Ino) {
			f := must(tr.Create(RootIno, "f", KindFile, 0o644))
			must(tr.Write(f.Ino, 0, []byte("moved")))
			ok(t, tr.Fsync(f.Ino))
			ok(t, tr.Fsync(RootIno))
			ok(t, tr.Rename(RootIno, "f", d, "f"))
			ok(t, tr.Fsync(RootIno))
		}, map[string]string{"f": "moved"}},
		{"a rename chain commits with the rename it leads to", func(t *testing.T, tr *Tree, d Ino) {
			e := must(tr.Create(RootIno, "e", KindDir, 0o755))
			ok(t, tr.Fsync(RootIno))
			f := must(tr.Create(e.Ino, "f", KindFile, 0o644))
			must(tr.Write(f.Ino, 0, []byte("x")))
			ok(t, tr.Fsync(f.Ino))
			ok(t, tr.Fsync(e.Ino))
			ok(t, tr.Rename(e.Ino, "f", RootIno, "f"))
			ok(t, tr.Rename(RootIno, "f", d, "f"))
			ok(t, tr.Fsync(d)) // pulls in e→root: f must not also stay in e
			if got := content(t, tr, e.Ino, "f"); got != "<absent>" {
				t.Fatalf("live e/f = %q", got)
			}
		}, map[string]string{"f": "x"}},
		{"a file in a directory whose own entry is not durable is lost", func(t *testing.T, tr *Tree, d Ino) {
			sub := must(tr.Create(d, "sub", KindDir, 0o755))
			f := must(tr.Create(sub.Ino, "f", KindFile, 0o644))
			ok(t, tr.Fsync(f.Ino))
			ok(t, tr.Fsync(sub.Ino))
		}, map[string]string{"sub": "<absent>"}},
		{"a hard link without dir fsync is lost, the first name stays", func(t *testing.T, tr *Tree, d Ino) {
			f := must(tr.Create(d, "index", KindFile, 0o644))
			must(tr.Write(f.Ino, 0, []byte("gen1")))
			ok(t, tr.Fsync(f.Ino))
			ok(t, tr.Fsync(d))
			a := must(tr.Link(f.Ino, d, "index.prev"))
			if a.Links != 2 {
				t.Fatalf("links = %d, want 2", a.Links)
			}
		}, map[string]string{"index": "gen1", "index.prev": "<absent>"}},
		{"a hard link with dir fsync names the same data", func(t *testing.T, tr *Tree, d Ino) {
			f := must(tr.Create(d, "index", KindFile, 0o644))
			must(tr.Write(f.Ino, 0, []byte("gen1")))
			ok(t, tr.Fsync(f.Ino))
			must(tr.Link(f.Ino, d, "index.prev"))
			ok(t, tr.Remove(d, "index", false))
			ok(t, tr.Fsync(d))
		}, map[string]string{"index": "<absent>", "index.prev": "gen1"}},
		{"sync(2) makes everything durable", func(t *testing.T, tr *Tree, d Ino) {
			f := must(tr.Create(d, "f", KindFile, 0o644))
			must(tr.Write(f.Ino, 0, []byte("all")))
			tr.Sync()
		}, map[string]string{"f": "all"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, d := fixture(t)
			tc.do(t, tr, d)
			tr.PowerCut()
			if tr.Pending() != 0 || len(tr.Unsynced()) != 0 {
				t.Fatalf("after the cut: %d pending, unsynced %v", tr.Pending(), tr.Unsynced())
			}
			for name, want := range tc.want {
				if name == "sub" {
					if _, err := tr.Lookup(d, "sub"); !errors.Is(err, syscall.ENOENT) {
						t.Errorf("sub: %v, want absent", err)
					}
					continue
				}
				if got := content(t, tr, d, name); got != want {
					t.Errorf("d/%s = %q, want %q", name, got, want)
				}
			}
		})
	}
}

func TestTreeRefusesWhatPOSIXRefuses(t *testing.T) {
	tr, d := fixture(t)
	f := must(tr.Create(d, "f", KindFile, 0o644))
	sub := must(tr.Create(d, "sub", KindDir, 0o755))
	must(tr.Create(sub.Ino, "x", KindFile, 0o644))
	for _, tc := range []struct {
		name string
		err  error
		want syscall.Errno
	}{
		{"create existing", func() error { _, err := tr.Create(d, "f", KindFile, 0o644); return err }(), syscall.EEXIST},
		{"bad name", func() error { _, err := tr.Create(d, "a/b", KindFile, 0o644); return err }(), syscall.EINVAL},
		{"rmdir non-empty", tr.Remove(d, "sub", true), syscall.ENOTEMPTY},
		{"rmdir a file", tr.Remove(d, "f", true), syscall.ENOTDIR},
		{"unlink a dir", tr.Remove(d, "sub", false), syscall.EISDIR},
		{"rename dir into itself", tr.Rename(d, "sub", sub.Ino, "loop"), syscall.EINVAL},
		{"rename file over non-empty dir", tr.Rename(d, "f", d, "sub"), syscall.EISDIR},
		{"write a dir", func() error { _, err := tr.Write(d, 0, []byte("x")); return err }(), syscall.EISDIR},
		{"lookup missing", func() error { _, err := tr.Lookup(d, "nope"); return err }(), syscall.ENOENT},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	_ = f
}
