package fakech

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/failpoint"
)

// devNode is one device in CH's device tree (DeviceManager.device_tree,
// vmm/src/device_manager.rs). The tree, not the config, is what CH checks a
// new id against (validate_identifier), what vm.info shows and what a
// snapshot carries in state.json; the config only says which devices a
// (re)boot or restore creates.
type devNode struct {
	ID   string `json:"id"`
	Kind string `json:"kind"` // "disk" or "net"
	Slot int    `json:"slot"` // PCI device number
	IP   string `json:"ip,omitempty"`
	// Ejecting: vm.remove-device took the device out of the config and
	// asked the guest to eject it (ACPI PCI hot-unplug); the node leaves the
	// tree only when the guest acks (eject_device on the B0EJ write).
	Ejecting bool `json:"ejecting,omitempty"`
}

// resetTree builds the tree of a freshly booted VM from its config.
func (v *VMM) resetTree(cfg *chapi.VmConfig) {
	v.tree = map[string]*devNode{}
	slot := 3
	for _, d := range cfg.Disks {
		v.tree[d.ID] = &devNode{ID: d.ID, Kind: "disk", Slot: slot}
		slot++
	}
	for _, n := range cfg.Net {
		v.tree[n.ID] = &devNode{ID: n.ID, Kind: "net", Slot: slot, IP: n.IP}
		slot++
	}
}

// inConfig reports whether the config still has a device with id.
func (v *VMM) inConfig(id string) bool {
	if v.config == nil {
		return false
	}
	for _, d := range v.config.Disks {
		if d.ID == id {
			return true
		}
	}
	for _, n := range v.config.Net {
		if n.ID == id {
			return true
		}
	}
	return false
}

// orphan: a node restored from state.json with no device behind it (the
// device was not in config.json, e.g. its eject was pending at snapshot
// time, or the manager dropped it from config.json). CH's restored node has
// no pci_device_handle (it is not serialized, device_tree.rs), so the id
// stays taken and remove-device fails with "Missing PCI device".
func (v *VMM) orphan(n *devNode) bool { return !n.Ejecting && !v.inConfig(n.ID) }

// deviceTree renders the tree as vm.info shows it: each device under its
// virtio-pci parent.
func (v *VMM) deviceTree() map[string]chapi.DeviceNode {
	out := map[string]chapi.DeviceNode{}
	for id, n := range v.tree {
		pci := "_virtio-pci-" + id
		out[id] = chapi.DeviceNode{ID: id, Parent: pci, Children: []string{}}
		out[pci] = chapi.DeviceNode{ID: pci, Children: []string{id}, PciBdf: fmt.Sprintf("0000:00:%02x.0", n.Slot)}
	}
	return out
}

// treeNodes lists the tree's nodes by slot (for state.json).
func (v *VMM) treeNodes() []devNode {
	out := make([]devNode, 0, len(v.tree))
	for _, n := range v.tree {
		out = append(out, *n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Slot < out[j].Slot })
	return out
}

// requestEject is remove-device on a booted VM, as CH's
// DeviceManager::remove_device + notify_hotplug: the device leaves the config
// now, and the node stays in the tree until the guest acks. It returns the
// guest's notification, which the caller runs once the VMM passed the
// request's phases (ch.eject.requested, and ch.net.removed for a NIC): a
// park at either then holds the eject pending with the guest not yet told,
// as the points say (not yet: the guest's ack), instead of the guest acking
// on its own goroutine while the VMM is held. Unparked the order is the
// same to the microsecond. The caller holds v.mu.
func (v *VMM) requestEject(n *devNode) (notify func(), err error) {
	n.Ejecting = true
	attrs := failpoint.Attrs{"dev": n.ID, "kind": n.Kind}
	if n.IP != "" {
		attrs["ip"] = n.IP
	}
	// The goroutine's owner is the guest: teardown, reboot and restore kill
	// or replace it, which ends the wait.
	g, gen, id := v.guest.Load(), v.gen, n.ID
	notify = func() { go v.awaitEjectAck(g, gen, id) }
	return notify, v.hit("ch.eject.requested", attrs)
}

// awaitEjectAck is the guest side of a hot-unplug: after EjectAck of running
// time (the countdown stops while the VM is paused: the guest's ACPI handler
// runs on its vCPUs) the guest writes B0EJ and the device leaves the tree.
// A failpoint error(msg) on ch.eject.acked is a guest that never acks.
func (v *VMM) awaitEjectAck(g *guest, gen uint64, id string) {
	ctx := context.Background()
	if g == nil || g.runFor(ctx, v.clock.d(v.clock.t.EjectAck)) != nil {
		return
	}
	if err := v.hit("ch.eject.acked", failpoint.Attrs{"dev": id}); err != nil {
		v.log.infof("eject %s: the guest never acks (%v)", id, err)
		return
	}
	for {
		// The ack is a vCPU write: it cannot happen while the VM is paused.
		if g.runFor(ctx, 0) != nil {
			return
		}
		v.mu.Lock()
		if v.gen != gen || v.guest.Load() != g {
			v.mu.Unlock()
			return
		}
		if v.state != chapi.StateRunning {
			v.mu.Unlock()
			continue
		}
		n := v.tree[id]
		if n == nil || !n.Ejecting {
			v.mu.Unlock()
			return
		}
		delete(v.tree, id)
		if n.Kind == "net" {
			v.nics.close(id)
		}
		v.events.emit("vm", "device-removed", map[string]string{"id": id, "bdf": fmt.Sprintf("0000:00:%02x.0", n.Slot)})
		v.log.infof("eject %s: acked by the guest, removed from the device tree", id)
		v.mu.Unlock()
		return
	}
}

// runFor blocks until the guest has run for d more (time paused does not
// count), or returns errGuestGone / the context's error. d == 0 waits only
// until the guest runs.
func (g *guest) runFor(ctx context.Context, d time.Duration) error {
	for {
		g.gateMu.Lock()
		gone, running, ch := g.gone, g.running, g.changed
		g.gateMu.Unlock()
		if gone {
			return errGuestGone
		}
		if running && d <= 0 {
			return nil
		}
		var timer <-chan time.Time
		var t *time.Timer
		start := time.Now()
		if running {
			t = time.NewTimer(d)
			timer = t.C
		}
		select {
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return ctx.Err()
		case <-timer:
			return nil
		case <-ch:
			if t != nil {
				t.Stop()
				d -= time.Since(start)
			}
		}
	}
}
