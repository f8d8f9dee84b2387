package vmctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/durable"
)

// CloneOptions are the flags of `vm clone`. NICs < 0 means as many as the
// snapshot's source VM had.
type CloneOptions struct {
	Name     string
	NICs     int
	Snapshot string
}

func (m *Manager) restoreDir(id string) string { return filepath.Join(m.vmDir(id), "restore") }

// Clone restores a snapshot into a new VM: placeholder reserved under the ops
// lock, snapshot files copied into the VM's own dirs, VMM launched with only
// --api-socket, vm.restore, NICs replaced, vm.resume, record committed
// running. The VMM is alive while the record still says creating; the clone
// holds the ops lock throughout, which is what tells a live clone from a dead
// one's placeholder.
func (m *Manager) Clone(ctx context.Context, o CloneOptions) (*VM, error) {
	s, err := m.resolveSnap(o.Snapshot)
	if err != nil {
		return nil, err
	}
	if s.State != SnapReady {
		return nil, fmt.Errorf("clone: snapshot %s is %s", s.ID, s.State)
	}
	// Readers hold the lease shared: snapshot rm refuses while we copy.
	lease, err := m.readLease(ctx, "clone", s.ID)
	if err != nil {
		return nil, err
	}
	defer lease.Unlock()
	if s, err = m.resolveSnap(s.ID); err != nil {
		return nil, err
	}
	meta, rec, ops, err := m.reserveClone(ctx, o, s)
	if err != nil {
		return nil, err
	}
	defer ops.Unlock()
	m.logf("clone %s: reserved (name %s, snapshot %s)", rec.ID, rec.Name, s.ID)
	if err := hit(ctx, "vm.clone.reserved", rec.ID); err != nil {
		return nil, m.abandon(ctx, rec, err)
	}
	if err := m.cloneFiles(rec, s.Dir, meta); err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("clone %s: %w", rec.ID, err))
	}
	m.logf("clone %s: files copied", rec.ID)
	if err := hit(ctx, "vm.clone.files-copied", rec.ID); err != nil {
		return nil, m.abandon(ctx, rec, err)
	}
	pid, c, err := m.launchVMM(ctx, rec.ID, nil)
	if err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("clone %s: %w", rec.ID, err))
	}
	m.logf("clone %s: VMM %d launched", rec.ID, pid)
	if err := hit(ctx, "vm.clone.vmm-launched", rec.ID); err != nil {
		return nil, m.abandon(ctx, rec, err)
	}
	actx, cancel := context.WithTimeout(ctx, apiTimeout())
	defer cancel()
	if err := c.Restore(actx, chapi.RestoreConfig{SourceURL: "file://" + m.restoreDir(rec.ID)}); err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("clone %s: restore: %w%s", rec.ID, err, logTail(m.vmRunDir(rec.ID)+"/vmm.log")))
	}
	m.logf("clone %s: restored", rec.ID)
	if err := hit(ctx, "vm.clone.restored", rec.ID); err != nil {
		return nil, m.abandon(ctx, rec, err)
	}
	nics, err := replaceNICs(actx, c, rec.Network)
	if err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("clone %s: %w", rec.ID, err))
	}
	if err := c.Resume(actx, true); err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("clone %s: resume: %w", rec.ID, err))
	}
	m.logf("clone %s: resumed", rec.ID)
	if err := hit(ctx, "vm.clone.resumed", rec.ID); err != nil {
		return nil, m.abandon(ctx, rec, err)
	}
	out, err := m.setVM(ctx, rec.ID, func(v *VM) { v.State, v.Pid, v.Network = StateRunning, pid, nics })
	if err != nil {
		return nil, m.abandon(ctx, rec, fmt.Errorf("clone %s: commit: %w", rec.ID, err))
	}
	m.logf("clone %s: committed running", rec.ID)
	// The restore copy (memory, state) is spent once the guest runs.
	_ = os.RemoveAll(m.restoreDir(rec.ID))
	if err := hit(ctx, "vm.clone.committed", rec.ID); err != nil {
		return nil, err
	}
	return out, nil
}

