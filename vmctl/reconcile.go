package vmctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/regress"
)

// ReconcileStaleCreate collects a creating placeholder whose owner is gone.
// A free ops lock is the proof: create and clone hold it from the moment the
// placeholder is written until the final commit, and the kernel releases it
// when the owner dies. So the lock is only ever try-locked: a blocking wait
// would queue behind a live clone and then delete the VM it just created
// (seed 002). Outcomes: busy, not-found, not-creating, collected.
func (m *Manager) ReconcileStaleCreate(ctx context.Context, ref string) (StaleCreateResult, error) {
	res := StaleCreateResult{ID: ref}
	v, err := m.resolveVM(ref)
	if errors.Is(err, ErrVMNotFound) {
		res.Outcome = OutcomeNotFound
		return res, nil
	}
	if err != nil {
		return res, err
	}
	res.ID = v.ID
	block := regress.On("stale-create-blocking-lock")
	l, err := lockFile(ctx, m.opsLockPath(v.ID), exclusive, block)
	if errors.Is(err, ErrLocked) {
		res.Outcome = OutcomeBusy
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("reconcile-stale-create %s: %w", v.ID, err)
	}
	defer l.Unlock()
	v, err = m.resolveVM(v.ID)
	if errors.Is(err, ErrVMNotFound) {
		res.Outcome = OutcomeNotFound
		return res, nil
	}
	if err != nil {
		return res, err
	}
	// The bug deletes whatever it finds once it has the lock, even a VM
	// whose clone committed it running while we waited.
	if v.State != StateCreating && !block {
		res.Outcome = OutcomeNotCreating
		return res, nil
	}
	if err := m.stopVMMs(ctx, v.ID, v.Pid); err != nil {
		return res, fmt.Errorf("reconcile-stale-create %s: %w", v.ID, err)
	}
	if err := m.deleteVM(ctx, v.ID, "stale create collected"); err != nil {
		return res, fmt.Errorf("reconcile-stale-create %s: %w", v.ID, err)
	}
	res.Outcome = OutcomeCollected
	return res, nil
}

// DaemonPass runs one supervision pass: collect ownerless creating records
// (the reconcile-stale-create code path), record dead VMMs as stopped with
// reason unexpected-exit, roll tombstoned deletes forward. Records some live
// operation holds are left alone.
func (m *Manager) DaemonPass(ctx context.Context) (PassReport, error) {
	var rep PassReport
	ix, err := m.loadVMs()
	if err != nil {
		return rep, err
	}
	for _, v := range m.listFrom(ix) {
		switch {
		case v.State == StateCreating:
			r, err := m.ReconcileStaleCreate(ctx, v.ID)
			switch {
			case err != nil:
				rep.Errors = append(rep.Errors, err.Error())
			case r.Outcome == OutcomeCollected:
				m.logf("daemon: collected ownerless creating VM %s", v.ID)
				rep.Collected = append(rep.Collected, v.ID)
			case r.Outcome == OutcomeBusy:
				rep.Busy = append(rep.Busy, v.ID)
			}
		case v.State == StateRunning && len(v.Ejecting) > 0:
			ok, err := m.finishNet(ctx, v.ID)
			if err != nil {
				rep.Errors = append(rep.Errors, err.Error())
			} else if ok {
				m.logf("daemon: VM %s: finished an interrupted NIC change", v.ID)
				rep.NetFinished = append(rep.NetFinished, v.ID)
			}
		case v.State == StateStale:
			ok, err := m.convergeDead(ctx, v.ID)
			if err != nil {
				rep.Errors = append(rep.Errors, err.Error())
			} else if ok {
				m.logf("daemon: VM %s VMM died: recorded stopped (unexpected-exit)", v.ID)
				rep.Converged = append(rep.Converged, v.ID)
			}
		}
	}
	for id, pids := range m.findVMMs() {
		v, ok := ix.VMs[id]
		if !ok || (v.State != StateStopped && v.State != StateCreated) {
			continue
		}
		adopted, err := m.adoptLive(ctx, id, pids[0])
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
		} else if adopted {
			m.logf("daemon: VM %s has a live VMM %d: recorded running", id, pids[0])
			rep.Adopted = append(rep.Adopted, id)
		}
	}
	rolled, errs := m.rollForward(ctx)
	rep.RolledVMs, rep.RolledSnaps = rolled.vms, rolled.snaps
	rep.Errors = append(rep.Errors, errs...)
	// A save that died after its pending record (an operator's, killed)
	// leaves the record holding the name with its build lease free, and
	// its staging: the agent collects only its own saves, so without this
	// nothing but a manual gc ever would.
	dead, err := m.collectDeadSaves(ctx)
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	}
	rep.DeadSaves = dead
	if err := hit(ctx, "daemon.pass", ""); err != nil {
		return rep, err
	}
	return rep, nil
}

