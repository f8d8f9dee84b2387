package nodeagent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/nodeagent"
)

const budget = 90 * time.Second

// TestLifecycleCreateHibernateWakeDelete: create → ready with the guest
// reachable over SSH; hibernate → hibernated with no VM and the snapshot
// pushed; wake → ready with a RAM file written before the hibernate still
// there; delete → nothing left (VM, hibernate snapshot, registry entry).
func TestLifecycleCreateHibernateWakeDelete(t *testing.T) {
	s := newStack(t)
	s.startAgent(nil)
	s.waitAPI()

	s.put("web", nodeagent.Intent{Snapshot: s.base})
	v := s.waitGoal("web", nodeagent.LifecycleReady, budget)
	if v.Status.VMID == "" || v.Status.Address == "" || v.Status.PostClone != nodeagent.PostCloneDone {
		t.Fatalf("ready without binding: %+v", v.Status)
	}
	if out, err := s.guest(v.Status.VMID, "hostname"); err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("guest not reachable over SSH: %q %v", out, err)
	}
	if _, err := s.guest(v.Status.VMID, "touch", "/run/ram-marker"); err != nil {
		t.Fatal(err)
	}
	bootID, err := s.guest(v.Status.VMID, "cat", "/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}

	s.put("web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
	v = s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
	if v.Status.VMID != "" {
		t.Fatalf("hibernated with a bound VM: %+v", v.Status)
	}
	if vm := s.vmByName("web"); vm != nil {
		t.Fatalf("hibernated but VM %s still exists (%s)", vm.ID, vm.State)
	}
	if _, err := os.Stat(filepath.Join(s.registry, "web.json")); err != nil {
		t.Fatalf("snapshot not pushed: %v", err)
	}

	s.put("web", nodeagent.Intent{Snapshot: s.base})
	v = s.waitGoal("web", nodeagent.LifecycleReady, budget)
	if out, err := s.guest(v.Status.VMID, "ls", "/run"); err != nil || !strings.Contains(out, "ram-marker") {
		t.Fatalf("RAM file lost over hibernate/wake (fresh boot?): %q %v", out, err)
	}
	if b2, err := s.guest(v.Status.VMID, "cat", "/proc/sys/kernel/random/boot_id"); err != nil || b2 != bootID {
		t.Fatalf("boot id changed over hibernate/wake: %q → %q (%v)", bootID, b2, err)
	}

	code, b, err := s.api("DELETE", "/v1/vms/web", nil)
	if err != nil || code != 202 {
		t.Fatalf("DELETE: %d %s %v", code, b, err)
	}
	s.waitGone("web", budget)
	if vms := s.vms(); len(vms) != 0 {
		t.Fatalf("VMs left after delete: %+v", vms)
	}
	for _, sn := range s.snapshots() {
		if sn.Name != s.base {
			t.Fatalf("snapshot left after delete: %+v", sn)
		}
	}
	if len(s.snapshots()) != 1 {
		t.Fatalf("the unrelated base snapshot must survive a delete: %+v", s.snapshots())
	}
	ents, _ := os.ReadDir(s.registry)
	if len(ents) != 0 {
		t.Fatalf("registry not empty after delete: %v", names(ents))
	}
	s.checkStore()
	m := s.scrape()
	if m["nodeagent_wake_total"][`nodeagent_wake_total{result="ok"}`] != 1 {
		t.Fatalf("wake_total: %v", m["nodeagent_wake_total"])
	}
	if n := sum(m["nodeagent_lifecycle_failed_total"]); n != 0 {
		t.Fatalf("failed writes in a clean lifecycle: %v", m["nodeagent_lifecycle_failed_total"])
	}
}

func names(ents []os.DirEntry) []string {
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
