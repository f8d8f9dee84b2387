package vmctl

import (
	"context"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/failpoint"
)

// vmmTree is the device tree of VM ref's VMM, as vm.info shows it.
func (s *stack) vmmTree(ref string) map[string]chapi.DeviceNode {
	s.t.Helper()
	v := s.vm(ref)
	info, err := chapi.New(s.m.apiSocket(v.ID)).Info(context.Background())
	if err != nil {
		s.t.Fatalf("vm.info of %s: %v", ref, err)
	}
	return info.DeviceTree
}

func TestUniqueNICsAvoidsIdsTheTreeHolds(t *testing.T) {
	mac := "52:54:00:0a:0b:0c"
	tree := map[string]chapi.DeviceNode{"n5254000a0b0c": {ID: "n5254000a0b0c"}, "n5254000a0b0c-1": {ID: "n5254000a0b0c-1"}}
	got := uniqueNICs(tree, []NIC{{ID: nicID(mac), MAC: mac}, {ID: nicID("52:54:00:00:00:01"), MAC: "52:54:00:00:00:01"}})
	if got[0].ID != "n5254000a0b0c-2" || got[1].ID != "n525400000001" {
		t.Fatalf("ids %q %q: want the MAC id moved past the taken ones, the free one kept", got[0].ID, got[1].ID)
	}
}

// TestNetWaitsForEjectAndRecovers: vm net --nics 0 waits for the guest to
// ack the eject; when it does not within the budget the verb fails with
// "eject pending", the record keeps the id, and re-running the verb after
// the guest acked finishes the change.
func TestNetWaitsForEjectAndRecovers(t *testing.T) {
	s := newStack(t, "0.02")
	// The VMM inherits the failpoint: the guest's first eject ack parks.
	r := s.runEnv([]string{failpoint.EnvFailpoints + "=ch.eject.acked=1*pause"}, "vm", "run", "--name", "a", s.image)
	if r.code != 0 {
		t.Fatalf("vm run: %s", r)
	}
	s.waitGuest("a")
	old := s.vm("a").Network[0]
	if old.ID != nicID(old.MAC) {
		t.Fatalf("NIC id %q, want it named after its MAC %s", old.ID, old.MAC)
	}
	s.fails("eject pending", "vm", "net", "a", "--nics", "0")
	if v := s.vm("a"); len(v.Ejecting) != 1 || v.Ejecting[0] != old.ID {
		t.Fatalf("record after a timed-out eject: ejecting %v, want [%s]", v.Ejecting, old.ID)
	}
	if _, ok := s.vmmTree("a")[old.ID]; !ok {
		t.Fatalf("the parked eject's node left the tree")
	}
	s.release("ch.eject.acked")
	s.ok("vm", "net", "a", "--nics", "0")
	v := s.vm("a")
	if len(v.Ejecting) != 0 || len(v.Network) != 0 {
		t.Fatalf("after the recovery run: %+v", v)
	}
	if _, ok := s.vmmTree("a")[old.ID]; ok {
		t.Fatalf("vm net returned with %s still in the device tree", old.ID)
	}
	s.ok("vm", "net", "a", "--nics", "1")
	s.waitGuest("a")
}

// TestCloneAvoidsIdsTheRestoredTreeHolds: a snapshot's device tree holds the
// source's NIC (and, when saved mid-eject, one whose eject was pending); the
// clone's restored VMM keeps those nodes, so the clone's NICs must take ids
// the tree does not hold — as CH requires.
func TestCloneAvoidsIdsTheRestoredTreeHolds(t *testing.T) {
	s := newStack(t, "0.02")
	r := s.runEnv([]string{failpoint.EnvFailpoints + "=ch.eject.acked=1*pause"}, "vm", "run", "--name", "a", s.image)
	if r.code != 0 {
		t.Fatalf("vm run: %s", r)
	}
	s.waitGuest("a")
	src := s.vm("a").Network[0]
	s.ok("snapshot", "save", "--name", "attached", "a")
	s.fails("eject pending", "vm", "net", "a", "--nics", "0")
	s.ok("snapshot", "save", "--name", "mid-eject", "a")
	for _, snap := range []string{"attached", "mid-eject"} {
		name := "from-" + snap
		s.ok("vm", "clone", "--name", name, "--nics", "1", snap)
		s.waitGuest(name)
		v := s.vm(name)
		tree := s.vmmTree(name)
		if _, ok := tree[src.ID]; !ok {
			t.Fatalf("%s: the restored tree lost the source NIC %s: %v", snap, src.ID, tree)
		}
		if len(v.Network) != 1 || v.Network[0].ID == src.ID || !strings.HasPrefix(v.Network[0].ID, "n") {
			t.Fatalf("%s: clone NICs %+v (source id %s)", snap, v.Network, src.ID)
		}
		if _, ok := tree[v.Network[0].ID]; !ok {
			t.Fatalf("%s: the record's NIC id %s is not in the VMM's tree", snap, v.Network[0].ID)
		}
	}
	s.release("ch.eject.acked")
}
