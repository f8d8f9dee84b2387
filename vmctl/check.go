package vmctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/timescale"
)

// Check verifies the store's consistency invariants, read-only except for
// momentary try-locks (released at once): indexes loadable and consistent,
// no tombstone, no creating record without a live ops-lock holder, no pending
// snapshot without a live lease holder, no VMM without a record, no running
// record with a dead VMM, no VMM Paused under a running record, every record
// with its data, no leftover staging dirs, sockets or unreferenced dirs.
func (m *Manager) Check(ctx context.Context) CheckReport {
	var rep CheckReport
	add := func(inv, format string, a ...any) {
		rep.Violations = append(rep.Violations, Violation{Invariant: inv, Evidence: fmt.Sprintf(format, a...)})
	}
	vx, err := m.loadVMs()
	if err != nil {
		add("store-loadable", "%v", err)
	}
	sx, err := m.loadSnaps()
	if err != nil {
		add("store-loadable", "%v", err)
	}
	if vx != nil {
		m.checkVMRecords(ctx, vx, add)
		m.checkVMLeftovers(ctx, vx, add)
	}
	if sx != nil {
		m.checkSnapRecords(ctx, sx, add)
		m.checkSnapLeftovers(ctx, sx, add)
	}
	sort.Slice(rep.Violations, func(i, j int) bool {
		if rep.Violations[i].Invariant != rep.Violations[j].Invariant {
			return rep.Violations[i].Invariant < rep.Violations[j].Invariant
		}
		return rep.Violations[i].Evidence < rep.Violations[j].Evidence
	})
	rep.OK = len(rep.Violations) == 0
	if rep.Violations == nil {
		rep.Violations = []Violation{}
	}
	return rep
}

// addViolation records one violation of invariant inv.
type addViolation func(inv, format string, a ...any)

// checkVMRecords checks each VM record: one per name, the name index
// agreeing, a creating record with a live owner, its disk once past
// creating, and a running record's VMM alive and not Paused.
func (m *Manager) checkVMRecords(ctx context.Context, vx *vmIndex, add addViolation) {
	names := map[string]string{}
	for id, v := range vx.VMs {
		if other, dup := names[v.Name]; dup {
			add("one-vm-per-name", "name %q held by %s and %s", v.Name, other, id)
		}
		names[v.Name] = id
		if vx.Names[v.Name] != id {
			add("indexes-consistent", "vm %s name %q maps to %q", id, v.Name, vx.Names[v.Name])
		}
		if v.State == StateCreating {
			if l, err := lockFile(ctx, m.opsLockPath(id), exclusive, false); err == nil {
				l.Unlock()
				add("no-orphan-creating", "vm %s (%s) is creating with a free ops lock", id, v.Name)
			}
		}
		// A record past creating is a promise that its disk exists: a
		// power cut must never keep the record and lose the disk.
		if v.State != StateCreating {
			if _, err := os.Stat(m.vmDisk(id)); err != nil {
				add("vm-data", "vm %s (%s) is %s but its disk: %v", id, v.Name, v.State, err)
			}
		}
		if v.State == StateRunning {
			m.checkRunningVMM(ctx, id, v, add)
		}
	}
	for name, id := range vx.Names {
		if v, ok := vx.VMs[id]; !ok || v.Name != name {
			add("indexes-consistent", "vm name %q maps to %s without a matching record", name, id)
		}
	}
	for id := range vx.Tombstones {
		add("no-tombstone", "vm tombstone %s", id)
	}
}

// checkRunningVMM checks that a running record's VMM is alive and not
// Paused.
func (m *Manager) checkRunningVMM(ctx context.Context, id string, v *VM, add addViolation) {
	if !m.vmmAlive(v) {
		add("no-running-with-dead-vmm", "vm %s record running, VMM pid %d dead", id, v.Pid)
		return
	}
	c, cancel := context.WithTimeout(ctx, 2*time.Second+timescale.D(10*time.Second))
	info, err := chapi.New(m.apiSocket(id)).Info(c)
	cancel()
	if err == nil && info.State == chapi.StatePaused {
		add("no-paused-running", "vm %s record running, VMM %d Paused", id, v.Pid)
	}
}

