package checker

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
)

// DeviceTreeConsistent judges CH's device trees: the tree of every running
// VM's VMM (vm.info) and the tree every ready snapshot captured
// (state.json beside its config.json). CH checks a new device id against
// that tree, keeps an unplugged device in it until the guest acks the
// eject, and a restore brings a captured tree back as it was, so a manager
// that does not wait for the eject leaves nodes no device stands behind
// (issue 31, item 6).
const DeviceTreeConsistent = "device-tree-consistent"

// SrcDevTree: the VMMs' vm.info and the snapshots' config.json and
// state.json.
const SrcDevTree Source = "device trees"

// VMMTree is one running VM's device tree and the devices its VMM's config
// has, as vm.info shows them.
type VMMTree struct {
	Nodes   map[string]chapi.DeviceNode
	Devices map[string]string // config device id → MAC ("" for a disk)
}

// CapturedTree is the device tree a snapshot's state.json holds and the
// devices of its config.json.
type CapturedTree struct {
	Name    string
	Nodes   []CapturedNode
	Devices map[string]string // config.json device id → MAC ("" for a disk)
}

// CapturedNode is one node of a captured tree (fakech's state.json,
// DeviceManagerState's tree with each node's pending eject).
type CapturedNode struct {
	ID       string `json:"id"`
	Kind     string `json:"kind"`
	Slot     int    `json:"slot"`
	Ejecting bool   `json:"ejecting,omitempty"`
}

// devTreeAsked: judged on the agent catalogue on the fake backend. The
// captured half reads fakech's state.json (real CH serializes its device
// manager's state differently, and no real snapshot can be taken here).
func devTreeAsked(in *Input) bool {
	return !in.Agentless && in.Stack != nil && !in.Stack.RealBackend()
}

// needTrees: at least one tree was read (every agent case's store holds
// the base snapshot), every running VM with a live VMM has its tree, and
// no tree read is empty (a VM always has its boot disk).
var needTrees = Evidence{Asked: devTreeAsked, Of: func(_ *Input, p *Poll) []string {
	var miss []string
	if len(p.Trees) == 0 && len(p.Captured) == 0 {
		miss = append(miss, "no device tree read: no running VM's vm.info and no snapshot's state.json")
	}
	for _, v := range p.VMs {
		if v.State == manager.StateRunning && alive(p, v.ID) {
			if _, ok := p.Trees[v.ID]; !ok {
				miss = append(miss, fmt.Sprintf("vm %s (%s) runs but its VMM's device tree was not read", v.ID, v.Name))
			}
		}
	}
	for id, t := range p.Trees {
		if len(t.Nodes) == 0 {
			miss = append(miss, fmt.Sprintf("vm %s: vm.info shows an empty device tree", id))
		}
	}
	for id, t := range p.Captured {
		if len(t.Nodes) == 0 {
			miss = append(miss, fmt.Sprintf("snapshot %s (%s): state.json holds an empty device tree", id, t.Name))
		}
	}
	sort.Strings(miss)
	return miss
}}

var devTreeInvariant = StateInvariant{DeviceTreeConsistent,
	"CH's device trees (every running VMM's, every ready snapshot's) hold no id twice and no node without a device behind it that no snapshot explains: no eject left pending, none captured by a save",
	[]Source{SrcVMs, SrcSnaps, SrcProcs, SrcDevTree}, needTrees, checkDeviceTrees}

// collectTree records the tree of VM id from its vm.info.
func (p *Poll) collectTree(id string, info chapi.VmInfo) {
	if p.Trees == nil {
		p.Trees = map[string]VMMTree{}
	}
	p.Trees[id] = VMMTree{Nodes: info.DeviceTree, Devices: configDevices(info.Config)}
}

// configDevices maps a config's device ids to their MACs.
func configDevices(cfg chapi.VmConfig) map[string]string {
	out := map[string]string{}
	for _, d := range cfg.Disks {
		if d.ID != "" {
			out[d.ID] = ""
		}
	}
	for _, n := range cfg.Net {
		if n.ID != "" {
			out[n.ID] = strings.ToLower(n.Mac)
		}
	}
	return out
}