// reserveClone reads snapshot s's metadata and reserves the clone's record
// with the snapshot's config (o.NICs NICs when given).
func (m *Manager) reserveClone(ctx context.Context, o CloneOptions, s *Snapshot) (*snapMeta, *VM, *flock, error) {
	meta, err := readMeta(s.Dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("clone %s: %w", s.ID, err)
	}
	cfg := meta.Config
	if o.NICs >= 0 {
		cfg.NICs = o.NICs
	}
	// A clone under the name the snapshot was taken from (a wake) is the
	// same guest, whose RAM still holds that name's address: in tap mode it
	// must get the same slots, even in a store that never saw the name.
	var prefer []NIC
	if o.Name != "" && o.Name == meta.SourceName {
		prefer = meta.NICs
	}
	rec, ops, err := m.reserve(ctx, o.Name, cfg, prefer)
	if err != nil {
		return nil, nil, nil, err
	}
	return meta, rec, ops, nil
}

// cloneFiles copies a snapshot into VM id's dirs: its own disk, and a
// restore dir whose config.json points at that disk and carries no NICs (the
// source's addresses may still be live; the clone's are added after restore).
// A cloud-init seed disk (tap mode) is pointed at the clone's own seed,
// written fresh for the clone's name and NICs: the restored guest does not
// read it again, but a later cold boot of the clone does.
func (m *Manager) cloneFiles(rec *VM, snapDir string, meta *snapMeta) error {
	id := rec.ID
	rd := m.restoreDir(id)
	if err := os.MkdirAll(rd, 0o755); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(snapDir, snapDiskFile), m.vmDisk(id)); err != nil {
		return err
	}
	// The restored guest runs with the source's host key; a snapshot that
	// carries none gets a new one, which its guest learns on a cold boot.
	var hk []byte
	if meta.HostKey != "" {
		hk = []byte(meta.HostKey)
	}
	if err := m.writeHostKey(id, hk); err != nil {
		return err
	}
	for _, f := range []string{"state.json", "memory-ranges"} {
		src := filepath.Join(snapDir, f)
		if _, err := os.Stat(src); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := copyFile(src, filepath.Join(rd, f)); err != nil {
			return err
		}
	}
	b, err := os.ReadFile(filepath.Join(snapDir, "config.json"))
	if err != nil {
		return fmt.Errorf("snapshot config: %w", err)
	}
	b, hasSeed, err := rewriteConfig(b, m.vmDisk(id), m.vmSeed(id))
	if err != nil {
		return err
	}
	if hasSeed {
		if err := m.writeSeed(rec); err != nil {
			return fmt.Errorf("seed: %w", err)
		}
	}
	if err := durable.WriteFile(filepath.Join(rd, "config.json"), b, 0o600); err != nil {
		return err
	}
	return m.syncVMDir(id)
}

// rewriteConfig points the first disk at disk, a later disk that is a
// cloud-init seed (named cidata.img) at seed, and drops the NICs, keeping
// every other field of CH's VmConfig as it was. It reports whether a seed
// disk was there.
func rewriteConfig(b []byte, disk, seed string) ([]byte, bool, error) {
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, false, fmt.Errorf("snapshot config.json: %w", err)
	}
	disks, _ := cfg["disks"].([]any)
	if len(disks) == 0 {
		return nil, false, fmt.Errorf("snapshot config.json: no disk")
	}
	d0, ok := disks[0].(map[string]any)
	if !ok {
		return nil, false, fmt.Errorf("snapshot config.json: malformed disk")
	}
	d0["path"] = disk
	hasSeed := false
	for _, d := range disks[1:] {
		dm, ok := d.(map[string]any)
		if !ok {
			return nil, false, fmt.Errorf("snapshot config.json: malformed disk")
		}
		if p, _ := dm["path"].(string); filepath.Base(p) == seedFile {
			dm["path"] = seed
			hasSeed = true
		}
	}
	delete(cfg, "net")
	out, err := json.Marshal(cfg)
	return out, hasSeed, err
}

// replaceNICs removes every NIC the restored VMM's config has and adds
// want, under ids its device tree does not hold: the tree comes from the
// snapshot and still holds the source's NICs (and any whose eject was
// pending), which CH neither removes nor lets an id be reused for. It
// returns want with the ids the VMM was given.
func replaceNICs(ctx context.Context, c *chapi.Client, want []NIC) ([]NIC, error) {
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("nics: %w", err)
	}
	for _, n := range info.Config.Net {
		if err := c.RemoveDevice(ctx, n.ID); err != nil {
			return nil, fmt.Errorf("nics: remove %s: %w", n.ID, err)
		}
	}
	want = uniqueNICs(info.DeviceTree, want)
	for _, n := range want {
		if _, err := c.AddNet(ctx, netConfig(n)); err != nil {
			return nil, fmt.Errorf("nics: add %s: %w", n.ID, err)
		}
	}
	return want, nil
}
