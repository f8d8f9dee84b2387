package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// lnode is one node of a Tree as FUSE sees it.
type lnode struct {
	fs.Inode
	t   *Tree
	ino Ino
	ms  *mountState
}

// mountState fences a mount off its tree at a power cut: an operation
// either completes before the fence or fails with EIO, so nothing reaches
// the tree after the cut even while the kernel keeps the detached mount
// alive (a mount namespace created meanwhile holds a copy of it).
type mountState struct {
	mu   sync.RWMutex
	gone bool
}

func (m *mountState) enter() bool {
	m.mu.RLock()
	if m.gone {
		m.mu.RUnlock()
		return false
	}
	return true
}

func (m *mountState) leave() { m.mu.RUnlock() }

func (m *mountState) fence() {
	m.mu.Lock()
	m.gone = true
	m.mu.Unlock()
}

var (
	_ fs.NodeGetattrer  = (*lnode)(nil)
	_ fs.NodeSetattrer  = (*lnode)(nil)
	_ fs.NodeLookuper   = (*lnode)(nil)
	_ fs.NodeReaddirer  = (*lnode)(nil)
	_ fs.NodeCreater    = (*lnode)(nil)
	_ fs.NodeMkdirer    = (*lnode)(nil)
	_ fs.NodeMknoder    = (*lnode)(nil)
	_ fs.NodeSymlinker  = (*lnode)(nil)
	_ fs.NodeReadlinker = (*lnode)(nil)
	_ fs.NodeUnlinker   = (*lnode)(nil)
	_ fs.NodeRmdirer    = (*lnode)(nil)
	_ fs.NodeRenamer    = (*lnode)(nil)
	_ fs.NodeOpener     = (*lnode)(nil)
	_ fs.NodeReader     = (*lnode)(nil)
	_ fs.NodeWriter     = (*lnode)(nil)
	_ fs.NodeFsyncer    = (*lnode)(nil)
	_ fs.NodeFlusher    = (*lnode)(nil)
	_ fs.NodeLinker     = (*lnode)(nil)
)

func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

func fill(a Attr, out *fuse.Attr) {
	out.Ino = uint64(a.Ino)
	out.Mode = a.Kind | a.Perm
	out.Size = uint64(a.Size)
	out.Blocks = (out.Size + 511) / 512
	out.Nlink = uint32(max(a.Links, 0))
	if a.Kind == KindDir {
		out.Nlink = 2
	}
	out.Owner = fuse.Owner{Uid: a.Uid, Gid: a.Gid}
	out.SetTimes(nil, &a.Mtime, &a.Mtime)
}

func (n *lnode) child(ctx context.Context, a Attr, out *fuse.EntryOut) *fs.Inode {
	fill(a, &out.Attr)
	return n.NewInode(ctx, &lnode{t: n.t, ino: a.Ino, ms: n.ms}, fs.StableAttr{Mode: a.Kind, Ino: uint64(a.Ino)})
}

func (n *lnode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if !n.ms.enter() {
		return syscall.EIO
	}
	defer n.ms.leave()
	a, err := n.t.Stat(n.ino)
	if err != nil {
		return errno(err)
	}
	fill(a, &out.Attr)
	return 0
}