// finishNet completes a NIC change whose vm net died (or failed) after it
// recorded the ids to eject: its target is already the record's Network, so
// the change is that verb run again, as its error message asks of whoever
// ran it; the agent reruns its own, an operator's was left to nobody. Only
// when no operation holds the VM.
func (m *Manager) finishNet(ctx context.Context, id string) (bool, error) {
	return m.ifIdle(ctx, id, func(v *VM) (bool, error) {
		if v.State != StateRunning || len(v.Ejecting) == 0 || !m.vmmAlive(v) {
			return false, nil
		}
		if _, err := m.netLocked(ctx, v, len(v.Network)); err != nil {
			return false, fmt.Errorf("daemon: finish the NIC change of %s: %w", id, err)
		}
		return true, nil
	})
}

// collectDeadSaves removes the pending snapshots whose build lease is free
// (SnapshotRemove takes it exclusive without waiting: a live save keeps its
// record) and the staging dirs of dead builds.
func (m *Manager) collectDeadSaves(ctx context.Context) ([]string, error) {
	sx, err := m.loadSnaps()
	if err != nil {
		return nil, fmt.Errorf("daemon: dead saves: %w", err)
	}
	var out []string
	for id, s := range sx.Snapshots {
		if s.State != SnapPending {
			continue
		}
		if err := m.SnapshotRemove(ctx, id); err == nil {
			m.logf("daemon: removed pending snapshot %s (%s) of a dead save", id, s.Name)
			out = append(out, id)
		}
	}
	return append(out, m.collectDeadStaging(ctx, sx)...), nil
}

// convergeDead records a running VM whose VMM is dead as stopped, if no
// operation owns it right now.
func (m *Manager) convergeDead(ctx context.Context, id string) (bool, error) {
	return m.ifIdle(ctx, id, func(v *VM) (bool, error) {
		if v.State != StateRunning || m.vmmAlive(v) {
			return false, nil
		}
		if err := m.stopVMMs(ctx, id, 0); err != nil {
			return false, err
		}
		_, err := m.setVM(ctx, id, func(r *VM) { r.State, r.Pid, r.Reason = StateStopped, 0, "unexpected-exit" })
		return err == nil, err
	})
}

// adoptLive records a stopped VM whose VMM is alive as running: a start
// that died between launching the VMM and its commit wanted exactly that.
func (m *Manager) adoptLive(ctx context.Context, id string, pid int) (bool, error) {
	return m.ifIdle(ctx, id, func(v *VM) (bool, error) {
		if (v.State != StateStopped && v.State != StateCreated) || !m.isOurVMM(pid, id) {
			return false, nil
		}
		_, err := m.setVM(ctx, id, func(r *VM) { r.State, r.Pid, r.Reason = StateRunning, pid, "adopted live VMM" })
		return err == nil, err
	})
}

// ifIdle runs fix on a fresh copy of id's record under its ops lock. The
// daemon's repairs never wait: a VM some operation owns right now, or one
// gone by the time the lock is held, is skipped (false, nil).
func (m *Manager) ifIdle(ctx context.Context, id string, fix func(v *VM) (bool, error)) (bool, error) {
	l, err := lockFile(ctx, m.opsLockPath(id), exclusive, false)
	if errors.Is(err, ErrLocked) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer l.Unlock()
	v, err := m.resolveVM(id)
	if err != nil {
		return false, nil
	}
	return fix(v)
}

type rolledIDs struct{ vms, snaps []string }