// checkVMLeftovers looks past the records: every VMM owned by a record, no
// VM dir or socket without a record or live VMM.
func (m *Manager) checkVMLeftovers(ctx context.Context, vx *vmIndex, add addViolation) {
	for id, pids := range m.findVMMs() {
		v, ok := vx.VMs[id]
		for _, pid := range pids {
			if !ok || v.State == StateStopped || v.State == StateCreated || (v.State == StateRunning && v.Pid != pid) {
				add("no-orphan-vmm", "VMM pid %d of vm %s has no record owning it", pid, id)
			} else if v.State == StateCreating {
				if l, err := lockFile(ctx, m.opsLockPath(id), exclusive, false); err == nil {
					l.Unlock()
					add("no-orphan-vmm", "VMM pid %d of creating vm %s has no live owner", pid, id)
				}
			}
		}
	}
	for _, dir := range []string{m.vmsDir(), m.cfg.RunDir} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if _, ok := vx.VMs[e.Name()]; !ok && validID(e.Name()) {
				add("no-unreferenced-dirs", "%s/%s has no record", dir, e.Name())
			}
		}
	}
	for id, v := range vx.VMs {
		if _, err := os.Stat(m.apiSocket(id)); err == nil && v.State != StateCreating && !m.vmmAlive(v) {
			add("no-leftover-sockets", "%s exists but vm %s has no live VMM", m.apiSocket(id), id)
		}
	}
}

// checkSnapRecords checks each snapshot record: the name index agreeing, a
// pending record with a live lease holder, a ready record with every file a
// clone reads (snapFiles: CH's three, the disk and vmctl.json; a lost
// memory-ranges or vmctl.json fails the clone as surely as a lost disk).
func (m *Manager) checkSnapRecords(ctx context.Context, sx *snapIndex, add addViolation) {
	for id, s := range sx.Snapshots {
		if sx.Names[s.Name] != id {
			add("indexes-consistent", "snapshot %s name %q maps to %q", id, s.Name, sx.Names[s.Name])
		}
		if s.State == SnapPending {
			if l, err := lockFile(ctx, m.leasePath(id), exclusive, false); err == nil {
				l.Unlock()
				add("no-pending-without-lease", "snapshot %s (%s) pending with a free lease", id, s.Name)
			}
		}
		if s.State != SnapReady {
			continue
		}
		if _, err := os.Stat(s.Dir); err != nil {
			add("snapshot-data", "snapshot %s ready but %v", id, err)
			continue
		}
		for _, f := range snapFiles {
			if _, err := os.Stat(filepath.Join(s.Dir, f)); err != nil {
				add("snapshot-data", "snapshot %s ready but %v", id, err)
			}
		}
	}
	for name, id := range sx.Names {
		if s, ok := sx.Snapshots[id]; !ok || s.Name != name {
			add("indexes-consistent", "snapshot name %q maps to %s without a matching record", name, id)
		}
	}
	for id := range sx.Tombstones {
		add("no-tombstone", "snapshot tombstone %s", id)
	}
}

// checkSnapLeftovers looks past the records: no staging dir without a live
// builder, no capture of a dead save, no snapshot dir without a record.
func (m *Manager) checkSnapLeftovers(ctx context.Context, sx *snapIndex, add addViolation) {
	ents, _ := os.ReadDir(m.stagingDir())
	for _, e := range ents {
		if !validID(e.Name()) {
			add("no-leftover-staging", "staging entry %s is not a build", e.Name())
			continue
		}
		if l, err := lockFile(ctx, m.leasePath(e.Name()), exclusive, false); err == nil || !errors.Is(err, ErrLocked) {
			l.Unlock()
			add("no-leftover-staging", "staging dir %s without a live builder", e.Name())
		}
	}
	m.deadCaptures(ctx, func(vmID, sid, dir string) {
		add("no-leftover-staging", "capture dir %s of a dead save of vm %s", dir, vmID)
	})
	ents, _ = os.ReadDir(m.snapsDir())
	for _, e := range ents {
		if e.IsDir() && validID(e.Name()) {
			if _, ok := sx.Snapshots[e.Name()]; !ok {
				add("no-unreferenced-dirs", "snapshot dir %s has no record", e.Name())
			}
		}
	}
}
