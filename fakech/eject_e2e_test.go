package fakech_test

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
)

// eventuallyRefused polls addr until a connect is refused (the listener is
// closed) or the budget ends.
func eventuallyRefused(addr string, budget time.Duration) bool {
	deadline := time.Now().Add(budget)
	for time.Now().Before(deadline) {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true
		}
		conn.Close()
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// inTree reports whether vm.info's device tree holds id.
func inTree(t *testing.T, c *chapi.Client, id string) bool {
	t.Helper()
	info, err := c.Info(ctxT(t))
	if err != nil {
		t.Fatalf("vm.info: %v", err)
	}
	_, ok := info.DeviceTree[id]
	return ok
}

// waitLeavesTree polls vm.info until id is gone from the device tree.
func waitLeavesTree(t *testing.T, c *chapi.Client, id string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for inTree(t, c, id) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still in the device tree", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func release(t *testing.T, ctl, point string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(ctl, point+".release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestEjectStaysInTreeUntilGuestAcks: vm.remove-device takes the NIC out of
// the config and asks the guest to eject it; until the guest acks, the node
// stays in the device tree (new ids are checked against it), the guest keeps
// answering on the NIC, and a second remove finds no device in the config.
// CH: DeviceManager::remove_device / eject_device / validate_identifier.
func TestEjectStaysInTreeUntilGuestAcks(t *testing.T) {
	for _, tc := range []struct {
		compat, unknown string
	}{
		{"v51", "Failed to find device corresponding to the given identifier"},
		{"v53", "Failed to find device corresponding to the given identifier: _net1"},
	} {
		t.Run(tc.compat, func(t *testing.T) {
			ctl := t.TempDir()
			trace := newTrace(t)
			_, c, g, ip, _ := bootVM(t, "FAKECH_COMPAT="+tc.compat, "VMCHAOS_FAILPOINTS=ch.eject.acked=pause",
				"VMCHAOS_FAILPOINT_CTL="+ctl, "VMCHAOS_TRACE="+trace.path)
			ctx := ctxT(t)
			g.sshRun(t, ip, "true")
			if err := c.RemoveDevice(ctx, "_net1"); err != nil {
				t.Fatal(err)
			}
			if ev := trace.waitPoint(t, "ch.eject.requested"); ev.Attrs["dev"] != "_net1" {
				t.Fatalf("ch.eject.requested %+v", ev)
			}
			if _, err := waitParked(t, ctl, "ch.eject.acked"); err != nil {
				t.Fatal(err)
			}
			info, err := c.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(info.Config.Net) != 0 {
				t.Fatalf("config still holds the NIC after remove-device: %+v", info.Config.Net)
			}
			if _, ok := info.DeviceTree["_net1"]; !ok {
				t.Fatalf("device tree lost _net1 before the guest acked: %v", info.DeviceTree)
			}
			if _, _, st := g.sshRun(t, ip, "true"); st != 0 {
				t.Fatalf("guest stopped answering on a NIC whose eject is pending")
			}
			e := chError(t, firstErr(c.AddNet(ctx, chapi.NetConfig{IP: loopbackIP(), ID: "_net1"})))
			if e.Innermost() != "Invalid identifier as it is not unique: _net1" || !chapi.HasMessage(e, "Error from device manager") {
				t.Fatalf("add-net with the ejecting id: %v", e)
			}
			if e := chError(t, c.RemoveDevice(ctx, "_net1")); e.Innermost() != tc.unknown {
				t.Fatalf("second remove of an ejecting device: %v", e)
			}
			release(t, ctl, "ch.eject.acked")
			waitLeavesTree(t, c, "_net1")
			if !eventuallyRefused(net.JoinHostPort(ip, strconv.Itoa(guestimg.DefaultSSHPort)), 10*time.Second) {
				t.Fatal("NIC address still answers after the eject was acked")
			}
			if _, err := c.AddNet(ctx, chapi.NetConfig{IP: ip, ID: "_net1"}); err != nil {
				t.Fatalf("add-net after the eject completed: %v", err)
			}
		})
	}
}

func firstErr[T any](_ T, err error) error { return err }

// TestNoEjectCompletesWhilePaused: the ack is a guest vCPU write, so a
// paused VM never completes an eject — neither one requested while paused
// nor one whose ack was about to land when the pause came; both complete
// after vm.resume.
func TestNoEjectCompletesWhilePaused(t *testing.T) {
	ctl := t.TempDir()
	trace := newTrace(t)
	_, c, _, _, _ := bootVM(t, "VMCHAOS_FAILPOINTS=ch.eject.acked=1*pause", "VMCHAOS_FAILPOINT_CTL="+ctl,
		"VMCHAOS_TRACE="+trace.path, `FAKECH_TIMING={"eject_ack":"100ms"}`)
	ctx := ctxT(t)
	if _, err := c.AddNet(ctx, chapi.NetConfig{IP: loopbackIP(), ID: "second"}); err != nil {
		t.Fatal(err)
	}
	// A: the ack is parked while running; the VM pauses; the release must not
	// complete the eject until the VM runs again.
	if err := c.RemoveDevice(ctx, "_net1"); err != nil {
		t.Fatal(err)
	}
	if _, err := waitParked(t, ctl, "ch.eject.acked"); err != nil {
		t.Fatal(err)
	}
	if err := c.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	release(t, ctl, "ch.eject.acked")
	// B: requested while paused.
	if err := c.RemoveDevice(ctx, "second"); err != nil {
		t.Fatal(err)
	}
	// 100× the modelled ack time (1 ms at scale 0.01) of pause.
	time.Sleep(100 * time.Millisecond)
	for _, id := range []string{"_net1", "second"} {
		if !inTree(t, c, id) {
			t.Fatalf("%s left the device tree while the VM was paused", id)
		}
	}
	if err := c.Resume(ctx, false); err != nil {
		t.Fatal(err)
	}
	waitLeavesTree(t, c, "_net1")
	waitLeavesTree(t, c, "second")
}

// TestSnapshotDuringPendingEjectKeepsNode: a snapshot taken while an eject is
// pending carries the node in state.json (config.json no longer has the
// device); a restore brings the node back without a device behind it: its
// id stays taken, remove-device fails with "Missing PCI device", and it
// never leaves. CH: DeviceManager::snapshot (DeviceManagerState.device_tree),
// DeviceManager::new with a snapshot, DeviceNode's serde(skip) handle.
func TestSnapshotDuringPendingEjectKeepsNode(t *testing.T) {
	ctl := t.TempDir()
	p, c, _, _, dir := bootVM(t, "VMCHAOS_FAILPOINTS=ch.eject.acked=pause", "VMCHAOS_FAILPOINT_CTL="+ctl)
	ctx := ctxT(t)
	if err := c.RemoveDevice(ctx, "_net1"); err != nil {
		t.Fatal(err)
	}
	if _, err := waitParked(t, ctl, "ch.eject.acked"); err != nil {
		t.Fatal(err)
	}
	snap := snapshotVM(t, c, dir)
	p.kill9()
	var cfg chapi.VmConfig
	decodeJSONFile(t, filepath.Join(snap, "config.json"), &cfg)
	if len(cfg.Net) != 0 {
		t.Fatalf("config.json holds the ejecting NIC: %+v", cfg.Net)
	}
	var st struct {
		Tree []struct {
			ID       string `json:"id"`
			Ejecting bool   `json:"ejecting"`
		} `json:"device_tree"`
	}
	b, err := os.ReadFile(filepath.Join(snap, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	held := false
	for _, n := range st.Tree {
		held = held || (n.ID == "_net1" && n.Ejecting)
	}
	if !held {
		t.Fatalf("state.json device tree %+v: want _net1 with its eject pending", st.Tree)
	}

	sock2 := filepath.Join(vmDir(t, "VMEJECTR"), "api.sock")
	_, c2 := startReady(t, sock2, baseEnv(`FAKECH_TIMING={"eject_ack":"100ms"}`), "--api-socket", "path="+sock2)
	if err := c2.Restore(ctx, chapi.RestoreConfig{SourceURL: "file://" + snap, Resume: true}); err != nil {
		t.Fatal(err)
	}
	if !inTree(t, c2, "_net1") {
		t.Fatal("restore dropped the node whose eject was pending")
	}
	e := chError(t, firstErr(c2.AddNet(ctx, chapi.NetConfig{IP: loopbackIP(), ID: "_net1"})))
	if e.Innermost() != "Invalid identifier as it is not unique: _net1" {
		t.Fatalf("add-net with the restored node's id: %v", e)
	}
	if e := chError(t, c2.RemoveDevice(ctx, "_net1")); e.Innermost() != "Missing PCI device" {
		t.Fatalf("remove-device of a restored orphan node: %v", e)
	}
	if _, err := c2.AddNet(ctx, chapi.NetConfig{IP: loopbackIP(), ID: "fresh"}); err != nil {
		t.Fatalf("add-net with a new id: %v", err)
	}
	// 100× the modelled ack time: nothing ever acks an orphan.
	time.Sleep(100 * time.Millisecond)
	if !inTree(t, c2, "_net1") {
		t.Fatal("the orphan node left the tree")
	}
}

// TestParkedEjectRequestHoldsTheAck: a park at ch.eject.requested or
// ch.net.removed holds the eject pending with the guest not told yet, as
// the points say (not yet: the guest's ack): no ch.eject.acked while
// parked, at 100× the modelled ack time; after the release the guest acks
// and the node leaves the tree. Before the fix the guest was told before
// the hit and acked on its own goroutine while the VMM was held.
func TestParkedEjectRequestHoldsTheAck(t *testing.T) {
	for _, point := range []string{"ch.eject.requested", "ch.net.removed"} {
		t.Run(point, func(t *testing.T) {
			ctl := t.TempDir()
			trace := newTrace(t)
			_, c, _, _, _ := bootVM(t, "VMCHAOS_FAILPOINTS="+point+"=pause", "VMCHAOS_FAILPOINT_CTL="+ctl,
				"VMCHAOS_TRACE="+trace.path, `FAKECH_TIMING={"eject_ack":"1ms"}`)
			ctx := ctxT(t)
			removed := make(chan error, 1)
			go func() { removed <- c.RemoveDevice(ctx, "_net1") }()
			if _, err := waitParked(t, ctl, point); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			trace.mu.Lock()
			for _, e := range trace.events {
				if e.Point == "ch.eject.acked" {
					t.Errorf("the guest acked the eject while %s was parked", point)
				}
			}
			trace.mu.Unlock()
			release(t, ctl, point)
			if err := <-removed; err != nil {
				t.Fatal(err)
			}
			trace.waitPoint(t, "ch.eject.acked")
			waitLeavesTree(t, c, "_net1")
		})
	}
}
