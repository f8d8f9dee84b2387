// Package lazyfs is a filesystem that forgets, on a simulated power cut,
// every write a journaling filesystem (ext4, data=ordered) would not have to
// keep: file contents revert to what the last fsync/fdatasync of that file
// made durable, and directory entries to what the last fsync of their
// directory made durable. docs/lazyfs.md states the model; Tree is the model
// itself (in memory, no FUSE), Mount serves a Tree over FUSE.
package lazyfs

import (
	"fmt"
	"sort"
	"sync"
	"syscall"
	"time"
)

// Ino numbers a node of a Tree; RootIno is the root directory.
type Ino uint64

// RootIno is the root directory, durable from the start.
const RootIno Ino = 1

// Kinds of node.
const (
	KindFile    = syscall.S_IFREG
	KindDir     = syscall.S_IFDIR
	KindSymlink = syscall.S_IFLNK
	KindSocket  = syscall.S_IFSOCK
	KindFIFO    = syscall.S_IFIFO
)

type node struct {
	ino      Ino
	kind     uint32
	perm     uint32
	uid, gid uint32
	links    int       // live entries naming it
	mtime    time.Time // not modelled as lost (docs/lazyfs.md)
	// files: data as every reader sees it, and as the last fsync left it
	data, synced []byte
	// symlinks: the target (fixed at creation, durable with the entry)
	target string
	// dirs: entries as every reader sees them, and as the last fsync of the
	// directory (or a commit it pulled in) left them
	entries, durable map[string]Ino
}

// op is a namespace change not yet durable: it touches the entries of dirs.
type op struct {
	dirs  []Ino
	apply func(t *Tree) // on the durable maps
}

// Tree is the model: the live tree every operation sees, the durable tree a
// power cut leaves, and the log of namespace changes between the two.
// Safe for concurrent use.
type Tree struct {
	mu      sync.Mutex
	nodes   map[Ino]*node
	next    Ino
	pending []op
}

// NewTree returns a tree holding only an empty, durable root directory.
func NewTree() *Tree {
	t := &Tree{nodes: map[Ino]*node{}, next: RootIno + 1}
	t.nodes[RootIno] = &node{ino: RootIno, kind: KindDir, links: 1, perm: 0o755, entries: map[string]Ino{}, durable: map[string]Ino{}}
	return t
}

// Attr is what Stat says about a node.
type Attr struct {
	Ino      Ino
	Kind     uint32
	Perm     uint32
	Links    int
	Uid, Gid uint32
	Size     int64
	Mtime    time.Time
}

func (n *node) attr() Attr {
	a := Attr{Ino: n.ino, Kind: n.kind, Perm: n.perm, Links: n.links, Uid: n.uid, Gid: n.gid, Size: int64(len(n.data)), Mtime: n.mtime}
	switch n.kind {
	case KindDir:
		a.Size = int64(len(n.entries))
	case KindSymlink:
		a.Size = int64(len(n.target))
	}
	return a
}

func (t *Tree) get(ino Ino) (*node, error) {
	n := t.nodes[ino]
	if n == nil {
		return nil, syscall.ENOENT
	}
	return n, nil
}

func (t *Tree) dir(ino Ino) (*node, error) {
	n, err := t.get(ino)
	if err != nil {
		return nil, err
	}
	if n.kind != KindDir {
		return nil, syscall.ENOTDIR
	}
	return n, nil
}

func validName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 255 {
		return syscall.EINVAL
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' || name[i] == 0 {
			return syscall.EINVAL
		}
	}
	return nil
}

// Stat returns a node's attributes.
func (t *Tree) Stat(ino Ino) (Attr, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, err := t.get(ino)
	if err != nil {
		return Attr{}, err
	}
	return n.attr(), nil
}

// Lookup finds name in dir.
func (t *Tree) Lookup(dir Ino, name string) (Attr, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d, err := t.dir(dir)
	if err != nil {
		return Attr{}, err
	}
	ino, ok := d.entries[name]
	if !ok {
		return Attr{}, syscall.ENOENT
	}
	return t.nodes[ino].attr(), nil
}

