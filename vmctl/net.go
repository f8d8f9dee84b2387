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
	return m.netLocked(ctx, v, n)
}

// netLocked is Net's change of v's NICs to n under v's ops lock (held by the
// caller: vm net, or the daemon finishing an interrupted change).
func (m *Manager) netLocked(ctx context.Context, v *VM, n int) (*VM, error) {
	if v.State != StateRunning {
		return nil, fmt.Errorf("net: "+MsgVMNotRunningState, v.ID, v.State)
	}
	if !m.vmmAlive(v) {
		return nil, fmt.Errorf("net: "+MsgVMNotRunningPid, v.ID, v.Pid)
	}
	c := chapi.New(m.apiSocket(v.ID))
	actx, cancel := context.WithTimeout(ctx, apiTimeout())
	defer cancel()
	info, err := m.unpausedInfo(actx, c, v.ID)
	if err != nil {
		return nil, err
	}
	want, err := m.setNICs(ctx, v.ID, n)
	if err != nil {
		return nil, err
	}
	have, remove := nicDiff(want.Network, info.Config.Net)
	// The ids go into the record before the VMM is asked: an eject the
	// guest has not acked when this verb dies or times out is waited for
	// by the next run, which no longer sees the device in the config.
	ejecting := append(slices.Clone(want.Ejecting), remove...)
	if len(remove) > 0 {
		if _, err := m.setVM(ctx, v.ID, func(r *VM) { r.Ejecting = ejecting }); err != nil {
			return nil, err
		}
	}
	for _, id := range remove {
		if err := c.RemoveDevice(actx, id); err != nil {
			return nil, fmt.Errorf("net %s: remove %s: %w", v.ID, id, err)
		}
	}
	m.logf("net %s: removed", v.ID)
	if err := hit(ctx, "vm.net.removed", v.ID); err != nil {
		return nil, err
	}
	// CH keeps an unplugged device in its tree until the guest acks the
	// eject; saving or re-adding before that carries the half-gone device
	// into the snapshot or collides on its id. With net-skips-eject-wait
	// (the pre-fix vmctl) nothing waits.
	if !regress.On("net-skips-eject-wait") {
		if err := waitEjected(actx, c, ejecting, ejectBudget()); err != nil {
			return nil, fmt.Errorf("net %s: %w", v.ID, err)
		}
	}
	if info, err = c.Info(actx); err != nil {
		return nil, fmt.Errorf("net %s: %w", v.ID, err)
	}
	var add []NIC
	for _, nic := range want.Network {
		if !have[nic.ID] {
			add = append(add, nic)
		}
	}
	add = uniqueNICs(info.DeviceTree, add)
	for _, nic := range add {
		if _, err := c.AddNet(actx, netConfig(nic)); err != nil {
			return nil, fmt.Errorf("net %s: add %s: %w", v.ID, nic.ID, err)
		}
	}
	m.logf("net %s: added", v.ID)
	if err := hit(ctx, "vm.net.added", v.ID); err != nil {
		return nil, err
	}
	return m.setVM(ctx, v.ID, func(r *VM) {
		r.Config.NICs, r.Ejecting = n, nil
		r.Network = renamedNICs(r.Network, add)
	})
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

// unpausedInfo is the VMM's info after converging an orphaned pause (the
// caller holds the ops lock).
func (m *Manager) unpausedInfo(ctx context.Context, c *chapi.Client, id string) (chapi.VmInfo, error) {
	info, err := c.Info(ctx)
	if err != nil {
		return info, fmt.Errorf("net %s: %w", id, err)
	}
	if info.State != chapi.StatePaused {
		return info, nil
	}
	if err := m.convergeOrphanedPause(ctx, c, id); err != nil {
		return info, err
	}
	if info, err = c.Info(ctx); err != nil {
		return info, fmt.Errorf("net %s: %w", id, err)
	}
	return info, nil
}

// nicDiff splits the VMM's NICs cur into those want keeps as they are (have)
// and those to remove.
func nicDiff(want []NIC, cur []chapi.NetConfig) (map[string]bool, []string) {
	wanted := map[string]NIC{}
	for _, nic := range want {
		wanted[nic.ID] = nic
	}
	have := map[string]bool{}
	var remove []string
	for _, c := range cur {
		if w, ok := wanted[c.ID]; ok && sameNIC(w, c) {
			have[c.ID] = true
			continue
		}
		remove = append(remove, c.ID)
	}
	return have, remove
}

// setNICs records n NICs for VM id, keeping the first ones it has and
// allocating addresses for the rest under the index lock.
func (m *Manager) setNICs(ctx context.Context, id string, n int) (*VM, error) {
	return m.editVM(ctx, id, func(ix *vmIndex, v *VM) error {
		if m.tap() {
			// The name's slots: the first NICs stay as they are, the rest
			// come back with the addresses they had before.
			nics, err := m.planTapNICs(ix, v.Name, n, nil)
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
			ips, err := m.pool.allocate(m.cfg.RootDir, missing, guestSSHPort, usedIPs(ix))
			if err != nil {
				return err
			}
			for _, ip := range ips {
				i := len(v.Network)
				v.Network = append(v.Network, NIC{ID: nicID(macFor(id, i)), MAC: macFor(id, i), IP: ip, Mask: m.pool.mask, SSHPort: guestSSHPort})
			}
		}
		return nil
	})
}
