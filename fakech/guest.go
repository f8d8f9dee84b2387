package fakech

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/fakech/qcow2"
)

// BootIDPath is the guest's per-boot random id (RAM; new on every fresh boot,
// kept across snapshot/restore).
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// ramRoots are tmpfs mounts: files under them live in guest RAM only.
var ramRoots = []string{"/run", "/tmp", "/dev/shm"}

// stdDirs always exist in the guest (the root filesystem's skeleton).
var stdDirs = []string{"/", "/bin", "/dev", "/dev/shm", "/etc", "/etc/ssh", "/home", "/proc", "/root", "/root/.ssh",
	"/run", "/sys", "/tmp", "/usr", "/var", "/var/lib", "/var/log"}

func isRAM(p string) bool {
	for _, r := range ramRoots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

// tree is one filesystem: files and explicitly created directories.
type tree struct {
	Files map[string][]byte `json:"files"`
	Dirs  map[string]bool   `json:"dirs"`
}

func newTree() tree { return tree{Files: map[string][]byte{}, Dirs: map[string]bool{}} }

func (t tree) clone() tree {
	c := tree{Files: make(map[string][]byte, len(t.Files)), Dirs: maps.Clone(t.Dirs)}
	if c.Dirs == nil {
		c.Dirs = map[string]bool{}
	}
	for k, v := range t.Files {
		c.Files[k] = bytes.Clone(v)
	}
	return c
}

// diskDiff is the guest's dirty page cache: disk writes not yet synced to the
// image file. It is RAM, so a snapshot carries it and a kill -9 loses it.
type diskDiff struct {
	Written     map[string][]byte `json:"written,omitempty"`
	Deleted     []string          `json:"deleted,omitempty"`
	DirsAdded   []string          `json:"dirs_added,omitempty"`
	DirsRemoved []string          `json:"dirs_removed,omitempty"`
}

func (d diskDiff) empty() bool {
	return len(d.Written) == 0 && len(d.Deleted) == 0 && len(d.DirsAdded) == 0 && len(d.DirsRemoved) == 0
}

// memoryImage is the content of memory-ranges: everything the guest keeps in
// RAM.
type memoryImage struct {
	Format        string   `json:"format"`
	BootID        string   `json:"boot_id"`
	RAM           tree     `json:"ram"`
	Dirty         diskDiff `json:"dirty_disk"`
	BootRemaining int64    `json:"boot_remaining_ns"` // guest OS boot still to run
	DHCPReleased  bool     `json:"dhcp_released"`
}

const memoryFormat = "fakech-memory-v1"

// guest is the fake guest OS: a disk image (synced state) plus a page cache,
// a RAM filesystem and a boot id. mu serialises commands and snapshot reads.
type guest struct {
	mu       sync.Mutex
	diskPath string          // "" when the guest has no fake image
	diskFile *os.File        // the VMM's open, locked image: sync writes through it
	diskQcow *qcow2.Image    // the same, when the image is qcow2: writes go to its top overlay
	base     *guestimg.Image // the image file's content as of the last sync
	imgLen   int64           // bytes of the disk the image last written (or read) takes
	disk     tree            // what the guest sees: base + dirty page cache
	ram      tree
	bootID   string
	dhcp     bool

	// gate: commands and SSH handshakes run only while the VM runs and the
	// guest OS has finished booting.
	gateMu        sync.Mutex
	running       bool
	gone          bool
	readyAt       time.Time     // valid while running
	bootRemaining time.Duration // valid while not running
	changed       chan struct{}
}

func newBootID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// errNotFake marks a disk that exists but is not a fake guest image: the VM
// runs with an opaque disk and no SSH server.
var errNotFake = guestimg.ErrNotFakeImage

// loadDisk reads the guest image at p and how many bytes of the disk it
// takes. A missing file is an error (CH fails to open the disk); a file that
// is not a fake image gives an empty guest. A raw disk is read only as far as
// its image goes: the manager may have grown it far beyond.
func loadDisk(p string) (*guestimg.Image, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, 0, fmt.Errorf("failed to open disk image %s: %w", p, err)
	}
	defer f.Close()
	head := make([]byte, 4)
	if _, err := io.ReadFull(f, head); err == nil && qcow2.IsQcow2(head) {
		// A qcow2 disk is read through its backing chain (CH detects the
		// format from the header).
		b, err := guestimg.ReadDisk(head, p)
		if err != nil {
			return nil, 0, fmt.Errorf("disk image %s: %w", p, err)
		}
		img, n, err := guestimg.DecodeFrom(bytes.NewReader(b))
		return checkDecoded(p, img, n, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, 0, fmt.Errorf("disk image %s: %w", p, err)
	}
	img, n, err := guestimg.DecodeFrom(f)
	return checkDecoded(p, img, n, err)
}

func checkDecoded(p string, img *guestimg.Image, n int64, err error) (*guestimg.Image, int64, error) {
	if errors.Is(err, errNotFake) {
		return nil, 0, errNotFake
	}
	if err != nil {
		return nil, 0, fmt.Errorf("disk image %s: %w", p, err)
	}
	return img, n, nil
}

// newGuest boots a fresh guest from the disk image (nil img: opaque disk).
func newGuest(diskPath string, img *guestimg.Image, bootTime time.Duration) *guest {
	g := &guest{ram: newTree(), bootID: newBootID(), changed: make(chan struct{}), bootRemaining: bootTime}
	if img != nil {
		g.diskPath = diskPath
		g.base = img
		g.disk = imageTree(img)
	} else {
		g.disk = newTree()
	}
	return g
}

func imageTree(img *guestimg.Image) tree {
	t := tree{Files: make(map[string][]byte, len(img.Files)), Dirs: map[string]bool{}}
	for k, v := range img.Files {
		t.Files[k] = bytes.Clone(v)
	}
	for _, d := range img.Dirs {
		t.Dirs[d] = true
	}
	return t
}

// restoreGuest rebuilds a guest from a disk image and memory-ranges.
func restoreGuest(diskPath string, img *guestimg.Image, mem *memoryImage) *guest {
	g := newGuest(diskPath, img, time.Duration(mem.BootRemaining))
	g.bootID = mem.BootID
	g.dhcp = mem.DHCPReleased
	if mem.RAM.Files != nil {
		g.ram = mem.RAM.clone()
	}
	d := mem.Dirty
	for k, v := range d.Written {
		g.disk.Files[k] = bytes.Clone(v)
	}
	for _, k := range d.Deleted {
		delete(g.disk.Files, k)
	}
	for _, k := range d.DirsAdded {
		g.disk.Dirs[k] = true
	}
	for _, k := range d.DirsRemoved {
		delete(g.disk.Dirs, k)
	}
	return g
}

// --- the gate -------------------------------------------------------------

func (g *guest) signal() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// setRunning starts or stops the guest's clock; the boot countdown freezes
// while paused. Taking g.mu first means an in-flight command finishes before
// a pause takes effect, as an instruction finishes before vCPUs stop.
func (g *guest) setRunning(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gateMu.Lock()
	defer g.gateMu.Unlock()
	if g.running == on || g.gone {
		return
	}
	now := time.Now()
	if on {
		g.readyAt = now.Add(g.bootRemaining)
	} else {
		g.bootRemaining = max(0, g.readyAt.Sub(now))
	}
	g.running = on
	g.signal()
}

// kill ends the guest: every waiter fails.
func (g *guest) kill() {
	g.gateMu.Lock()
	defer g.gateMu.Unlock()
	if !g.gone {
		g.gone = true
		g.signal()
	}
}

var errGuestGone = errors.New("guest is gone")

// wait blocks until the guest runs and has booted, the guest is gone, or ctx
// ends.
func (g *guest) wait(ctx context.Context) error {
	for {
		g.gateMu.Lock()
		gone, running, readyAt, ch := g.gone, g.running, g.readyAt, g.changed
		g.gateMu.Unlock()
		if gone {
			return errGuestGone
		}
		var t *time.Timer
		var timer <-chan time.Time
		if running {
			d := time.Until(readyAt)
			if d <= 0 {
				return nil
			}
			t = time.NewTimer(d)
			timer = t.C
		}
		var err error
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-ch:
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
		if err != nil {
			return err
		}
	}
}

// lockRunning takes g.mu with the guest running and booted. The gate is
// checked again under g.mu because setRunning flips it under g.mu: a command
// that passed wait() just before a pause must not run after it, or an acked
// write could be missing from the snapshot taken while paused.
func (g *guest) lockRunning(ctx context.Context) error {
	for {
		if err := g.wait(ctx); err != nil {
			return err
		}
		g.mu.Lock()
		g.gateMu.Lock()
		ok := g.running && !g.gone && !time.Now().Before(g.readyAt)
		g.gateMu.Unlock()
		if ok {
			return nil
		}
		g.mu.Unlock()
	}
}

// remainingBoot is the guest OS boot still to run (for state capture).
func (g *guest) remainingBoot() time.Duration {
	g.gateMu.Lock()
	defer g.gateMu.Unlock()
	if g.running {
		return max(0, time.Until(g.readyAt))
	}
	return g.bootRemaining
}

// --- state capture ----------------------------------------------------------

// capture returns memory-ranges: RAM, boot id and the dirty page cache.
func (g *guest) capture() *memoryImage {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := &memoryImage{Format: memoryFormat, BootID: g.bootID, RAM: g.ram.clone(), DHCPReleased: g.dhcp,
		BootRemaining: int64(g.remainingBoot())}
	m.Dirty = g.dirtyLocked()
	return m
}

func (g *guest) dirtyLocked() diskDiff {
	var d diskDiff
	var baseFiles map[string][]byte
	baseDirs := map[string]bool{}
	if g.base != nil {
		baseFiles = g.base.Files
		for _, x := range g.base.Dirs {
			baseDirs[x] = true
		}
	}
	for k, v := range g.disk.Files {
		if old, ok := baseFiles[k]; !ok || !bytes.Equal(old, v) {
			if d.Written == nil {
				d.Written = map[string][]byte{}
			}
			d.Written[k] = bytes.Clone(v)
		}
	}
	for k := range baseFiles {
		if _, ok := g.disk.Files[k]; !ok {
			d.Deleted = append(d.Deleted, k)
		}
	}
	for k := range g.disk.Dirs {
		if !baseDirs[k] {
			d.DirsAdded = append(d.DirsAdded, k)
		}
	}
	for k := range baseDirs {
		if !g.disk.Dirs[k] {
			d.DirsRemoved = append(d.DirsRemoved, k)
		}
	}
	sort.Strings(d.Deleted)
	sort.Strings(d.DirsAdded)
	sort.Strings(d.DirsRemoved)
	return d
}

// syncLocked writes the page cache to the image file durably (the guest's
// `sync`). Without a fake image there is nothing to write.
func (g *guest) syncLocked() error {
	if g.base == nil || g.diskPath == "" {
		return nil
	}
	if g.dirtyLocked().empty() {
		return nil
	}
	img := &guestimg.Image{Hostname: g.base.Hostname, SSHPort: g.base.SSHPort, Files: maps.Clone(g.disk.Files)}
	for d := range g.disk.Dirs {
		img.Dirs = append(img.Dirs, d)
	}
	sort.Strings(img.Dirs)
	if err := g.writeDisk(img); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	g.base = img
	g.disk = imageTree(img)
	return nil
}

// instanceIDPath is where cloud-init records the instance it last set up.
const instanceIDPath = "/var/lib/cloud/data/instance-id"

// cloudInit applies the seed the way cloud-init's per-instance SSH module
// does on the first boot of an instance (an instance id the disk has not
// recorded): the seed's host key replaces every host key the image holds
// (ssh_deletekeys), and its authorized keys are added to root's. The
// changes are the guest's own writes, in its page cache until a sync, so a
// boot that loses them applies the seed again. A guest without a fake image
// (no files) or a seed without an instance id is left alone.
func (g *guest) cloudInit(sd seed) {
	if !sd.found || sd.instanceID == "" || g.base == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if string(g.disk.Files[instanceIDPath]) == sd.instanceID+"\n" {
		return
	}
	if signer, err := ssh.ParsePrivateKey(sd.hostKey); err == nil {
		for p := range g.disk.Files {
			if strings.HasPrefix(p, "/etc/ssh/ssh_host_") {
				delete(g.disk.Files, p)
			}
		}
		g.disk.Files[guestimg.HostKeyPath] = bytes.Clone(sd.hostKey)
		g.disk.Files[guestimg.HostKeyPath+".pub"] = ssh.MarshalAuthorizedKey(signer.PublicKey())
	}
	ak := bytes.Clone(g.disk.Files[guestimg.AuthorizedKeysPath])
	for _, k := range sd.authorizedKeys {
		if bytes.Contains(ak, []byte(k)) {
			continue
		}
		if len(ak) > 0 && !bytes.HasSuffix(ak, []byte("\n")) {
			ak = append(ak, '\n')
		}
		ak = append(append(ak, k...), '\n')
	}
	g.disk.Files[guestimg.AuthorizedKeysPath] = ak
	g.disk.Files[instanceIDPath] = []byte(sd.instanceID + "\n")
}

// hostKey returns the guest's SSH host key and whether it has one.
func (g *guest) hostKey() ([]byte, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.disk.Files[guestimg.HostKeyPath]
	return bytes.Clone(b), ok
}

// authorizedKeys returns the guest's current authorized_keys.
func (g *guest) authorizedKeys() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return bytes.Clone(g.disk.Files[guestimg.AuthorizedKeysPath])
}