// Entry is one directory entry.
type Entry struct {
	Name string
	Attr Attr
}

// ReadDir lists dir, sorted by name.
func (t *Tree) ReadDir(dir Ino) ([]Entry, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d, err := t.dir(dir)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(d.entries))
	for name, ino := range d.entries {
		out = append(out, Entry{Name: name, Attr: t.nodes[ino].attr()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Create makes a node of kind (file, dir, socket, fifo) in dir. The entry
// becomes durable at the next fsync of dir; a file's contents start empty
// and durable-empty.
func (t *Tree) Create(dir Ino, name string, kind, perm uint32) (Attr, error) {
	return t.create(dir, name, kind, perm, "")
}

// Symlink makes a symbolic link; like any entry, durable at the fsync of dir.
func (t *Tree) Symlink(dir Ino, name, target string) (Attr, error) {
	return t.create(dir, name, KindSymlink, 0o777, target)
}

func (t *Tree) create(dir Ino, name string, kind, perm uint32, target string) (Attr, error) {
	if err := validName(name); err != nil {
		return Attr{}, err
	}
	switch kind {
	case KindFile, KindDir, KindSymlink, KindSocket, KindFIFO:
	default:
		return Attr{}, syscall.EINVAL
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	d, err := t.dir(dir)
	if err != nil {
		return Attr{}, err
	}
	if _, ok := d.entries[name]; ok {
		return Attr{}, syscall.EEXIST
	}
	now := time.Now()
	n := &node{ino: t.next, kind: kind, perm: perm & 0o7777, target: target, mtime: now, links: 1}
	d.mtime = now
	t.next++
	if kind == KindDir {
		n.entries, n.durable = map[string]Ino{}, map[string]Ino{}
	}
	t.nodes[n.ino] = n
	d.entries[name] = n.ino
	ino := n.ino
	t.pending = append(t.pending, op{dirs: []Ino{dir}, apply: func(t *Tree) { t.nodes[dir].durable[name] = ino }})
	return n.attr(), nil
}

// Remove unlinks name from dir (rmdir when dir says so: an empty directory).
// The removal becomes durable at the next fsync of dir.
func (t *Tree) Remove(dir Ino, name string, isDir bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	d, err := t.dir(dir)
	if err != nil {
		return err
	}
	ino, ok := d.entries[name]
	if !ok {
		return syscall.ENOENT
	}
	n := t.nodes[ino]
	switch {
	case isDir && n.kind != KindDir:
		return syscall.ENOTDIR
	case !isDir && n.kind == KindDir:
		return syscall.EISDIR
	case isDir && len(n.entries) > 0:
		return syscall.ENOTEMPTY
	}
	delete(d.entries, name)
	n.links--
	t.pending = append(t.pending, op{dirs: []Ino{dir}, apply: func(t *Tree) { delete(t.nodes[dir].durable, name) }})
	return nil
}

// Link gives the file ino a second name in dir (link(2)); like any entry,
// durable at the fsync of dir.
func (t *Tree) Link(ino, dir Ino, name string) (Attr, error) {
	if err := validName(name); err != nil {
		return Attr{}, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	d, err := t.dir(dir)
	if err != nil {
		return Attr{}, err
	}
	n, err := t.get(ino)
	if err != nil {
		return Attr{}, err
	}
	if n.kind == KindDir {
		return Attr{}, syscall.EPERM
	}
	if _, ok := d.entries[name]; ok {
		return Attr{}, syscall.EEXIST
	}
	d.entries[name] = ino
	n.links++
	t.pending = append(t.pending, op{dirs: []Ino{dir}, apply: func(t *Tree) { t.nodes[dir].durable[name] = ino }})
	return n.attr(), nil
}

// Rename moves src/oldName to dst/newName, replacing what is there (a file
// by a file, an empty directory by a directory), as rename(2) without
// flags. It is one journal operation: durable as a whole at the fsync of
// either directory, never half.
func (t *Tree) Rename(src Ino, oldName string, dst Ino, newName string) error {
	if err := validName(newName); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s, err := t.dir(src)
	if err != nil {
		return err
	}
	d, err := t.dir(dst)
	if err != nil {
		return err
	}
	ino, ok := s.entries[oldName]
	if !ok {
		return syscall.ENOENT
	}
	n := t.nodes[ino]
	if old, ok := d.entries[newName]; ok {
		if old == ino {
			return nil // same file: rename(2) does nothing
		}
		o := t.nodes[old]
		switch {
		case n.kind == KindDir && o.kind != KindDir:
			return syscall.ENOTDIR
		case n.kind != KindDir && o.kind == KindDir:
			return syscall.EISDIR
		case o.kind == KindDir && len(o.entries) > 0:
			return syscall.ENOTEMPTY
		}
	}
	if n.kind == KindDir && (ino == dst || t.isAncestor(ino, dst)) {
		return syscall.EINVAL // into itself
	}
	if old, ok := d.entries[newName]; ok {
		t.nodes[old].links--
	}
	delete(s.entries, oldName)
	d.entries[newName] = ino
	t.pending = append(t.pending, op{dirs: []Ino{src, dst}, apply: func(t *Tree) {
		delete(t.nodes[src].durable, oldName)
		t.nodes[dst].durable[newName] = ino
	}})
	return nil
}

// isAncestor reports whether dir a is above b in the live tree.
func (t *Tree) isAncestor(a, b Ino) bool {
	for p := t.parent(b); p != 0; p = t.parent(p) {
		if p == a {
			return true
		}
	}
	return false
}

func (t *Tree) parent(ino Ino) Ino {
	if ino == RootIno {
		return 0
	}
	for _, n := range t.nodes {
		if n.kind != KindDir {
			continue
		}
		for _, c := range n.entries {
			if c == ino {
				return n.ino
			}
		}
	}
	return 0
}

// Read reads up to n bytes at off.
func (t *Tree) Read(ino Ino, off int64, n int) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f, err := t.file(ino)
	if err != nil {
		return nil, err
	}
	if off < 0 {
		return nil, syscall.EINVAL
	}
	if off >= int64(len(f.data)) {
		return nil, nil
	}
	end := min(off+int64(n), int64(len(f.data)))
	return append([]byte(nil), f.data[off:end]...), nil
}

func (t *Tree) file(ino Ino) (*node, error) {
	n, err := t.get(ino)
	if err != nil {
		return nil, err
	}
	if n.kind == KindDir {
		return nil, syscall.EISDIR
	}
	if n.kind != KindFile {
		return nil, syscall.EINVAL
	}
	return n, nil
}

// maxSize bounds a file: the whole tree lives in memory.
const maxSize = 1 << 36

// Write writes p at off (extending the file with zeros as needed). It stays
// in the tree's own cache until the file is fsynced.
func (t *Tree) Write(ino Ino, off int64, p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f, err := t.file(ino)
	if err != nil {
		return 0, err
	}
	if off < 0 || off+int64(len(p)) > maxSize {
		return 0, syscall.EFBIG
	}
	if end := off + int64(len(p)); end > int64(len(f.data)) {
		f.data = append(f.data, make([]byte, end-int64(len(f.data)))...)
	}
	copy(f.data[off:], p)
	f.mtime = time.Now()
	return len(p), nil
}

// Truncate sets a file's size; like a write, durable at the file's fsync.
func (t *Tree) Truncate(ino Ino, size int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	f, err := t.file(ino)
	if err != nil {
		return err
	}
	if size < 0 || size > maxSize {
		return syscall.EINVAL
	}
	if size <= int64(len(f.data)) {
		f.data = f.data[:size:size]
	} else {
		f.data = append(f.data, make([]byte, size-int64(len(f.data)))...)
	}
	return nil
}

// Chmod changes permission bits (kept across a power cut: not modelled as
// lost, see docs/lazyfs.md).
func (t *Tree) Chmod(ino Ino, perm uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, err := t.get(ino)
	if err != nil {
		return err
	}
	n.perm = perm & 0o7777
	return nil
}

// Chown changes the owner (not modelled as lost, like Chmod).
func (t *Tree) Chown(ino Ino, uid, gid uint32, setUID, setGID bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, err := t.get(ino)
	if err != nil {
		return err
	}
	if setUID {
		n.uid = uid
	}
	if setGID {
		n.gid = gid
	}
	return nil
}

// Touch sets the modification time (not modelled as lost).
func (t *Tree) Touch(ino Ino, mtime time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, err := t.get(ino)
	if err != nil {
		return err
	}
	n.mtime = mtime
	return nil
}

// Readlink returns a symlink's target.
func (t *Tree) Readlink(ino Ino) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, err := t.get(ino)
	if err != nil {
		return "", err
	}
	if n.kind != KindSymlink {
		return "", syscall.EINVAL
	}
	return n.target, nil
}

// Fsync makes a node durable: a file's contents (fsync and fdatasync are
// the same here: the size is part of the data), a directory's entries. A
// directory's fsync commits every pending namespace change that touches it,
// and with them every earlier pending change that touches a directory they
// touch (the journal commits in order: a rename S→D made durable by D's
// fsync takes the changes to S before it along, so no state shows a file
// under two names or none).
func (t *Tree) Fsync(ino Ino) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, err := t.get(ino)
	if err != nil {
		return err
	}
	if n.kind != KindDir {
		n.synced = append(n.synced[:0:0], n.data...)
		return nil
	}
	touched := map[Ino]bool{ino: true}
	commit := make([]bool, len(t.pending))
	for i := len(t.pending) - 1; i >= 0; i-- {
		hit := false
		for _, d := range t.pending[i].dirs {
			hit = hit || touched[d]
		}
		if !hit {
			continue
		}
		commit[i] = true
		for _, d := range t.pending[i].dirs {
			touched[d] = true
		}
	}
	var keep []op
	for i, o := range t.pending {
		if commit[i] {
			o.apply(t)
		} else {
			keep = append(keep, o)
		}
	}
	t.pending = keep
	return nil
}

// Sync makes everything durable (sync(2), syncfs(2)).
func (t *Tree) Sync() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, o := range t.pending {
		o.apply(t)
	}
	t.pending = nil
	for _, n := range t.nodes {
		if n.kind == KindFile {
			n.synced = append(n.synced[:0:0], n.data...)
		}
	}
}

// PowerCut drops everything that is not durable: each file's contents
// revert to its last fsync, each directory's entries to its durable ones,
// and every node no durable entry reaches is gone. Call it while nothing
// is mounted (Mount's server is stopped): open handles do not survive a
// power cut.
func (t *Tree) PowerCut() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending = nil
	reach := map[Ino]bool{}
	var walk func(Ino)
	walk = func(ino Ino) {
		if reach[ino] {
			return
		}
		reach[ino] = true
		if n := t.nodes[ino]; n.kind == KindDir {
			for _, c := range n.durable {
				walk(c)
			}
		}
	}
	walk(RootIno)
	for ino, n := range t.nodes {
		if !reach[ino] {
			delete(t.nodes, ino)
			continue
		}
		if ino != RootIno {
			n.links = 0
		}
		switch n.kind {
		case KindFile:
			n.data = append(n.synced[:0:0], n.synced...)
		case KindDir:
			n.entries = make(map[string]Ino, len(n.durable))
			for k, v := range n.durable {
				n.entries[k] = v
			}
		}
	}
	for _, n := range t.nodes {
		for _, c := range n.entries {
			t.nodes[c].links++
		}
	}
}

// Pending is the number of namespace changes not yet durable.
func (t *Tree) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// Unsynced lists the files whose contents differ from their durable ones,
// by inode (for reports: what a power cut now would lose).
func (t *Tree) Unsynced() []Ino {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Ino
	for ino, n := range t.nodes {
		if n.kind == KindFile && string(n.data) != string(n.synced) {
			out = append(out, ino)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func (a Attr) String() string {
	return fmt.Sprintf("ino %d mode %o size %d", a.Ino, a.Kind|a.Perm, a.Size)
}
