package checker

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/manager"
)

const (
	macA = "52:54:00:0a:00:01"
	macB = "52:54:00:0b:00:01"
	macD = "52:54:00:0d:00:01"
)

// vmmTree is a tree as fakech's vm.info shows it: each config device under
// its virtio-pci bus node, plus orphans (restored nodes with no device
// behind them), on consecutive PCI slots.
func vmmTree(devices map[string]string, orphans ...string) VMMTree {
	t := VMMTree{Nodes: map[string]chapi.DeviceNode{}, Devices: devices}
	slot := 3
	add := func(id string) {
		pci := "_virtio-pci-" + id
		t.Nodes[id] = chapi.DeviceNode{ID: id, Parent: pci, Children: []string{}}
		t.Nodes[pci] = chapi.DeviceNode{ID: pci, Children: []string{id}, PciBdf: fmt.Sprintf("0000:00:%02x.0", slot)}
		slot++
	}
	for _, id := range slices.Sorted(maps.Keys(devices)) {
		add(id)
	}
	for _, id := range orphans {
		add(id)
	}
	return t
}

// TestDeviceTreeConsistentNeverPassesOnMissingData (issue 31, item 6):
// fed empty, missing, unreadable, colliding or stale trees, the invariant
// fails naming what it saw; the clean fixture (a clone whose tree keeps the
// base source's NIC, which the base snapshot had attached) passes.
func TestDeviceTreeConsistentNeverPassesOnMissingData(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(in *Input, p *Poll)
		want   string
	}{
		{"no tree at all (empty)", func(_ *Input, p *Poll) { p.Trees, p.Captured = nil, nil }, "no device tree read"},
		{"a running VM's tree not read (missing)", func(_ *Input, p *Poll) { delete(p.Trees, "D1") }, "vm D1 (d) runs but its VMM's device tree was not read"},
		{"vm.info shows an empty tree (empty)", func(_ *Input, p *Poll) { p.Trees["A1"] = VMMTree{Devices: map[string]string{}} }, "vm A1: vm.info shows an empty device tree"},
		{"state.json holds an empty tree (empty)", func(_ *Input, p *Poll) {
			p.Captured["S0"] = CapturedTree{Name: "base", Devices: map[string]string{}, Nodes: []CapturedNode{}}
		}, "snapshot S0 (base): state.json holds an empty device tree"},
		{"vm.info failed (unreadable)", func(_ *Input, p *Poll) {
			p.fail(SrcDevTree, errors.New("vm D1: vm.info: connection refused"))
		}, "device trees: vm D1: vm.info: connection refused"},
		{"a snapshot's state.json unreadable", func(_ *Input, p *Poll) {
			p.fail(SrcDevTree, errors.New("snapshot S0 (base): state.json: unexpected end of JSON input"))
		}, "unexpected end of JSON input"},
		{"the source never read (missing)", func(_ *Input, p *Poll) { delete(p.Read, SrcDevTree) }, "device trees: never read"},
		{"two devices on one PCI address (colliding)", func(_ *Input, p *Poll) {
			n := p.Trees["A1"].Nodes["_virtio-pci-na1"]
			n.PciBdf = p.Trees["A1"].Nodes["_virtio-pci-_disk0"].PciBdf
			p.Trees["A1"].Nodes["_virtio-pci-na1"] = n
		}, "id collision: _virtio-pci-_disk0 and _virtio-pci-na1 share PCI address 0000:00:03.0"},
		{"the record's NIC id held by another MAC (colliding)", func(_ *Input, p *Poll) {
			p.VMs[0].NICs = []manager.NIC{{ID: "na1", MAC: macD}}
		}, "id collision: the record's NIC na1 has MAC " + macD},
		{"the record names one NIC id twice (colliding)", func(_ *Input, p *Poll) {
			p.VMs[0].NICs = append(p.VMs[0].NICs, manager.NIC{ID: "na1", MAC: macA})
		}, "id collision: the record names NIC na1 twice"},
		{"a captured tree holds one id twice (colliding)", func(_ *Input, p *Poll) {
			s := p.Captured["S0"]
			s.Nodes = append(s.Nodes, CapturedNode{ID: "nb0", Kind: "net", Slot: 5})
			p.Captured["S0"] = s
		}, "id collision: the captured tree holds nb0 twice"},
		{"an eject left pending (stale)", func(_ *Input, p *Poll) {
			p.Trees["A1"] = vmmTree(map[string]string{"_disk0": ""}, "nb0", "na1")
			p.VMs[0].NICs, p.VMs[0].Ejecting = nil, []string{"na1"}
		}, "vm A1 (a): stale node: na1 is in the VMM's device tree"},
		{"the record still waits for an eject (stale)", func(_ *Input, p *Poll) { p.VMs[1].Ejecting = []string{"nd0"} },
			"vm D1 (d): stale node: the record still waits for the eject of nd0"},
		{"a save captured a pending eject (stale)", func(_ *Input, p *Poll) {
			p.Snaps = append(p.Snaps, manager.Snapshot{ID: "S2", Name: "a", State: manager.SnapReady})
			p.Captured["S2"] = CapturedTree{Name: "a", Devices: map[string]string{"_disk0": ""},
				Nodes: []CapturedNode{{ID: "_disk0", Kind: "disk", Slot: 3}, {ID: "nb0", Kind: "net", Slot: 4}, {ID: "na1", Kind: "net", Slot: 5, Ejecting: true}}}
		}, "snapshot S2 (a): stale node: the save captured net na1 with its eject pending"},
		{"a wake restored the captured pending eject (stale)", func(_ *Input, p *Poll) {
			// the save that captured it is gone (pulled, woken, removed)
			p.Trees["A1"] = vmmTree(map[string]string{"_disk0": "", "na1-1": macA}, "nb0", "na1")
			p.VMs[0].NICs = []manager.NIC{{ID: "na1-1", MAC: macA}}
		}, "vm A1 (a): stale node: na1 is in the VMM's device tree, not in its config, and no snapshot had it attached"},
		{"a captured node no snapshot explains (stale)", func(_ *Input, p *Poll) {
			s := p.Captured["S0"]
			s.Devices = map[string]string{"_disk0": ""}
			p.Captured["S0"] = s
		}, "snapshot S0 (base): stale node: net nb0 is in the captured tree, not in config.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, p := clean()
			tc.change(in, p)
			got, ok := byName(Evaluate(in, p))[DeviceTreeConsistent]
			if !ok || got.OK || !strings.Contains(got.Evidence, tc.want) {
				t.Fatalf("%+v (asked %v); want a failure with evidence containing %q", got, ok, tc.want)
			}
		})
	}
	in, p := clean()
	if got := byName(Evaluate(in, p))[DeviceTreeConsistent]; !got.OK {
		t.Fatalf("clean fixture: %s", got.Evidence)
	}
	// not asked of a manager case (no agent) nor on the real backend's
	// stack (the captured half reads fakech's state.json): left out,
	// never reported as held
	in.Agentless = true
	if got, ok := byName(Evaluate(in, p))[DeviceTreeConsistent]; ok {
		t.Fatalf("asked of an agentless case: %+v", got)
	}
}

