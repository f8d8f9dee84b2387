package nodeagent_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/nodeagent"
)

// hibernated brings "web" to hibernated with a RAM marker written while it
// was ready, and returns the VM id it had.
func (s *stack) hibernated() string {
	s.t.Helper()
	v := s.readyVM("web", nil)
	if _, err := s.guest(v.Status.VMID, "touch", "/run/marker"); err != nil {
		s.t.Fatal(err)
	}
	s.put("web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
	h := s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
	if h.Status.PostClone != "" || h.Status.VMID != "" {
		s.t.Fatalf("markers of the removed VM incarnation survived: %+v", h.Status)
	}
	return v.Status.VMID
}

func (s *stack) ramMarker(id string) bool {
	out, err := s.guest(id, "ls", "/run")
	return err == nil && strings.Contains(out, "marker")
}

// TestDeleteInterruptedByRestart (what held up): systemctl restart while
// vm rm --force is in flight; after the restart the VM, its hibernate
// snapshot and registry entry are gone and the unrelated base snapshot stays.
func TestDeleteInterruptedByRestart(t *testing.T) {
	s := newStack(t)
	s.readyVM("web", nil)
	s.signalAgent(syscall.SIGTERM)
	s.startAgent(fp("vm.rm.tombstoned=pause"))
	s.waitAPI()
	if code, b, _ := s.api("DELETE", "/v1/vms/web", nil); code != 202 {
		t.Fatalf("DELETE: %d %s", code, b)
	}
	s.parked("vm.rm.tombstoned")
	s.signalAgent(syscall.SIGTERM)
	s.startAgent(nil)
	s.waitAPI()
	s.waitGone("web", budget)
	if vms := s.vms(); len(vms) != 0 {
		t.Fatalf("VMs left: %+v", vms)
	}
	if sn := s.snapshots(); len(sn) != 1 || sn[0].Name != s.base {
		t.Fatalf("snapshots: %+v", sn)
	}
	s.checkStore() // no tombstone, no VMM left by the interrupted rm
}

// TestOrphanedPauseBeforeHibernate (seed 001 #2, the field form): a save the
// agent does not own dies inside its pause window, leaving the VMM Paused
// under a running record; the agent's next hibernate completes (its first
// guest exec goes through vmctl, which converges an ownerless pause).
func TestOrphanedPauseBeforeHibernate(t *testing.T) {
	s := newStack(t)
	v := s.readyVM("web", nil)
	cmd := exec.Command(filepath.Join(s.bin, "vmctl"), "snapshot", "save", "--name", "side", v.Status.VMID)
	cmd.Env = append(append(os.Environ(), s.env...), "VMCHAOS_FAILPOINTS=snapshot.save.paused=kill")
	if err := cmd.Run(); err == nil {
		t.Fatal("the direct save was not killed")
	}
	if st := s.vmmState(v.Status.VMID); st != chapi.StatePaused {
		t.Fatalf("fault did not land: VMM %q", st)
	}
	s.put("web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
	s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
	if n := sum(s.scrape()["nodeagent_lifecycle_failed_total"]); n != 0 {
		t.Fatalf("failed writes: %v", s.scrape()["nodeagent_lifecycle_failed_total"])
	}
}

// TestWakeInterruptedByDoubleRestart (what held up: wake interrupted by a
// restart; double restart): the wake's clone is cut by SIGTERM twice; the
// third agent re-derives the same owed work and completes it once, from the
// hibernate snapshot (the RAM marker is there), with exactly one VM.
func TestWakeInterruptedByDoubleRestart(t *testing.T) {
	s := newStack(t)
	s.hibernated()
	s.signalAgent(syscall.SIGTERM)
	s.startAgent(fp("vm.clone.restored=pause"))
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	s.parked("vm.clone.restored")
	s.signalAgent(syscall.SIGTERM)
	_ = os.Remove(filepath.Join(s.ctl, "vm.clone.restored.paused"))
	s.startAgent(fp("vm.clone.restored=pause"))
	s.waitAPI()
	s.parked("vm.clone.restored")
	s.signalAgent(syscall.SIGTERM)
	s.startAgent(nil)
	s.waitAPI()
	v := s.waitGoal("web", nodeagent.LifecycleReady, budget)
	if !s.ramMarker(v.Status.VMID) {
		t.Fatal("wake booted fresh: RAM marker missing")
	}
	if vms := s.vms(); len(vms) != 1 {
		t.Fatalf("want one VM, got %+v", vms)
	}
	if n := s.metric("nodeagent_startup_resume_total", `nodeagent_startup_resume_total{op="wake"}`); n != 2 {
		t.Fatalf("startup_resume_total{wake} = %v, want 2", n)
	}
}

// TestNeverFreshBootOverHibernateSnapshot (seed 001 coverage gap): the
// agent's record of a hibernated VM is lost ("keep the tag, drop the pod");
// a fresh create of the same name finds the hibernate evidence and wakes from
// it instead of booting fresh from the source snapshot.
func TestNeverFreshBootOverHibernateSnapshot(t *testing.T) {
	s := newStack(t)
	s.hibernated()
	s.killAgent()
	if err := os.Remove(filepath.Join(s.state, "vms", "web.json")); err != nil {
		t.Fatal(err)
	}
	s.startAgent(nil)
	s.waitAPI()
	if _, ok := s.get("web"); ok {
		t.Fatal("record still there")
	}
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	v := s.waitGoal("web", nodeagent.LifecycleReady, budget)
	if !s.ramMarker(v.Status.VMID) {
		t.Fatal("fresh boot over a hibernate snapshot: RAM marker missing")
	}
	if n := s.metric("nodeagent_hibernate_evidence_total", `nodeagent_hibernate_evidence_total{verdict="registry"}`); n != 1 {
		t.Fatalf("evidence not counted: %v", s.scrape()["nodeagent_hibernate_evidence_total"])
	}
}

// TestWakeWithoutSnapshotRefusesFreshBoot (what held up: fail closed): the
// hibernate snapshot is gone locally and from the registry; the wake fails
// with "refusing fresh boot" and creates no VM.
func TestWakeWithoutSnapshotRefusesFreshBoot(t *testing.T) {
	s := newStack(t)
	s.hibernated()
	for _, sn := range s.snapshots() {
		if sn.Name == "web" {
			s.vmctl("snapshot", "rm", sn.ID)
		}
	}
	ents, _ := os.ReadDir(s.registry)
	for _, e := range ents {
		_ = os.Remove(filepath.Join(s.registry, e.Name()))
	}
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	s.eventually("wake refused", budget, func() error {
		v, _ := s.get("web")
		if v.Status.Lifecycle != nodeagent.LifecycleFailed || !strings.Contains(v.Status.Message, "refusing fresh boot") {
			return errorf("%q %q", v.Status.Lifecycle, v.Status.Message)
		}
		return nil
	})
	if vms := s.vms(); len(vms) != 0 {
		t.Fatalf("a VM was booted: %+v", vms)
	}
}

// TestVMMKilledBeforeReadiness: the VMM dies between the clone and the
// post-clone readiness check; the create boots the bound VM again before it
// probes the guest (not a re-clone, no failed write).
func TestVMMKilledBeforeReadiness(t *testing.T) {
	s := newStack(t)
	s.startAgent(fp("agent.create.cloned=pause"), "--ready-budget", "1200s")
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	s.parked("agent.create.cloned")
	vm := s.vmByName("web")
	if vm == nil || vm.Pid <= 0 {
		t.Fatalf("no VMM: %+v", vm)
	}
	_ = syscall.Kill(vm.Pid, syscall.SIGKILL)
	s.waitDead(vm.Pid, "VMM")
	s.release("agent.create.cloned")
	v := s.waitGoal("web", nodeagent.LifecycleReady, budget)
	if v.Status.VMID != vm.ID {
		t.Fatalf("re-created instead of restarted: %s → %s", vm.ID, v.Status.VMID)
	}
	if n := sum(s.scrape()["nodeagent_lifecycle_failed_total"]); n != 0 {
		t.Fatalf("failed writes: %v", s.scrape()["nodeagent_lifecycle_failed_total"])
	}
}
