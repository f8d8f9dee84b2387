package lazyfs

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// ref is the reference model the fuzz target holds Tree to: files only, in
// two fixed durable dirs ("" = root, "d"), kept by path. A namespace change
// is a record of the dirs it touches and the paths it sets or clears; a
// dir's fsync commits the changes that touch it and, transitively, the
// earlier ones that touch a dir those touch; a power cut keeps the durable
// namespace and each file's last fsynced bytes.
type ref struct {
	live, durable map[string]int // path → file id
	data, synced  map[int][]byte
	log           []refOp
	next          int
}

type refOp struct {
	dirs  []string
	set   map[string]int // path → id (create, rename target)
	clear []string       // paths removed (unlink, rename source)
}

func newRef() *ref {
	return &ref{live: map[string]int{}, durable: map[string]int{}, data: map[int][]byte{}, synced: map[int][]byte{}}
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}

func (r *ref) fsyncDir(dir string) {
	touched := map[string]bool{dir: true}
	commit := make([]bool, len(r.log))
	for i := len(r.log) - 1; i >= 0; i-- {
		if slices.ContainsFunc(r.log[i].dirs, func(d string) bool { return touched[d] }) {
			commit[i] = true
			for _, d := range r.log[i].dirs {
				touched[d] = true
			}
		}
	}
	var keep []refOp
	for i, o := range r.log {
		if !commit[i] {
			keep = append(keep, o)
			continue
		}
		for _, p := range o.clear {
			delete(r.durable, p)
		}
		for p, id := range o.set {
			r.durable[p] = id
		}
	}
	r.log = keep
}

func (r *ref) powerCut() {
	r.live = maps.Clone(r.durable)
	r.log = nil
	for id := range r.data {
		r.data[id] = bytes.Clone(r.synced[id])
	}
}

// the fuzz target's world: names a, b, c in the root and in d
var fuzzPaths = []string{"a", "b", "c", "d/a", "d/b", "d/c"}

// treeState is the live namespace of t as path → contents.
func treeState(t *Tree, d Ino) map[string]string {
	out := map[string]string{}
	for _, dir := range []struct {
		prefix string
		ino    Ino
	}{{"", RootIno}, {"d/", d}} {
		es, err := t.ReadDir(dir.ino)
		if err != nil {
			panic(err)
		}
		for _, e := range es {
			if e.Attr.Kind == KindDir {
				continue
			}
			b, _ := t.Read(e.Attr.Ino, 0, 1<<20)
			out[dir.prefix+e.Name] = string(b)
		}
	}
	return out
}

func (r *ref) state() map[string]string {
	out := map[string]string{}
	for p, id := range r.live {
		out[p] = string(r.data[id])
	}
	return out
}

