package nodeagent_test

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/internal/registrytest"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/vmctl"
)

// killRun drives one intent through create, hibernate, wake and delete while
// the agent SIGKILLs itself at one failpoint; every time the agent is dead it
// is restarted on the same state dir without the failpoint.
type killRun struct {
	s      *stack
	killed int
	// VM holding the name when the agent died, and the step it died in.
	deadVM   *vmctl.VM
	deadStep string
}

func (k *killRun) dead() bool {
	select {
	case <-k.s.agent.done:
		return true
	default:
		return false
	}
}

// ensureUp restarts a dead agent without failpoints and waits for its API.
func (k *killRun) ensureUp(step string) {
	s := k.s
	if s.agent != nil && !k.dead() {
		return
	}
	if s.agent != nil {
		s.agent = nil
		k.killed++
		k.deadVM, k.deadStep = s.vmByName("web"), step
	}
	s.startAgent(nil)
	for {
		if k.dead() {
			s.t.Fatalf("agent died without failpoints")
		}
		if _, _, err := s.api("GET", "/v1/vms", nil); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// request sends a request, restarting the agent while it is down.
func (k *killRun) request(step, method, path string, body any) {
	s := k.s
	for i := 0; ; i++ {
		k.ensureUp(step)
		code, b, err := s.api(method, path, body)
		if err == nil && (code/100 == 2 || method == "DELETE" && code == http.StatusNotFound) {
			return
		}
		if i > 200 {
			s.t.Fatalf("%s %s: %d %s %v", method, path, code, b, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// until waits for cond, restarting the agent whenever it died.
func (k *killRun) until(step string, cond func() error) {
	s := k.s
	deadline := time.Now().Add(budget)
	for {
		k.ensureUp(step)
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: not converged: %v", step, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (k *killRun) goal(step, want string) nodeagent.VMView {
	var v nodeagent.VMView
	k.until(step, func() error {
		code, b, err := k.s.api("GET", "/v1/vms/web", nil)
		if err != nil {
			return err
		}
		if code != 200 {
			return fmt.Errorf("GET: %d %s", code, b)
		}
		v = nodeagent.VMView{}
		if err := jsonUnmarshal(b, &v); err != nil {
			return err
		}
		if v.Status.Lifecycle != want || v.Status.ObservedGeneration != v.Generation || v.Op != "" {
			return fmt.Errorf("lifecycle %q gen %d/%d op %q %q", v.Status.Lifecycle, v.Status.ObservedGeneration, v.Generation, v.Op, v.Status.Message)
		}
		return nil
	})
	return v
}

// TestSIGKILLAtEveryAgentPoint: SIGKILL at each agent.* failpoint, then a
// restart: the intent is neither lost nor executed twice (a VM that existed
// when the agent died is adopted, not re-created; a wake restores the
// hibernated RAM, not a fresh boot) and every goal is reached.
func TestSIGKILLAtEveryAgentPoint(t *testing.T) {
	var points []string
	for _, p := range failpoint.Catalogue {
		if p.Proc == "nodeagent" {
			points = append(points, p.Name)
		}
	}
	if len(points) < 20 {
		t.Fatalf("catalogue lists %d agent points", len(points))
	}
	for _, p := range points {
		t.Run(p, func(t *testing.T) {
			// each point has its own stack and the kill lands at the point
			// itself (no clock): two at a time (go test -parallel) halves
			// the 48 s this test took, mostly spent waiting on processes
			t.Parallel()
			spec := p + "=kill"
			switch p {
			case "agent.child.exec", "agent.child.exit":
				spec += "@vm=web" // in the middle of the create, not at startup
			case "agent.failed":
				spec = "agent.hibernate.saved=1*error(registry blip);agent.failed=kill"
			case "agent.child.vm-died":
				// hit only when a VMM dies: scenario mx-found-wake-vmm-death-in-flight
				// parks there (ReleaseAfter) with a VMM killed under a wake
				t.Skip("agent.child.vm-died fires only on a VMM death; covered by scenario mx-found-wake-vmm-death-in-flight")
			case "agent.migrate.applied", "agent.migrate.released":
				// hit only by an agent syncing against a control plane
				t.Skip(p + " fires only with --control-plane; covered by scenarios mig-sigkill-main-at-migrate-applied and mig-sigkill-main-at-migrate-released")
			case "agent.wedged":
				// hit only when an intent is stuck past its budget
				t.Skip("agent.wedged fires only on a wedge; covered by TestWedgeIsReportedAndPersisted and scenario s001-obs-wedge-visible")
			}
			s := newStack(t)
			// --registry points are hit only against a real registry, and
			// the pull only by a wake that finds no local snapshot
			cold := false
			if pt, _ := failpoint.Lookup(p); pt.Op == "registry" {
				s.flags = append(s.flags, "--registry", registrytest.Start(t).URL)
				cold = p == "agent.pull.manifest"
			}
			k := &killRun{s: s}
			s.startAgent(fp(spec))

			k.request("create", "PUT", "/v1/vms/web", nodeagent.Intent{Snapshot: s.base})
			v := k.goal("create", nodeagent.LifecycleReady)
			k.checkAdopted("create", v)
			if _, err := s.guest(v.Status.VMID, "touch", "/run/marker"); err != nil {
				t.Fatal(err)
			}
			if vms := s.vms(); len(vms) != 1 {
				t.Fatalf("after create: want one VM, got %+v", vms)
			}

			k.request("hibernate", "PUT", "/v1/vms/web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
			k.goal("hibernate", nodeagent.LifecycleHibernated)
			if vm := s.vmByName("web"); vm != nil {
				t.Fatalf("hibernated with VM %+v alive", vm)
			}

			if cold {
				s.vmctl("snapshot", "rm", "web")
			}
			k.request("wake", "PUT", "/v1/vms/web", nodeagent.Intent{Snapshot: s.base})
			v = k.goal("wake", nodeagent.LifecycleReady)
			k.checkAdopted("wake", v)
			if out, err := s.guest(v.Status.VMID, "ls", "/run"); err != nil || !strings.Contains(out, "marker") {
				t.Fatalf("RAM marker lost: the wake booted fresh: %q %v", out, err)
			}

			k.request("delete", "DELETE", "/v1/vms/web", nil)
			k.until("delete", func() error {
				code, _, err := s.api("GET", "/v1/vms/web", nil)
				if err != nil || code != http.StatusNotFound {
					return fmt.Errorf("GET web: %d %v", code, err)
				}
				return nil
			})
			if k.killed == 0 {
				t.Fatalf("the agent never died at %s", p)
			}
			if vms := s.vms(); len(vms) != 0 {
				t.Fatalf("VMs left: %+v", vms)
			}
			if sn := s.snapshots(); len(sn) != 1 || sn[0].Name != s.base {
				t.Fatalf("snapshots left: %+v", sn)
			}
			if ents, _ := os.ReadDir(s.registry); len(ents) != 0 {
				t.Fatalf("registry left: %v", names(ents))
			}
			s.checkStore()
			t.Logf("%s: agent killed %d time(s), last in step %s", p, k.killed, k.deadStep)
		})
	}
}

// checkAdopted: if a running VM held the name when the agent died during
// this step, the converged intent is bound to that same VM.
func (k *killRun) checkAdopted(step string, v nodeagent.VMView) {
	if k.deadStep != step || k.deadVM == nil || k.deadVM.State != vmctl.StateRunning {
		return
	}
	if v.Status.VMID != k.deadVM.ID {
		k.s.t.Fatalf("%s executed twice: VM %s was running when the agent died, now bound to %s", step, k.deadVM.ID, v.Status.VMID)
	}
}
