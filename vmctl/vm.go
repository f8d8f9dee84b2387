package vmctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/timescale"
	"golang.org/x/sys/unix"
)

// CreateOptions are the flags of `vm create|run`.
type CreateOptions struct {
	Name    string
	CPU     int
	Memory  int64 // bytes
	Storage int64 // bytes
	NICs    int
	Image   string
	Start   bool // run: boot the VMM; create: only reserve and copy
}

// Defaults of `vm create|run`.
const (
	DefaultCPU    = 1
	DefaultMemory = 512 << 20
	DefaultNICs   = 1
)

// Sentinels for the "not found" outcomes callers branch on; their text is
// the exact §4.5 message.
var (
	ErrVMNotFound       = errors.New(MsgVMNotFound)
	ErrSnapshotNotFound = errors.New(MsgSnapshotNotFound)
)

func errVMNotFound() error { return ErrVMNotFound }

// lookupVM resolves an id or a name.
func lookupVM(ix *vmIndex, ref string) (*VM, bool) {
	return lookupRef(ix.VMs, ix.Names, ref)
}

// lookupRef resolves ref in either index the same way: an id first, then a
// name through the index's name map.
func lookupRef[R any](records map[string]*R, names map[string]string, ref string) (*R, bool) {
	if r, ok := records[ref]; ok {
		return r, true
	}
	if id, ok := names[ref]; ok {
		if r, ok := records[id]; ok {
			return r, true
		}
	}
	return nil, false
}

// resolveVM returns a copy of the record named by ref.
func (m *Manager) resolveVM(ref string) (*VM, error) {
	ix, err := m.loadVMs()
	if err != nil {
		return nil, err
	}
	v, ok := lookupVM(ix, ref)
	if !ok {
		return nil, errVMNotFound()
	}
	c := *v
	return &c, nil
}

// usedIPs collects every address a record or a pending delete still holds.
func usedIPs(ix *vmIndex) map[string]bool {
	used := map[string]bool{}
	for _, v := range ix.VMs {
		for _, n := range v.Network {
			used[n.IP] = true
		}
	}
	for _, t := range ix.Tombstones {
		for _, ip := range t.IPs {
			used[ip] = true
		}
	}
	return used
}

// reserve writes the creating placeholder: the ops lock is taken on the new
// id first, so the placeholder is never visible without a live owner, and
// the name is claimed before any work starts.
//
// In tap mode the NICs come from the /30 slots the name owns (prefer: the
// NICs a snapshot's metadata recorded for this name).
func (m *Manager) reserve(ctx context.Context, name string, cfg VMConfig, prefer []NIC) (*VM, *flock, error) {
	id := newID()
	ops, err := lockFile(ctx, m.opsLockPath(id), exclusive, false)
	if err != nil {
		return nil, nil, fmt.Errorf("reserve VM record: ops lock: %w", err)
	}
	if !m.tap() && !m.pool.loopback() {
		ops.Unlock()
		return nil, nil, fmt.Errorf("reserve VM record: net pool %s must be inside 127.0.0.0/8 in %s net mode", m.pool.prefix, NetModeFake)
	}
	var rec *VM
	err = m.updateVMs(ctx, id, func(ix *vmIndex) error {
		if name == "" {
			name = "vm-" + strings.ToLower(id[:8])
		}
		if holder, ok := ix.Names[name]; ok {
			return fmt.Errorf("reserve VM record: "+MsgVMNameExists, name, holder)
		}
		t := now()
		rec = &VM{ID: id, Name: name, State: StateCreating, Config: cfg, RunDir: m.vmRunDir(id), CreatedAt: t, UpdatedAt: t}
		if m.tap() {
			nics, err := m.planTapNICs(ix, name, cfg.NICs, prefer)
			if err != nil {
				return fmt.Errorf("reserve VM record: %w", err)
			}
			rec.Network = nics
		} else {
			ips, err := m.pool.allocate(m.cfg.RootDir, cfg.NICs, guestSSHPort, usedIPs(ix))
			if err != nil {
				return fmt.Errorf("reserve VM record: %w", err)
			}
			for i, ip := range ips {
				rec.Network = append(rec.Network, NIC{ID: nicID(macFor(id, i)), MAC: macFor(id, i), IP: ip, Mask: m.pool.mask, SSHPort: guestSSHPort})
			}
		}
		c := *rec
		ix.VMs[id] = &c
		ix.Names[name] = id
		return nil
	})
	if err != nil {
		ops.Unlock()
		return nil, nil, err
	}
	return rec, ops, nil
}