func (n *lnode) Setattr(_ context.Context, _ fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if !n.ms.enter() {
		return syscall.EIO
	}
	defer n.ms.leave()
	if sz, ok := in.GetSize(); ok {
		if err := n.t.Truncate(n.ino, int64(sz)); err != nil {
			return errno(err)
		}
	}
	if m, ok := in.GetMode(); ok {
		if err := n.t.Chmod(n.ino, m); err != nil {
			return errno(err)
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		if err := n.t.Chown(n.ino, uid, gid, uok, gok); err != nil {
			return errno(err)
		}
	}
	if mt, ok := in.GetMTime(); ok {
		if err := n.t.Touch(n.ino, mt); err != nil {
			return errno(err)
		}
	}
	return n.Getattr(context.Background(), nil, out)
}

func (n *lnode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if !n.ms.enter() {
		return nil, syscall.EIO
	}
	defer n.ms.leave()
	a, err := n.t.Lookup(n.ino, name)
	if err != nil {
		return nil, errno(err)
	}
	return n.child(ctx, a, out), 0
}

func (n *lnode) Readdir(context.Context) (fs.DirStream, syscall.Errno) {
	if !n.ms.enter() {
		return nil, syscall.EIO
	}
	defer n.ms.leave()
	es, err := n.t.ReadDir(n.ino)
	if err != nil {
		return nil, errno(err)
	}
	out := make([]fuse.DirEntry, 0, len(es))
	for _, e := range es {
		out = append(out, fuse.DirEntry{Name: e.Name, Mode: e.Attr.Kind, Ino: uint64(e.Attr.Ino)})
	}
	return fs.NewListDirStream(out), 0
}

func owner(ctx context.Context) (uint32, uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}

func (n *lnode) make(ctx context.Context, name string, kind, mode uint32, target string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	uid, gid := owner(ctx)
	var a Attr
	var err error
	if kind == KindSymlink {
		a, err = n.t.Symlink(n.ino, name, target)
	} else {
		a, err = n.t.Create(n.ino, name, kind, mode&0o7777)
	}
	if err != nil {
		return nil, errno(err)
	}
	_ = n.t.Chown(a.Ino, uid, gid, true, true)
	a, _ = n.t.Stat(a.Ino)
	return n.child(ctx, a, out), 0
}

func (n *lnode) Create(ctx context.Context, name string, _ uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if !n.ms.enter() {
		return nil, nil, 0, syscall.EIO
	}
	defer n.ms.leave()
	in, e := n.make(ctx, name, KindFile, mode, "", out)
	return in, nil, 0, e
}

func (n *lnode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if !n.ms.enter() {
		return nil, syscall.EIO
	}
	defer n.ms.leave()
	return n.make(ctx, name, KindDir, mode, "", out)
}

// Mknod makes unix sockets (bind(2)) and fifos; devices are refused.
func (n *lnode) Mknod(ctx context.Context, name string, mode uint32, _ uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if !n.ms.enter() {
		return nil, syscall.EIO
	}
	defer n.ms.leave()
	kind := mode & syscall.S_IFMT
	switch kind {
	case KindSocket, KindFIFO:
	case KindFile, 0:
		kind = KindFile
	default:
		return nil, syscall.EPERM
	}
	return n.make(ctx, name, kind, mode, "", out)
}

func (n *lnode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if !n.ms.enter() {
		return nil, syscall.EIO
	}
	defer n.ms.leave()
	return n.make(ctx, name, KindSymlink, 0o777, target, out)
}

func (n *lnode) Readlink(context.Context) ([]byte, syscall.Errno) {
	if !n.ms.enter() {
		return nil, syscall.EIO
	}
	defer n.ms.leave()
	s, err := n.t.Readlink(n.ino)
	return []byte(s), errno(err)
}

// Link is link(2): a second name for a file.
func (n *lnode) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if !n.ms.enter() {
		return nil, syscall.EIO
	}
	defer n.ms.leave()
	tn, ok := target.(*lnode)
	if !ok {
		return nil, syscall.EXDEV
	}
	a, err := n.t.Link(tn.ino, n.ino, name)
	if err != nil {
		return nil, errno(err)
	}
	return n.child(ctx, a, out), 0
}

func (n *lnode) Unlink(_ context.Context, name string) syscall.Errno {
	if !n.ms.enter() {
		return syscall.EIO
	}
	defer n.ms.leave()
	return errno(n.t.Remove(n.ino, name, false))
}

func (n *lnode) Rmdir(_ context.Context, name string) syscall.Errno {
	if !n.ms.enter() {
		return syscall.EIO
	}
	defer n.ms.leave()
	return errno(n.t.Remove(n.ino, name, true))
}

func (n *lnode) Rename(_ context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if !n.ms.enter() {
		return syscall.EIO
	}
	defer n.ms.leave()
	p, ok := newParent.(*lnode)
	if !ok {
		return syscall.EXDEV
	}
	switch flags {
	case 0:
	case unix.RENAME_NOREPLACE:
		if _, err := n.t.Lookup(p.ino, newName); err == nil {
			return syscall.EEXIST
		}
	default:
		return syscall.EINVAL // RENAME_EXCHANGE, RENAME_WHITEOUT: not modelled
	}
	return errno(n.t.Rename(n.ino, name, p.ino, newName))
}

// Open keeps no per-handle state. Without FUSE's writeback cache every
// write reaches the tree at once (the kernel may keep clean pages for
// reads, and mmap works); the tree is the only cache that holds unsynced
// data, and a power cut remounts, which drops the kernel's.
func (n *lnode) Open(context.Context, uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, 0, 0
}

func (n *lnode) Read(_ context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if !n.ms.enter() {
		return nil, syscall.EIO
	}
	defer n.ms.leave()
	b, err := n.t.Read(n.ino, off, len(dest))
	if err != nil {
		return nil, errno(err)
	}
	return fuse.ReadResultData(b), 0
}

func (n *lnode) Write(_ context.Context, _ fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if !n.ms.enter() {
		return 0, syscall.EIO
	}
	defer n.ms.leave()
	w, err := n.t.Write(n.ino, off, data)
	return uint32(w), errno(err)
}

