package vmctl

import (
	"context"
	"fmt"
	"slices"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/regress"
)

// convergeOrphanedPause resumes a VMM found Paused. The caller holds the VM's
// ops lock: every pause window (snapshot save) runs under that lock end to
// end, so a Paused VMM seen by a lock holder was left by a capture that died.
// With net-refuses-paused (the pre-fix vmctl) nothing converges it: the verb
// refuses with the §4.5 message instead.
func (m *Manager) convergeOrphanedPause(ctx context.Context, c *chapi.Client, id string) error {
	if regress.On("net-refuses-paused") {
		return fmt.Errorf("%s", MsgVMPaused)
	}
	if err := c.Resume(ctx, true); err != nil {
		return fmt.Errorf("vm %s: converge orphaned pause: %w", id, err)
	}
	m.logf("vm %s: resumed a VMM left paused by a dead capture", id)
	return nil
}

// Net converges a running VM to n NICs through its VMM. The record is
// written first (the intent: which addresses the VM owns), then the VMM is
// brought to it; re-running the verb finishes an interrupted change.
//
// A VMM found Paused while we hold the ops lock was paused by a capture that
// died: every pause window runs under this same lock, so nobody live can own
// that pause. It is resumed first (the orphaned pause is converged).
func (m *Manager) Net(ctx context.Context, ref string, n int) (*VM, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: --nics must be >= 0", ErrUsage)
	}
	v, l, err := m.lockedVM(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer l.Unlock()
	if v.State != StateRunning {
		return nil, fmt.Errorf("net: "+MsgVMNotRunningState, v.ID, v.State)
	}
	if !m.vmmAlive(v) {
		return nil, fmt.Errorf("net: "+MsgVMNotRunningPid, v.ID, v.Pid)
	}
	c := chapi.New(m.apiSocket(v.ID))
	actx, cancel := context.WithTimeout(ctx, apiTimeout())
	defer cancel()
	info, err := m.netVMMInfo(actx, c, v.ID)
	if err != nil {
		return nil, err
	}
	port := 22
	if len(v.Network) > 0 {
		port = v.Network[0].SSHPort
	} else if _, p, err := imageInfo(m.vmDisk(v.ID)); err == nil {
		port = p
	}
	want, err := m.setNICs(ctx, v.ID, n, port)
	if err != nil {
		return nil, err
	}
	have, remove := diffNICs(want.Network, info.Config.Net)
	ejecting, err := m.netRemove(ctx, actx, c, v.ID, want.Ejecting, remove)
	if err != nil {
		return nil, err
	}
	add, err := m.netAdd(ctx, actx, c, v.ID, want.Network, have, ejecting)
	if err != nil {
		return nil, err
	}
	return m.setVM(ctx, v.ID, func(r *VM) {
		r.Config.NICs, r.Ejecting = n, nil
		r.Network = renamedNICs(r.Network, add)
	})
}

// netVMMInfo reads the VMM's info, first converging an orphaned pause.
func (m *Manager) netVMMInfo(actx context.Context, c *chapi.Client, id string) (chapi.VmInfo, error) {
	info, err := c.Info(actx)
	if err != nil {
		return info, fmt.Errorf("net %s: %w", id, err)
	}
	if info.State == chapi.StatePaused {
		if err := m.convergeOrphanedPause(actx, c, id); err != nil {
			return info, err
		}
		if info, err = c.Info(actx); err != nil {
			return info, fmt.Errorf("net %s: %w", id, err)
		}
	}
	return info, nil
}

// diffNICs compares the NICs the record wants with those the VMM has: have
// holds the wanted ids the VMM already has as wanted, remove the VMM's
// others.
func diffNICs(want []NIC, vmm []chapi.NetConfig) (have map[string]bool, remove []string) {
	wanted := map[string]NIC{}
	for _, nic := range want {
		wanted[nic.ID] = nic
	}
	have = map[string]bool{}
	for _, cur := range vmm {
		if w, ok := wanted[cur.ID]; ok && sameNIC(w, cur) {
			have[cur.ID] = true
			continue
		}
		remove = append(remove, cur.ID)
	}
	return have, remove
}