// bootArgs are the VMM flags of a cold boot of v. The seed (written by
// bootVMM) is a second, read-only disk, for every guest. In tap mode the
// serial console goes to a file, since a real guest's boot log is the only
// evidence of why it never answered.
func (m *Manager) bootArgs(v *VM) []string {
	mem := v.Config.Memory
	if mem <= 0 {
		mem = DefaultMemory
	}
	cpu := v.Config.CPU
	if cpu <= 0 {
		cpu = DefaultCPU
	}
	var args []string
	if m.cfg.Kernel != "" {
		args = append(args, "--kernel", m.cfg.Kernel, "--cmdline", m.cfg.Cmdline)
		if m.cfg.Initramfs != "" {
			args = append(args, "--initramfs", m.cfg.Initramfs)
		}
	} else {
		args = append(args, "--firmware", m.cfg.Firmware)
	}
	args = append(args,
		"--cpus", "boot="+strconv.Itoa(cpu),
		"--memory", "size="+strconv.FormatInt((mem+(1<<20)-1)>>20, 10)+"M",
		"--disk", "path="+m.vmDisk(v.ID), "path="+m.vmSeed(v.ID)+",readonly=on",
	)
	for _, n := range v.Network {
		args = append(args, "--net", netArg(n))
	}
	if m.tap() {
		args = append(args, "--serial", "file="+m.serialLog(v.ID), "--console", "off")
	}
	return args
}

// bootVMM launches v's VMM from its disk and waits until the guest runs.
func (m *Manager) bootVMM(ctx context.Context, v *VM) (int, error) {
	// Written on every cold boot from the record: the guest applies it on
	// its first boot as this instance (the name).
	if err := m.writeSeed(v); err != nil {
		return 0, fmt.Errorf("boot: %w", err)
	}
	pid, c, err := m.launchVMM(ctx, v.ID, m.bootArgs(v))
	if err != nil {
		return 0, err
	}
	if err := waitState(ctx, c, chapi.StateRunning, func() bool { return m.isOurVMM(pid, v.ID) }); err != nil {
		m.dropFailedVMM(context.WithoutCancel(ctx), pid, v.ID)
		return 0, fmt.Errorf("boot: %w%s", err, logTail(m.vmRunDir(v.ID)+"/vmm.log"))
	}
	return pid, nil
}