// FuzzTreeAgainstReference drives Tree and the reference with the same
// operations (create, write, truncate, fsync of a file or a dir, rename,
// unlink, link, power cut) and requires the same errors and the same visible
// tree after every step.
func FuzzTreeAgainstReference(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 'x', 3, 0, 4, 0, 7})
	f.Add([]byte{0, 1, 1, 1, 'y', 3, 1, 5, 1, 4, 6, 0, 7})
	f.Add([]byte{0, 0, 4, 0, 5, 0, 3, 3, 1, 0, 'z', 4, 1, 7, 6, 0, 7})
	f.Fuzz(func(t *testing.T, prog []byte) {
		tr, d := NewTree(), Ino(0)
		a, err := tr.Create(RootIno, "d", KindDir, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		d = a.Ino
		_ = tr.Fsync(RootIno)
		r := newRef()
		dirIno := map[string]Ino{"": RootIno, "d": d}
		split := func(p string) (Ino, string) {
			i := strings.LastIndexByte(p, '/')
			return dirIno[dirOf(p)], p[i+1:]
		}
		lookup := func(p string) (Ino, error) {
			dir, name := split(p)
			a, err := tr.Lookup(dir, name)
			return a.Ino, err
		}
		arg := func(i *int) byte {
			if *i >= len(prog) {
				return 0
			}
			b := prog[*i]
			*i++
			return b
		}
		for i, step := 0, 0; i < len(prog) && step < 200; step++ {
			code := arg(&i) % 9
			p := fuzzPaths[int(arg(&i))%len(fuzzPaths)]
			var got, want error
			what := ""
			switch code {
			case 0: // create
				what = "create " + p
				dir, name := split(p)
				_, got = tr.Create(dir, name, KindFile, 0o644)
				if _, ok := r.live[p]; ok {
					want = syscall.EEXIST
				} else {
					r.next++
					r.live[p] = r.next
					r.data[r.next], r.synced[r.next] = nil, nil
					r.log = append(r.log, refOp{dirs: []string{dirOf(p)}, set: map[string]int{p: r.next}})
				}
			case 1, 2: // write one byte at a small offset / truncate
				b, off := arg(&i), int64(arg(&i)%8)
				ino, err := lookup(p)
				id, ok := r.live[p]
				if !ok {
					what, got, want = "open "+p, err, syscall.ENOENT
					break
				}
				if code == 1 {
					what = fmt.Sprintf("write %s@%d", p, off)
					_, got = tr.Write(ino, off, []byte{b})
					buf := r.data[id]
					for int64(len(buf)) < off+1 {
						buf = append(buf, 0)
					}
					buf[off] = b
					r.data[id] = buf
				} else {
					what = fmt.Sprintf("truncate %s %d", p, off)
					got = tr.Truncate(ino, off)
					buf := r.data[id]
					for int64(len(buf)) < off {
						buf = append(buf, 0)
					}
					r.data[id] = buf[:off:off]
				}
			case 3: // fsync file
				what = "fsync " + p
				ino, err := lookup(p)
				id, ok := r.live[p]
				if !ok {
					got, want = err, syscall.ENOENT
					break
				}
				got = tr.Fsync(ino)
				r.synced[id] = bytes.Clone(r.data[id])
			case 4: // fsync the dir of p
				what = "fsync dir of " + p
				got = tr.Fsync(dirIno[dirOf(p)])
				r.fsyncDir(dirOf(p))
			case 5: // rename p → q
				q := fuzzPaths[int(arg(&i))%len(fuzzPaths)]
				what = "rename " + p + " " + q
				sd, sn := split(p)
				dd, dn := split(q)
				got = tr.Rename(sd, sn, dd, dn)
				id, ok := r.live[p]
				switch {
				case !ok:
					want = syscall.ENOENT
				case p == q || r.live[q] == id:
				default:
					delete(r.live, p)
					r.live[q] = id
					r.log = append(r.log, refOp{dirs: []string{dirOf(p), dirOf(q)}, set: map[string]int{q: id}, clear: []string{p}})
				}
			case 6: // unlink
				what = "unlink " + p
				dir, name := split(p)
				got = tr.Remove(dir, name, false)
				if _, ok := r.live[p]; !ok {
					want = syscall.ENOENT
				} else {
					delete(r.live, p)
					r.log = append(r.log, refOp{dirs: []string{dirOf(p)}, clear: []string{p}})
				}
			case 8: // link p → q
				q := fuzzPaths[int(arg(&i))%len(fuzzPaths)]
				what = "link " + p + " " + q
				dd, dn := split(q)
				ino, err := lookup(p)
				id, ok := r.live[p]
				switch _, exists := r.live[q]; {
				case !ok:
					got, want = err, syscall.ENOENT
				case exists:
					_, got = tr.Link(ino, dd, dn)
					want = syscall.EEXIST
				default:
					_, got = tr.Link(ino, dd, dn)
					r.live[q] = id
					r.log = append(r.log, refOp{dirs: []string{dirOf(q)}, set: map[string]int{q: id}})
				}
			case 7:
				what = "power cut"
				tr.PowerCut()
				r.powerCut()
			}
			if !errors.Is(got, want) && !(got == nil && want == nil) {
				t.Fatalf("step %d %s: tree error %v, reference %v", step, what, got, want)
			}
			if g, w := treeState(tr, d), r.state(); !maps.Equal(g, w) {
				t.Fatalf("step %d %s:\ntree      %q\nreference %q", step, what, g, w)
			}
		}
	})
}