// --- filesystem view --------------------------------------------------------

func (g *guest) treeFor(p string) tree {
	if isRAM(p) {
		return g.ram
	}
	return g.disk
}

func (g *guest) isDir(p string) bool {
	for _, d := range stdDirs {
		if d == p {
			return true
		}
	}
	t := g.treeFor(p)
	if t.Dirs[p] {
		return true
	}
	pre := p + "/"
	for k := range t.Files {
		if strings.HasPrefix(k, pre) {
			return true
		}
	}
	for k := range t.Dirs {
		if strings.HasPrefix(k, pre) {
			return true
		}
	}
	return false
}

func (g *guest) readFile(p string) ([]byte, bool) {
	if p == BootIDPath {
		return []byte(g.bootID + "\n"), true
	}
	b, ok := g.treeFor(p).Files[p]
	return b, ok
}

// list returns the names directly under dir, sorted.
func (g *guest) list(dir string) []string {
	pre := dir + "/"
	if dir == "/" {
		pre = "/"
	}
	seen := map[string]bool{}
	add := func(p string) {
		if rest, ok := strings.CutPrefix(p, pre); ok && rest != "" {
			name, _, _ := strings.Cut(rest, "/")
			seen[name] = true
		}
	}
	for _, t := range []tree{g.disk, g.ram} {
		for k := range t.Files {
			add(k)
		}
		for k := range t.Dirs {
			add(k)
		}
	}
	for _, d := range stdDirs {
		add(d)
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// guestPath makes p absolute (cwd is /root) and clean.
func guestPath(p string) string {
	if !strings.HasPrefix(p, "/") {
		p = "/root/" + p
	}
	return path.Clean(p)
}

// writeDisk writes the image through the VMM's open fd, in place, as CH
// writes guest I/O to the inode it opened (a temp file renamed over the path
// would leave the VMM writing to the old inode). The disk keeps its size, as
// a real one does (the manager may have grown it): the tail of a longer old
// image is zeroed, and the decoder ignores it if a kill lands in between.
func (g *guest) writeDisk(img *guestimg.Image) error {
	b, err := img.Encode()
	if err != nil {
		return err
	}
	if g.diskQcow != nil {
		// Trailing old bytes stay in the overlay; the decoder ignores them.
		if _, err := g.diskQcow.WriteAt(b, 0); err != nil {
			return err
		}
		return g.diskQcow.Sync()
	}
	if g.diskFile == nil {
		return img.Save(g.diskPath)
	}
	if _, err := g.diskFile.WriteAt(b, 0); err != nil {
		return err
	}
	if n := int64(len(b)); g.imgLen > n {
		if _, err := g.diskFile.WriteAt(make([]byte, g.imgLen-n), n); err != nil {
			return err
		}
	}
	g.imgLen = int64(len(b))
	return g.diskFile.Sync()
}