// Create implements `vm create` (record created, no VMM) and `vm run`
// (booted, record running).
func (m *Manager) Create(ctx context.Context, o CreateOptions) (*VM, error) {
	if o.Image == "" {
		return nil, fmt.Errorf("%w: an IMAGE is required", ErrUsage)
	}
	if o.CPU <= 0 {
		o.CPU = DefaultCPU
	}
	if o.Memory <= 0 {
		o.Memory = DefaultMemory
	}
	if o.NICs < 0 {
		return nil, fmt.Errorf("%w: --nics must be >= 0", ErrUsage)
	}
	img, err := absPath(o.Image)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(img); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cfg := VMConfig{CPU: o.CPU, Memory: o.Memory, Storage: o.Storage, NICs: o.NICs, Image: img}
	rec, ops, err := m.reserve(ctx, o.Name, cfg, nil)
	if err != nil {
		return nil, err
	}
	defer ops.Unlock() // idempotent: released early once created is committed
	m.logf("create %s: reserved (name %s)", rec.ID, rec.Name)
	if err := hit(ctx, "vm.create.reserved", rec.ID); err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("create %s: %w", rec.ID, err))
	}
	if err := os.MkdirAll(m.vmDir(rec.ID), 0o755); err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("create %s: %w", rec.ID, err))
	}
	if err := copyFile(img, m.vmDisk(rec.ID)); err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("create %s: copy image: %w", rec.ID, err))
	}
	if o.Storage > 0 {
		if err := growFile(m.vmDisk(rec.ID), o.Storage); err != nil {
			return nil, m.abandon(ctx, rec, fmt.Errorf("create %s: %w", rec.ID, err))
		}
	}
	if err := m.writeHostKey(rec.ID, nil); err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("create %s: %w", rec.ID, err))
	}
	// the record about to be committed points at this dir: its entries and
	// its own entry in vms/ must be durable first (a power cut keeps the
	// record and would lose the disk — powercut.TestPowerCutKeepsEveryAcknowledgedWriteOfVmctl)
	if err := m.syncVMDir(rec.ID); err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("create %s: %w", rec.ID, err))
	}
	m.logf("create %s: disk copied", rec.ID)
	created, err := m.editVM(ctx, rec.ID, func(_ *vmIndex, v *VM) error {
		v.State, v.Pid = StateCreated, 0
		return nil
	})
	if err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("create %s: commit: %w", rec.ID, err))
	}
	// created is committed: the ops lock goes, and run's start takes it
	// again, as the field's manager does (cocoon cmd/vm/run.go Run: Create,
	// then Start; hypervisor/cloudhypervisor/create.go commits
	// VMStateCreated). Between the two any verb may take the VM, so a
	// created record is an operation still in flight, not debris.
	ops.Unlock()
	m.logf("create %s: committed created", rec.ID)
	if err := hit(ctx, "vm.create.created", rec.ID); err != nil {
		return nil, err
	}
	out := created
	if o.Start {
		if out, err = m.Start(ctx, rec.ID); err != nil {
			return nil, fmt.Errorf("create %s: %w", rec.ID, err)
		}
	}
	m.logf("create %s: committed %s", rec.ID, out.State)
	if err := hit(ctx, "vm.create.committed", rec.ID); err != nil {
		return nil, err
	}
	return out, nil
}

// abandon undoes a create or clone that failed after its reservation: no VMM
// left, placeholder deleted through the tombstone protocol. The caller still
// holds the ops lock. The original error is returned.
func (m *Manager) abandon(ctx context.Context, rec *VM, cause error) error {
	ctx = context.WithoutCancel(ctx)
	if err := m.deleteVM(ctx, rec.ID, "create failed"); err != nil {
		return fmt.Errorf("%w (cleanup also failed: %v)", cause, err)
	}
	return cause
}

// deleteVM is the tombstoned delete protocol; the caller holds the ops lock.
// Each step is resumable: a crash after the tombstone commit leaves a
// tombstone that rollForwardVM (daemon, gc) completes.
func (m *Manager) deleteVM(ctx context.Context, id, reason string) error {
	var tomb *Tombstone
	err := m.updateVMs(ctx, id, func(ix *vmIndex) error {
		v, ok := ix.VMs[id]
		if !ok {
			return errVMNotFound()
		}
		tomb = &Tombstone{ID: id, Name: v.Name, Dirs: []string{m.vmDir(id), m.vmRunDir(id)}, Pid: v.Pid, Since: now(), Reason: reason}
		for _, n := range v.Network {
			tomb.IPs = append(tomb.IPs, n.IP)
		}
		ix.Tombstones[id] = tomb
		delete(ix.VMs, id)
		if ix.Names[v.Name] == id {
			delete(ix.Names, v.Name)
		}
		return nil
	})
	if err != nil {
		return err
	}
	m.logf("rm %s: tombstoned", id)
	if err := hit(ctx, "vm.rm.tombstoned", id); err != nil {
		return err
	}
	return m.finishVMDelete(ctx, tomb)
}