// collectCaptured reads the tree of every ready snapshot. A snapshot whose
// dir the manager does not name, or whose files do not parse, fails the
// source: its tree is unknown, not clean.
func (p *Poll) collectCaptured() {
	p.Captured = map[string]CapturedTree{}
	for _, sn := range p.Snaps {
		if sn.State != manager.SnapReady {
			continue
		}
		t, err := ReadCapturedTree(sn.Dir)
		if err != nil {
			p.fail(SrcDevTree, fmt.Errorf("snapshot %s (%s): %w", sn.ID, sn.Name, err))
			continue
		}
		t.Name = sn.Name
		p.Captured[sn.ID] = t
	}
}

// ReadCapturedTree reads a snapshot dir's config.json and state.json.
func ReadCapturedTree(dir string) (CapturedTree, error) {
	if dir == "" {
		return CapturedTree{}, fmt.Errorf("the manager names no snapshot dir")
	}
	var cfg chapi.VmConfig
	if err := readJSON(filepath.Join(dir, "config.json"), &cfg); err != nil {
		return CapturedTree{}, err
	}
	var st struct {
		Tree *[]CapturedNode `json:"device_tree"`
	}
	if err := readJSON(filepath.Join(dir, "state.json"), &st); err != nil {
		return CapturedTree{}, err
	}
	if st.Tree == nil {
		return CapturedTree{}, fmt.Errorf("%s holds no device_tree", filepath.Join(dir, "state.json"))
	}
	return CapturedTree{Nodes: *st.Tree, Devices: configDevices(cfg)}, nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// collectDevTrees reads the trees of the VMMs collectVMMs did not reach
// and the captured ones, when the case asks for the invariant.
func (p *Poll) collectDevTrees(ctx context.Context, in *Input, m manager.Observer) {
	if !devTreeAsked(in) {
		return
	}
	for _, v := range p.VMs {
		if v.State != manager.StateRunning || !alive(p, v.ID) {
			continue
		}
		if _, ok := p.Trees[v.ID]; ok {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := chapi.New(m.APISocket(v.ID)).Info(ictx)
		cancel()
		if err != nil {
			p.fail(SrcDevTree, fmt.Errorf("vm %s: vm.info: %w", v.ID, err))
			continue
		}
		p.collectTree(v.ID, info)
	}
	p.collectCaptured()
	p.got(SrcDevTree, nil)
}

// checkDeviceTrees: no id twice, and every node not in its own config is
// explained by a snapshot whose config had that device attached (the
// source's NIC a clone's restore brings back: CH keeps it and frees
// nothing). Anything else is stale: an eject still pending, a pending
// eject a save captured, or the restored node of one.
func checkDeviceTrees(_ *Input, p *Poll) []string {
	attached := map[string][]string{} // device id → snapshots whose config had it
	for id, t := range p.Captured {
		for dev := range t.Devices {
			attached[dev] = append(attached[dev], id)
		}
	}
	explained := func(dev, self string) bool {
		for _, s := range attached[dev] {
			if s != self {
				return true
			}
		}
		return false
	}
	var ev []string
	for _, id := range slices.Sorted(maps.Keys(p.Captured)) {
		ev = append(ev, capturedEvidence(id, p.Captured[id], explained)...)
	}
	for _, v := range p.VMs {
		t, ok := p.Trees[v.ID]
		if !ok {
			continue
		}
		ev = append(ev, vmmEvidence(v, t, func(dev string) bool { return explained(dev, "") })...)
	}
	return ev
}

func capturedEvidence(id string, t CapturedTree, explained func(dev, self string) bool) []string {
	var ev []string
	what := fmt.Sprintf("snapshot %s (%s)", id, t.Name)
	ids, slots := map[string]bool{}, map[int]string{}
	for _, n := range t.Nodes {
		if ids[n.ID] {
			ev = append(ev, fmt.Sprintf("%s: id collision: the captured tree holds %s twice", what, n.ID))
		}
		ids[n.ID] = true
		if o, dup := slots[n.Slot]; dup {
			ev = append(ev, fmt.Sprintf("%s: id collision: %s and %s share PCI slot %d", what, o, n.ID, n.Slot))
		}
		slots[n.Slot] = n.ID
		_, inCfg := t.Devices[n.ID]
		switch {
		case n.Ejecting:
			ev = append(ev, fmt.Sprintf("%s: stale node: the save captured %s %s with its eject pending (a restore brings it back with no device behind it)", what, n.Kind, n.ID))
		case !inCfg && !explained(n.ID, id):
			ev = append(ev, fmt.Sprintf("%s: stale node: %s %s is in the captured tree, not in config.json, and no other snapshot had it attached", what, n.Kind, n.ID))
		}
	}
	for dev := range t.Devices {
		if !ids[dev] {
			ev = append(ev, fmt.Sprintf("%s: config.json device %s has no node in the captured tree", what, dev))
		}
	}
	sort.Strings(ev)
	return ev
}

func vmmEvidence(v manager.VM, t VMMTree, explained func(dev string) bool) []string {
	var ev []string
	what := fmt.Sprintf("vm %s (%s)", v.ID, v.Name)
	bdfs := map[string]string{}
	for _, id := range slices.Sorted(maps.Keys(t.Nodes)) {
		n := t.Nodes[id]
		if n.PciBdf != "" {
			if o, dup := bdfs[n.PciBdf]; dup {
				ev = append(ev, fmt.Sprintf("%s: id collision: %s and %s share PCI address %s", what, o, id, n.PciBdf))
			}
			bdfs[n.PciBdf] = id
		}
		// A device node hangs under its bus node; the bus nodes
		// (_virtio-pci-*) are no device of the config.
		if n.Parent == "" {
			continue
		}
		if _, inCfg := t.Devices[id]; !inCfg && !explained(id) {
			ev = append(ev, fmt.Sprintf("%s: stale node: %s is in the VMM's device tree, not in its config, and no snapshot had it attached (an eject left pending, or restored from a save that captured one)", what, id))
		}
	}
	for dev := range t.Devices {
		if _, ok := t.Nodes[dev]; !ok {
			ev = append(ev, fmt.Sprintf("%s: config device %s has no node in the device tree", what, dev))
		}
	}
	seen := map[string]bool{}
	for _, n := range v.NICs {
		mac, inCfg := t.Devices[n.ID]
		switch {
		case seen[n.ID]:
			ev = append(ev, fmt.Sprintf("%s: id collision: the record names NIC %s twice", what, n.ID))
		case !inCfg:
			ev = append(ev, fmt.Sprintf("%s: the record's NIC %s (%s) is no device of the VMM's config", what, n.ID, n.MAC))
		case mac != strings.ToLower(n.MAC):
			ev = append(ev, fmt.Sprintf("%s: id collision: the record's NIC %s has MAC %s, the VMM's device %s has %s", what, n.ID, n.MAC, n.ID, mac))
		}
		seen[n.ID] = true
	}
	if len(v.Ejecting) > 0 {
		ev = append(ev, fmt.Sprintf("%s: stale node: the record still waits for the eject of %s", what, strings.Join(v.Ejecting, ",")))
	}
	sort.Strings(ev)
	return ev
}

// MACKept is the invariant of a VM brought back under its name (a wake, or a
// create after a delete) that must reuse its NICs' MACs (tap mode: the
// name keeps its slots): the VM has the MACs the name's VM had before.
const MACKept = "mac-kept"

// MACKeptInvariant judges, per name, the MACs listed before its hibernate
// or delete against those of the VM under that name now. A name with no
// MAC listed before, or no VM now, or a listing that failed, is no
// evidence: it fails.
func MACKeptInvariant(before map[string][]string, beforeErr error, now func(name string) ([]string, error)) reports.Invariant {
	var ev []string
	if beforeErr != nil {
		ev = append(ev, fmt.Sprintf("the NICs before the hibernate or delete could not be listed: %v", beforeErr))
	}
	if len(before) == 0 && beforeErr == nil {
		ev = append(ev, "no VM's NICs were listed before a hibernate or delete: no MAC to keep")
	}
	for _, name := range slices.Sorted(maps.Keys(before)) {
		want := before[name]
		got, err := now(name)
		switch {
		case len(want) == 0:
			ev = append(ev, fmt.Sprintf("%s had no NIC before its hibernate or delete: no MAC to keep", name))
		case err != nil:
			ev = append(ev, fmt.Sprintf("%s: the NICs of the VM now under the name could not be listed: %v", name, err))
		case strings.Join(got, ",") != strings.Join(want, ","):
			ev = append(ev, fmt.Sprintf("%s: MACs %v before, %v now: the name did not keep its MACs", name, want, got))
		}
	}
	return result(MACKept, ev)
}