// rollForward completes every tombstoned delete whose owner is gone.
func (m *Manager) rollForward(ctx context.Context) (rolledIDs, []string) {
	var out rolledIDs
	var errs []string
	if ix, err := m.loadVMs(); err != nil {
		errs = append(errs, err.Error())
	} else {
		for id, t := range ix.Tombstones {
			if !validID(id) {
				continue
			}
			l, err := lockFile(ctx, m.opsLockPath(id), exclusive, false)
			if err != nil {
				continue // a live rm still owns it
			}
			tc := *t
			if err := m.finishVMDelete(ctx, &tc); err != nil {
				errs = append(errs, err.Error())
			} else {
				m.logf("rolled forward delete of VM %s", id)
				out.vms = append(out.vms, id)
			}
			l.Unlock()
		}
	}
	if ix, err := m.loadSnaps(); err != nil {
		errs = append(errs, err.Error())
	} else {
		for id, t := range ix.Tombstones {
			if !validID(id) {
				continue
			}
			l, err := lockFile(ctx, m.leasePath(id), exclusive, false)
			if err != nil {
				continue
			}
			tc := *t
			if err := m.finishSnapDelete(ctx, &tc); err != nil {
				errs = append(errs, err.Error())
			} else {
				m.logf("rolled forward delete of snapshot %s", id)
				out.snaps = append(out.snaps, id)
			}
			l.Unlock()
		}
	}
	return out, errs
}

// minInterval floors the daemon and status intervals: a scale applied
// twice (a caller passing an already scaled value) must not become a busy
// loop over /proc and the indexes.
const minInterval = 10 * time.Millisecond

// ErrDaemonRunning is returned when another daemon holds the instance lock.
var ErrDaemonRunning = errors.New("vmctl daemon already running")

// Daemon runs supervision passes every interval (already scaled by the caller)
// until ctx ends. One instance per root dir (flock).
func (m *Manager) Daemon(ctx context.Context, interval time.Duration) error {
	l, err := lockFile(ctx, m.daemonLock(), exclusive, false)
	if errors.Is(err, ErrLocked) {
		return fmt.Errorf("%w (lock %s held)", ErrDaemonRunning, m.daemonLock())
	}
	if err != nil {
		return err
	}
	defer l.Unlock()
	interval = max(interval, minInterval)
	m.logf("daemon: supervising %s every %s", m.cfg.RootDir, interval)
	for {
		rep, err := m.DaemonPass(ctx)
		if err != nil {
			m.logf("daemon: pass failed: %v", err)
		}
		for _, e := range rep.Errors {
			m.logf("daemon: %s", e)
		}
		if err := sleepRaw(ctx, interval); err != nil {
			return nil
		}
	}
}

// collectDeadStaging removes the staging dirs of builds that died before
// their pending record existed (a save SIGKILLed or SIGPIPEd mid-capture):
// the lease is free (a live builder holds it from before its staging dir
// exists) and no record names the id (a record's staging goes with snapshot
// rm). Nothing else would ever reclaim that copy of the guest's memory.
func (m *Manager) collectDeadStaging(ctx context.Context, sx *snapIndex) []string {
	var out []string
	ents, err := os.ReadDir(m.stagingDir())
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if !validID(e.Name()) {
			continue
		}
		l, err := lockFile(ctx, m.leasePath(e.Name()), exclusive, false)
		if err != nil {
			continue
		}
		if _, ok := sx.Snapshots[e.Name()]; !ok {
			if err := os.RemoveAll(m.stagingFor(e.Name())); err == nil {
				m.logf("removed staging dir of dead build %s", e.Name())
				out = append(out, e.Name())
			}
		}
		l.Unlock()
	}
	return out
}

