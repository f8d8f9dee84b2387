package nodeagent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/nodeagent"
)

// TestHibernateRecoversFromEjectPending: the guest does not ack the NIC
// unplug of a hibernate in time, so vm net fails with "eject pending"; the
// agent runs the NIC change again, and once the guest acks, the hibernate
// completes and the wake still finds the guest's RAM (no fresh boot).
func TestHibernateRecoversFromEjectPending(t *testing.T) {
	s := newStack(t)
	// Every VMM the agent's children start inherits this: its guest's first
	// eject ack parks until released.
	s.startAgent([]string{failpoint.EnvFailpoints + "=ch.eject.acked=1*pause"})
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	v := s.waitGoal("web", nodeagent.LifecycleReady, budget)
	if _, err := s.guest(v.Status.VMID, "touch", "/run/ram-marker"); err != nil {
		t.Fatal(err)
	}
	s.put("web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
	s.eventually("the agent to meet an eject pending and run the NIC change again", budget, func() error {
		b, _ := os.ReadFile(s.agent.log)
		if !strings.Contains(string(b), "eject pending, running it again") {
			return errorf("not yet")
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(s.ctl, "ch.eject.acked.paused")); err != nil {
		t.Fatalf("the guest's ack is not parked: %v", err)
	}
	if err := failpoint.Release(s.ctl, "ch.eject.acked"); err != nil {
		t.Fatal(err)
	}
	s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	v = s.waitGoal("web", nodeagent.LifecycleReady, budget)
	if out, err := s.guest(v.Status.VMID, "ls", "/run"); err != nil || !strings.Contains(out, "ram-marker") {
		t.Fatalf("RAM lost over a hibernate whose eject was slow: %q %v", out, err)
	}
}