// Fsync is fsync(2) and fdatasync(2) of a file, and fsync(2) of a directory.
func (n *lnode) Fsync(context.Context, fs.FileHandle, uint32) syscall.Errno {
	if !n.ms.enter() {
		return syscall.EIO
	}
	defer n.ms.leave()
	return errno(n.t.Fsync(n.ino))
}

func (n *lnode) Flush(context.Context, fs.FileHandle) syscall.Errno { return 0 }

// Mounted is a Tree served at a directory.
type Mounted struct {
	Dir    string
	Tree   *Tree
	server *fuse.Server
	ms     *mountState
	nss    []string // mount namespaces holding a clone of it (MountIn)
}

// Mount serves t at dir (an existing empty directory) until Unmount. It
// needs /dev/fuse and the right to mount (root, or CAP_SYS_ADMIN): the
// error says which is missing.
func Mount(dir string, t *Tree) (*Mounted, error) {
	if why := Available(); why != "" {
		return nil, fmt.Errorf("lazyfs: mount %s: %s", dir, why)
	}
	timeout := time.Second
	ms := &mountState{}
	root := &lnode{t: t, ino: RootIno, ms: ms}
	srv, err := fs.Mount(dir, root, &fs.Options{
		EntryTimeout: &timeout, AttrTimeout: &timeout, NegativeTimeout: &timeout,
		MountOptions: fuse.MountOptions{FsName: "lazyfs", Name: "lazyfs", AllowOther: true,
			DirectMountStrict: true, MaxWrite: 1 << 20, DisableXAttrs: true},
	})
	if err != nil {
		return nil, fmt.Errorf("lazyfs: mount %s: %w", dir, err)
	}
	return &Mounted{Dir: dir, Tree: t, server: srv, ms: ms}, nil
}

// Unmount detaches the mount (lazily, so a process that still holds a file
// there cannot block a power cut) and fences it off its tree: from here on
// no operation through it reaches the tree. It then waits a while for the
// kernel to release the mount; a mount namespace created while it was
// mounted keeps a copy alive, so the wait is bounded and its end is not an
// error (the fence already holds).
func (m *Mounted) Unmount() error {
	err := m.Detach()
	m.WaitReleased()
	return err
}

// Detach is Unmount without the wait: the mount is detached (here and in
// every namespace of MountIn) and fenced at once.
func (m *Mounted) Detach() error {
	var nsErrs []error
	for _, ns := range m.nss {
		nsErrs = append(nsErrs, detachIn(m.Dir, ns))
	}
	err := unix.Unmount(m.Dir, unix.MNT_DETACH)
	m.ms.fence()
	if err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("lazyfs: unmount %s: %w", m.Dir, err)
	}
	if err := errors.Join(nsErrs...); err != nil {
		return fmt.Errorf("lazyfs: unmount %s: %w", m.Dir, err)
	}
	return nil
}

// WaitReleased waits, at most unmountWait, until the kernel released a
// detached mount (its last user gone).
func (m *Mounted) WaitReleased() {
	done := make(chan struct{})
	go func() { m.server.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(unmountWait):
	}
}

// unmountWait bounds the wait for the kernel to release a detached mount.
const unmountWait = 2 * time.Second

// PowerCut is the power cut of a mounted tree: unmount, drop everything not
// durable, and mount the survivor again at the same place. Kill the
// processes using the mount first (a power cut stops them all at once).
func (m *Mounted) PowerCut() (*Mounted, error) {
	if err := m.Unmount(); err != nil {
		return nil, err
	}
	m.Tree.PowerCut()
	return MountIn(m.Dir, m.Tree, m.nss)
}

// CutFrozen is PowerCut while the mount's users still exist, frozen
// (SIGSTOP): the old mount is detached and fenced without waiting for them,
// the tree drops what is not durable, and the new mount is in place before
// they die. Call WaitReleased on the old one once they are gone.
func (m *Mounted) CutFrozen() (*Mounted, error) {
	if err := m.Detach(); err != nil {
		return nil, err
	}
	m.Tree.PowerCut()
	return MountIn(m.Dir, m.Tree, m.nss)
}

// Available says why a lazy filesystem cannot be mounted here ("" when it
// can): /dev/fuse must open and mounting needs CAP_SYS_ADMIN (root).
func Available() string {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Sprintf("FUSE unavailable: open /dev/fuse: %v", err)
	}
	_ = unix.Close(fd)
	if unix.Geteuid() != 0 {
		return fmt.Sprintf("FUSE unavailable: mounting needs root (uid %d)", unix.Geteuid())
	}
	return ""
}