// netRemove unplugs the VMM's NICs listed in remove; it returns every id
// whose eject is still owed (the record's earlier ones and these).
func (m *Manager) netRemove(ctx, actx context.Context, c *chapi.Client, id string, pending, remove []string) ([]string, error) {
	// The ids go into the record before the VMM is asked: an eject the
	// guest has not acked when this verb dies or times out is waited for
	// by the next run, which no longer sees the device in the config.
	ejecting := append(slices.Clone(pending), remove...)
	if len(remove) > 0 {
		if _, err := m.setVM(ctx, id, func(r *VM) { r.Ejecting = ejecting }); err != nil {
			return nil, err
		}
	}
	for _, dev := range remove {
		if err := c.RemoveDevice(actx, dev); err != nil {
			return nil, fmt.Errorf("net %s: remove %s: %w", id, dev, err)
		}
	}
	m.logf("net %s: removed", id)
	if err := hit(ctx, "vm.net.removed", id); err != nil {
		return nil, err
	}
	return ejecting, nil
}

// netAdd waits for the ejects to be acked, then plugs the wanted NICs the
// VMM does not have; it returns them as added (ids possibly moved).
func (m *Manager) netAdd(ctx, actx context.Context, c *chapi.Client, id string, want []NIC, have map[string]bool, ejecting []string) ([]NIC, error) {
	// CH keeps an unplugged device in its tree until the guest acks the
	// eject; saving or re-adding before that carries the half-gone device
	// into the snapshot or collides on its id.
	if err := waitEjected(actx, c, ejecting, ejectBudget()); err != nil {
		return nil, fmt.Errorf("net %s: %w", id, err)
	}
	info, err := c.Info(actx)
	if err != nil {
		return nil, fmt.Errorf("net %s: %w", id, err)
	}
	var add []NIC
	for _, nic := range want {
		if !have[nic.ID] {
			add = append(add, nic)
		}
	}
	add = uniqueNICs(info.DeviceTree, add)
	for _, nic := range add {
		if _, err := c.AddNet(actx, netConfig(nic)); err != nil {
			return nil, fmt.Errorf("net %s: add %s: %w", id, nic.ID, err)
		}
	}
	m.logf("net %s: added", id)
	if err := hit(ctx, "vm.net.added", id); err != nil {
		return nil, err
	}
	return add, nil
}

// renamedNICs records the ids the VMM was given (uniqueNICs may have moved
// one off a taken id), matching NICs by MAC.
func renamedNICs(rec, added []NIC) []NIC {
	out := slices.Clone(rec)
	for i := range out {
		for _, a := range added {
			if a.MAC == out[i].MAC {
				out[i].ID = a.ID
			}
		}
	}
	return out
}

// setNICs records n NICs for VM id, keeping the first ones it has and
// allocating addresses for the rest under the index lock.
func (m *Manager) setNICs(ctx context.Context, id string, n, port int) (*VM, error) {
	return m.editVM(ctx, id, func(ix *vmIndex, v *VM) error {
		if m.tap() {
			// The name's slots: the first NICs stay as they are, the rest
			// come back with the addresses they had before.
			nics, err := m.planTapNICs(ix, v.Name, n, port, nil)
			if err != nil {
				return err
			}
			// Keep the id the VMM knows a NIC by (uniqueNICs may have
			// moved it off a taken one).
			v.Network = renamedNICs(nics, v.Network)
			return nil
		}
		if len(v.Network) > n {
			v.Network = v.Network[:n]
		}
		if missing := n - len(v.Network); missing > 0 {
			ips, err := m.pool.allocate(m.cfg.RootDir, missing, port, usedIPs(ix))
			if err != nil {
				return err
			}
			for _, ip := range ips {
				i := len(v.Network)
				v.Network = append(v.Network, NIC{ID: nicID(macFor(id, i)), MAC: macFor(id, i), IP: ip, Mask: m.pool.mask, SSHPort: port})
			}
		}
		return nil
	})
}