// finishVMDelete runs the steps after the tombstone: stop every VMM of the VM,
// remove its dirs, drop the tombstone.
func (m *Manager) finishVMDelete(ctx context.Context, tomb *Tombstone) error {
	if err := m.stopVMMs(ctx, tomb.ID, tomb.Pid); err != nil {
		return fmt.Errorf("rm %s: %w", tomb.ID, err)
	}
	m.logf("rm %s: VMM stopped", tomb.ID)
	if err := hit(ctx, "vm.rm.vmm-stopped", tomb.ID); err != nil {
		return err
	}
	for _, d := range tomb.Dirs {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("rm %s: %w", tomb.ID, err)
		}
		// the tombstone goes next: the removal must be durable before it,
		// or a power cut brings back a dir nothing references
		if err := syncDir(filepath.Dir(d)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rm %s: %w", tomb.ID, err)
		}
	}
	if err := m.removeVMMCgroup(tomb.ID); err != nil {
		return fmt.Errorf("rm %s: %w", tomb.ID, err)
	}
	err := m.updateVMs(ctx, tomb.ID, func(ix *vmIndex) error {
		return dropTombstone(ix.Tombstones, tomb.ID)
	})
	if err := ignoreNoChange(err); err != nil {
		return err
	}
	m.logf("rm %s: done", tomb.ID)
	return hit(ctx, "vm.rm.done", tomb.ID)
}

// opsLock takes the VM's ops lock, waiting for the current holder.
func (m *Manager) opsLock(ctx context.Context, id string) (*flock, error) {
	if !validID(id) {
		return nil, fmt.Errorf("bad vm id %q", id)
	}
	l, err := lockFile(ctx, m.opsLockPath(id), exclusive, true)
	if err != nil {
		return nil, fmt.Errorf("vm %s: ops lock: %w", id, err)
	}
	return l, nil
}

// lockedVM resolves ref, takes its ops lock and re-reads the record under it.
func (m *Manager) lockedVM(ctx context.Context, ref string) (*VM, *flock, error) {
	v, err := m.resolveVM(ref)
	if err != nil {
		return nil, nil, err
	}
	l, err := m.opsLock(ctx, v.ID)
	if err != nil {
		return nil, nil, err
	}
	v, err = m.resolveVM(v.ID)
	if err != nil {
		l.Unlock()
		return nil, nil, err
	}
	return v, l, nil
}

// setVM commits fn's change to record id.
func (m *Manager) setVM(ctx context.Context, id string, fn func(v *VM)) (*VM, error) {
	return m.editVM(ctx, id, func(_ *vmIndex, v *VM) error {
		fn(v)
		return nil
	})
}