// GC rolls tombstones forward, removes pending snapshots and staging dirs
// whose lease is free, and dirs (and VMMs) of VM ids no record or tombstone
// references whose ops lock is free.
func (m *Manager) GC(ctx context.Context) (GCReport, error) {
	var rep GCReport
	rolled, errs := m.rollForward(ctx)
	rep.RolledVMs, rep.RolledSnaps, rep.Errors = rolled.vms, rolled.snaps, errs
	sx, err := m.loadSnaps()
	if err != nil {
		return rep, err
	}
	for id, s := range sx.Snapshots {
		if s.State != SnapPending {
			continue
		}
		if err := m.SnapshotRemove(ctx, id); err == nil {
			m.logf("gc: removed stale pending snapshot %s (%s)", id, s.Name)
			rep.Pending = append(rep.Pending, id)
		}
	}
	rep.Staging = m.collectDeadStaging(ctx, sx)
	m.deadCaptures(ctx, func(vmID, sid, dir string) {
		if err := os.RemoveAll(dir); err == nil {
			m.logf("gc: removed capture %s of a dead save of vm %s", sid, vmID)
			rep.Staging = append(rep.Staging, sid)
		}
	})
	vx, err := m.loadVMs()
	if err != nil {
		return rep, err
	}
	rep.Restores = m.removeSpentRestores(ctx, vx)
	candidates := map[string]bool{}
	for _, dir := range []string{m.vmsDir(), m.cfg.RunDir} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if validID(e.Name()) {
				candidates[e.Name()] = true
			}
		}
	}
	for id := range m.findVMMs() {
		if validID(id) {
			candidates[id] = true
		}
	}
	for id := range candidates {
		if _, ok := vx.VMs[id]; ok {
			continue
		}
		if _, ok := vx.Tombstones[id]; ok {
			continue
		}
		l, err := lockFile(ctx, m.opsLockPath(id), exclusive, false)
		if err != nil {
			continue // an operation is reserving it right now
		}
		// Re-read under the lock: a create that reserved after our read
		// holds the lock, so a record appearing now is impossible; check
		// anyway, it is cheap.
		if cur, err := m.loadVMs(); err == nil {
			if _, ok := cur.VMs[id]; ok {
				l.Unlock()
				continue
			}
		}
		if err := m.stopVMMs(ctx, id, 0); err != nil {
			rep.Errors = append(rep.Errors, err.Error())
		} else {
			_ = os.RemoveAll(m.vmDir(id))
			_ = os.RemoveAll(m.vmRunDir(id))
			m.logf("gc: removed unreferenced VM dirs %s", id)
			rep.Orphans = append(rep.Orphans, id)
		}
		l.Unlock()
	}
	rep.Cgroups = m.gcCgroups(func(id string) bool {
		_, rec := vx.VMs[id]
		_, tomb := vx.Tombstones[id]
		return rec || tomb
	})
	rep.TempFile = m.removeTempIndexFiles(ctx)
	return rep, nil
}

// removeSpentRestores deletes the restore copy of every VM committed past
// creating: a clone removes it once the guest runs, but that removal is not
// durable, so a power cut right after it brings the copy (the guest's whole
// memory) back, and nothing else would ever remove it. A VM still creating
// is left alone (its clone may be reading the copy); the ops lock, taken
// without waiting, keeps a live operation's copy too.
func (m *Manager) removeSpentRestores(ctx context.Context, vx *vmIndex) []string {
	var out []string
	for id, v := range vx.VMs {
		if v.State == StateCreating {
			continue
		}
		if _, err := os.Stat(m.restoreDir(id)); err != nil {
			continue
		}
		l, err := lockFile(ctx, m.opsLockPath(id), exclusive, false)
		if err != nil {
			continue
		}
		if err := os.RemoveAll(m.restoreDir(id)); err == nil {
			_ = durable.SyncDir(m.vmDir(id))
			m.logf("gc: removed the spent restore copy of vm %s", id)
			out = append(out, id)
		}
		l.Unlock()
	}
	return out
}

// removeTempIndexFiles deletes temp files of index commits that died before
// their rename, under the index locks so no live commit loses its file.
func (m *Manager) removeTempIndexFiles(ctx context.Context) []string {
	var out []string
	for _, ix := range []struct{ path, lock string }{{m.vmIndexPath(), m.vmIndexLock()}, {m.snapIndexPath(), m.snapIndexLock()}} {
		l, err := lockFile(ctx, ix.lock, exclusive, true)
		if err != nil {
			continue
		}
		matches, _ := filepath.Glob(filepath.Join(m.cfg.RootDir, "."+filepath.Base(ix.path)+".tmp-*"))
		for _, p := range matches {
			if strings.Contains(p, ".tmp-") && os.Remove(p) == nil {
				out = append(out, p)
			}
		}
		l.Unlock()
	}
	return out
}