// TestReadCapturedTreeRefusesWhatItCannotRead: a snapshot dir the manager
// does not name, a missing or garbled file, or a state.json without a
// device tree is an error, never an empty (clean) tree.
func TestReadCapturedTreeRefusesWhatItCannotRead(t *testing.T) {
	cfg := `{"disks":[{"path":"/d","id":"_disk0"}],"net":[{"ip":"127.0.0.2","mac":"52:54:00:0a:00:01","id":"na1"}]}`
	state := `{"format":"fakech-state-v1","device_tree":[{"id":"_disk0","kind":"disk","slot":3},{"id":"na1","kind":"net","slot":4},{"id":"nx","kind":"net","slot":5,"ejecting":true}]}`
	write := func(files map[string]string) string {
		dir := t.TempDir()
		for name, body := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	for _, tc := range []struct {
		name string
		dir  string
		want string
	}{
		{"no dir named", "", "names no snapshot dir"},
		{"no state.json", write(map[string]string{"config.json": cfg}), "state.json: no such file"},
		{"no config.json", write(map[string]string{"state.json": state}), "config.json: no such file"},
		{"garbled state.json", write(map[string]string{"config.json": cfg, "state.json": `{"device_tree":[`}), "unexpected end of JSON input"},
		{"no device tree", write(map[string]string{"config.json": cfg, "state.json": `{"format":"fakech-state-v1"}`}), "holds no device_tree"},
	} {
		if _, err := ReadCapturedTree(tc.dir); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
	got, err := ReadCapturedTree(write(map[string]string{"config.json": cfg, "state.json": state}))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Nodes) != 3 || !got.Nodes[2].Ejecting || got.Devices["na1"] != "52:54:00:0a:00:01" || got.Devices["_disk0"] != "" {
		t.Fatalf("read %+v", got)
	}
}

// TestMACKeptNeverPassesOnMissingData: no MAC listed before, a listing that
// failed, no VM under the name now, or other MACs now all fail; the same
// MACs back pass.
func TestMACKeptNeverPassesOnMissingData(t *testing.T) {
	now := func(macs []string, err error) func(string) ([]string, error) {
		return func(string) ([]string, error) { return macs, err }
	}
	before := map[string][]string{"vm-a": {macA}}
	for _, tc := range []struct {
		name      string
		before    map[string][]string
		beforeErr error
		now       func(string) ([]string, error)
		want      string
	}{
		{"nothing listed before (empty)", nil, nil, now([]string{macA}, nil), "no VM's NICs were listed"},
		{"a VM with no NIC before (empty)", map[string][]string{"vm-a": {}}, nil, now([]string{macA}, nil), "vm-a had no NIC"},
		{"the listing before failed (unreadable)", nil, errors.New("vmctl vm list: exit 1"), now([]string{macA}, nil), "could not be listed: vmctl vm list: exit 1"},
		{"no VM under the name now (missing)", before, nil, now(nil, errors.New("no vm named vm-a")), "vm-a: the NICs of the VM now under the name could not be listed"},
		{"another MAC now", before, nil, now([]string{macD}, nil), "did not keep its MACs"},
		{"no NIC now", before, nil, now([]string{}, nil), "did not keep its MACs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := MACKeptInvariant(tc.before, tc.beforeErr, tc.now)
			if got.OK || got.Name != MACKept || !strings.Contains(got.Evidence, tc.want) {
				t.Fatalf("%+v; want a failure with evidence containing %q", got, tc.want)
			}
		})
	}
	if got := MACKeptInvariant(before, nil, now([]string{macA}, nil)); !got.OK {
		t.Fatalf("the same MAC back: %+v", got)
	}
}