// editVM is setVM for a change that reads the rest of the index (address
// allocation) or can fail; fn's error commits nothing. Either way the record
// gets a new UpdatedAt and the caller a copy.
func (m *Manager) editVM(ctx context.Context, id string, fn func(ix *vmIndex, v *VM) error) (*VM, error) {
	var out VM
	err := m.updateVMs(ctx, id, func(ix *vmIndex) error {
		v, ok := ix.VMs[id]
		if !ok {
			return errVMNotFound()
		}
		if err := fn(ix, v); err != nil {
			return err
		}
		v.UpdatedAt = now()
		out = *v
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Start boots a VM's VMM. Idempotent: a live VMM is adopted as is; a
// record left running by a dead VMM is booted again from its disk.
func (m *Manager) Start(ctx context.Context, ref string) (*VM, error) {
	v, l, err := m.lockedVM(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer l.Unlock()
	if err := hit(ctx, "vm.start.locked", v.ID); err != nil {
		return nil, err
	}
	if v.State == StateCreating {
		return nil, fmt.Errorf("start: "+MsgVMNotRunningState, v.ID, v.State)
	}
	if pids := m.vmmPids(v.ID, v.Pid); len(pids) > 0 {
		// A live VMM may still be Paused by a dead capture: started means
		// running, and we hold the lock, so that pause has no owner.
		c := chapi.New(m.apiSocket(v.ID))
		actx, cancel := context.WithTimeout(ctx, apiTimeout())
		defer cancel()
		if info, err := c.Info(actx); err == nil && info.State == chapi.StatePaused {
			if err := m.convergeOrphanedPause(actx, c, v.ID); err != nil {
				return nil, fmt.Errorf("start: %w", err)
			}
		}
		if v.State == StateRunning && v.Pid == pids[0] {
			return m.view(v, false), nil
		}
		m.logf("start %s: adopting live VMM %d", v.ID, pids[0])
		return m.setVM(ctx, v.ID, func(r *VM) { r.State, r.Pid, r.Reason = StateRunning, pids[0], "" })
	}
	m.logf("start %s: booting", v.ID)
	pid, err := m.bootVMM(ctx, v)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", v.ID, err)
	}
	m.logf("start %s: VMM %d running", v.ID, pid)
	if err := hit(ctx, "vm.start.booted", v.ID); err != nil {
		return nil, err
	}
	return m.setVM(ctx, v.ID, func(r *VM) { r.State, r.Pid, r.Reason = StateRunning, pid, "" })
}

// Stop shuts a VM's VMM down (vmm.shutdown, then SIGKILL after timeout or
// at once with force) and records it stopped.
func (m *Manager) Stop(ctx context.Context, ref string, force bool, timeout time.Duration) (*VM, error) {
	v, l, err := m.lockedVM(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer l.Unlock()
	if v.State == StateCreating {
		return nil, fmt.Errorf("stop: "+MsgVMNotRunningState, v.ID, v.State)
	}
	if !force && m.vmmAlive(v) {
		m.gracefulStop(ctx, v, timeout)
	}
	if err := m.stopVMMs(ctx, v.ID, v.Pid); err != nil {
		return nil, fmt.Errorf("stop %s: %w", v.ID, err)
	}
	m.logf("stop %s: stopped", v.ID)
	if err := hit(ctx, "vm.stop.vmm-stopped", v.ID); err != nil {
		return nil, err
	}
	return m.setVM(ctx, v.ID, func(r *VM) { r.State, r.Pid, r.Reason = StateStopped, 0, "stopped" })
}

func (m *Manager) gracefulStop(ctx context.Context, v *VM, timeout time.Duration) {
	fd, err := unix.PidfdOpen(v.Pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if !m.isOurVMM(v.Pid, v.ID) {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := chapi.New(m.apiSocket(v.ID)).ShutdownVMM(sctx); err != nil {
		return
	}
	_ = waitPidfd(sctx, fd, v.Pid)
}

// Remove deletes VMs. A running VM needs force. The ops lock is taken
// blocking: rm of a VM some operation owns waits for it (never use rm to
// collect a stale create; that is reconcile-stale-create's job).
func (m *Manager) Remove(ctx context.Context, ref string, force bool) error {
	v, err := m.resolveVM(ref)
	if errors.Is(err, ErrVMNotFound) {
		return m.finishInterruptedDelete(ctx, ref, err)
	}
	if err != nil {
		return err
	}
	if !force && v.State == StateRunning && m.vmmAlive(v) {
		return fmt.Errorf("rm: vm %s is running: stop it first or use --force", v.ID)
	}
	l, err := m.opsLock(ctx, v.ID)
	if err != nil {
		return err
	}
	defer l.Unlock()
	return m.deleteVM(ctx, v.ID, "rm")
}

// finishInterruptedDelete completes the tombstoned delete of ref (id or
// name) left by an rm that died, so rm is idempotent across crashes: the VMM
// is stopped, the dirs removed, the tombstone dropped. A name can carry more
// than one such delete (each hibernate/wake cycle gives it a new id); all of
// them are finished. With no tombstone it returns notFound.
func (m *Manager) finishInterruptedDelete(ctx context.Context, ref string, notFound error) error {
	tombs := func() (map[string]*Tombstone, error) {
		ix, err := m.loadVMs()
		if err != nil {
			return nil, err
		}
		return ix.Tombstones, nil
	}
	return finishEveryTombstone(ref, notFound, tombs, func(t *Tombstone) error { return m.finishTombstoned(ctx, t) })
}

// finishTombstoned finishes one interrupted delete under its ops lock.
func (m *Manager) finishTombstoned(ctx context.Context, tomb *Tombstone) error {
	l, err := m.opsLock(ctx, tomb.ID)
	if err != nil {
		return err
	}
	defer l.Unlock()
	ix, err := m.loadVMs()
	if err != nil {
		return err
	}
	if _, ok := ix.Tombstones[tomb.ID]; !ok {
		return nil // its owner finished it while we waited
	}
	m.logf("rm %s: finishing an interrupted delete", tomb.ID)
	return m.finishVMDelete(ctx, tomb)
}

// view is the display shape: a running record whose VMM is dead reads
// "stopped (stale)"; that is never written back.
func (m *Manager) view(v *VM, askVMM bool) *VM {
	c := *v
	c.State = m.reconciledState(v)
	if askVMM && c.State == StateRunning {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if info, err := chapi.New(m.apiSocket(v.ID)).Info(ctx); err == nil {
			c.VMMState = info.State
		} else {
			c.VMMState = "unknown"
		}
	}
	return &c
}

func (m *Manager) reconciledState(v *VM) string {
	if v.State == StateRunning && !m.vmmAlive(v) {
		return StateStale
	}
	return v.State
}

// Inspect returns one VM, asking its VMM for its state (a Paused VMM shows
// as vmm_state "Paused" while the record reads running).
func (m *Manager) Inspect(ctx context.Context, ref string) (*VM, error) {
	v, err := m.resolveVM(ref)
	if err != nil {
		return nil, err
	}
	return m.view(v, true), nil
}

// List returns every VM record, oldest first.
func (m *Manager) List(ctx context.Context) ([]*VM, error) {
	ix, err := m.loadVMs()
	if err != nil {
		return nil, err
	}
	return m.listFrom(ix), nil
}

func (m *Manager) listFrom(ix *vmIndex) []*VM {
	out := make([]*VM, 0, len(ix.VMs))
	for _, v := range ix.VMs {
		out = append(out, m.view(v, false))
	}
	sortVMs(out)
	return out
}

func sortVMs(vs []*VM) {
	sort.Slice(vs, func(i, j int) bool {
		if !vs[i].CreatedAt.Equal(vs[j].CreatedAt) {
			return vs[i].CreatedAt.Before(vs[j].CreatedAt)
		}
		return vs[i].ID < vs[j].ID
	})
}

func absPath(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%w: empty path", ErrUsage)
	}
	if strings.HasPrefix(p, "/") {
		return p, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return wd + "/" + p, nil
}

// copyFile copies src to dst (reflink where the filesystem can) and fsyncs it.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: fsync: %w", dst, err)
	}
	return out.Close()
}

// growFile extends a disk to size bytes (sparse), whatever the image.
func growFile(path string, size int64) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Size() < size {
		if err := os.Truncate(path, size); err != nil {
			return fmt.Errorf("grow disk: %w", err)
		}
	}
	return nil
}

// Durable sync of a dir after creating files in it.
var syncDir = durable.SyncDir

// syncVMDir makes a VM dir's entries and its own entry in vms/ durable.
func (m *Manager) syncVMDir(id string) error {
	if err := syncDir(m.vmDir(id)); err != nil {
		return err
	}
	return syncDir(filepath.Dir(m.vmDir(id)))
}

// sleepRaw is the one timer of the package; callers pass scaled durations.
func sleepRaw(ctx context.Context, d time.Duration) error { return timescale.SleepRaw(ctx, d) }
