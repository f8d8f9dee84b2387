package nodeagent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/vmctl"
)

func fp(spec string) []string { return []string{"VMCHAOS_FAILPOINTS=" + spec} }

func bug(name string) []string { return []string{"VMCHAOS_REGRESS=" + name} }

// parked waits until the named failpoint parked and returns the parked pid.
func (s *stack) parked(point string) int {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	pid, err := failpoint.WaitParked(ctx, s.ctl, point)
	if err != nil {
		s.t.Fatal(err)
	}
	return pid
}

func (s *stack) release(point string) {
	s.t.Helper()
	if err := failpoint.Release(s.ctl, point); err != nil {
		s.t.Fatal(err)
	}
}

func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b)[i+2:])
	p, _ := strconv.Atoi(f[1])
	return p
}

// childWith returns a child of parent whose argv contains word, or 0.
func childWith(parent int, word string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || ppid(pid) != parent {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		for _, a := range strings.Split(string(b), "\x00") {
			if a == word {
				return pid
			}
		}
	}
	return 0
}

func (s *stack) waitDead(pid int, what string) {
	s.t.Helper()
	s.eventually(what+" exits", budget, func() error {
		if alive(pid) {
			return fmt.Errorf("pid %d alive", pid)
		}
		return nil
	})
}

// readyVM starts an agent, creates name and returns its view, leaving the
// agent running.
func (s *stack) readyVM(name string, env []string, flags ...string) nodeagent.VMView {
	s.t.Helper()
	s.startAgent(env, flags...)
	s.waitAPI()
	s.put(name, nodeagent.Intent{Snapshot: s.base})
	return s.waitGoal(name, nodeagent.LifecycleReady, budget)
}

func (s *stack) metric(name, key string) float64 {
	return s.scrape()[name][key]
}

func (s *stack) vmmState(id string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := chapi.New(filepath.Join(s.dir, "run", id, "api.sock")).Info(ctx)
	if err != nil {
		return "error: " + err.Error()
	}
	return info.State
}

// TestSIGTERMKillsInFlightChildren: what `systemctl stop` sends cancels the
// lifecycle context, and the in-flight vmctl child is dead by the time the
// agent has exited.
func TestSIGTERMKillsInFlightChildren(t *testing.T) {
	s := newStack(t)
	s.startAgent(fp("vm.clone.files-copied=pause"))
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	child := s.parked("vm.clone.files-copied")
	agentPid := s.agent.cmd.Process.Pid
	if ppid(child) != agentPid {
		t.Fatalf("parked pid %d is not the agent's child (ppid %d, agent %d)", child, ppid(child), agentPid)
	}
	start := time.Now()
	s.signalAgent(syscall.SIGTERM)
	if alive(child) {
		t.Fatalf("vmctl child %d still running after the agent exited on SIGTERM", child)
	}
	t.Logf("SIGTERM → agent exited with its child dead after %v", time.Since(start))

	// Restart: the create converges (what held up: create interrupted +
	// restart → record reclaimed, VM recreated, exactly one VM, no orphan).
	s.release("vm.clone.files-copied")
	s.startAgent(nil)
	s.waitAPI()
	s.waitGoal("web", nodeagent.LifecycleReady, budget)
	if vms := s.vms(); len(vms) != 1 {
		t.Fatalf("want exactly one VM, got %+v", vms)
	}
	if n := s.metric("nodeagent_orphan_vm_total", "nodeagent_orphan_vm_total"); n != 0 {
		t.Fatalf("orphan_vm_total = %v", n)
	}
}

// TestSIGKILLLeavesChildrenRunning: a SIGKILLed agent leaves its vmctl child
// running; the child dies on its own at its next write to the dead pipe.
func TestSIGKILLLeavesChildrenRunning(t *testing.T) {
	s := newStack(t)
	s.startAgent(fp("vm.clone.files-copied=pause"))
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	child := s.parked("vm.clone.files-copied")
	watcher := childWith(s.agent.cmd.Process.Pid, "status")
	if watcher == 0 {
		t.Fatal("no vm status watcher child")
	}
	s.killAgent()
	// The watcher is a pure observer that writes only on VM changes; it
	// dies with the agent instead of lingering until the next change.
	s.waitDead(watcher, "watcher child")
	time.Sleep(time.Second) // longer than SIGTERM's whole teardown
	if !alive(child) {
		t.Fatalf("vmctl child %d died with the SIGKILLed agent", child)
	}
	s.release("vm.clone.files-copied")
	s.waitDead(child, "orphaned vmctl child (EPIPE on its next write)")
}

// TestBusyStaleCreateReinvokesVerb (seed 001 #1): the agent is SIGKILLed
// during vm clone and back before the orphaned child died; the startup verb
// answers busy, the watch re-invokes it each tick and the create completes.
func TestBusyStaleCreateReinvokesVerb(t *testing.T) {
	s := newStack(t)
	placeholder := s.strandCreate()
	s.startAgent(nil, "--busy-create-budget", "200s")
	s.waitAPI()
	s.eventually("busy outcome", budget, func() error {
		if s.metric("nodeagent_stale_create_reconcile_total", `nodeagent_stale_create_reconcile_total{outcome="busy"}`) < 1 {
			return fmt.Errorf("no busy outcome yet")
		}
		return nil
	})
	s.release("vm.clone.files-copied") // the orphan dies on its next write
	v := s.waitGoal("web", nodeagent.LifecycleReady, budget)
	if c := s.metric("nodeagent_stale_create_reconcile_total", `nodeagent_stale_create_reconcile_total{outcome="collected"}`); c < 1 {
		t.Fatalf("collected = %v: the verb was not re-invoked", c)
	}
	if v.Status.VMID == placeholder {
		t.Fatalf("bound to the dead clone's placeholder %s", placeholder)
	}
	if vms := s.vms(); len(vms) != 1 || vms[0].State != vmctl.StateRunning {
		t.Fatalf("want one running VM, got %+v", vms)
	}
}

// TestRegressWatchBusyInspectOnly: with the historical watcher (inspect only)
// the dead clone's placeholder holds the name until the budget and the intent
// never becomes ready.
func TestRegressWatchBusyInspectOnly(t *testing.T) {
	s := newStack(t)
	s.strandCreate()
	s.startAgent(bug("watch-busy-inspect-only"), "--busy-create-budget", "100s")
	s.waitAPI()
	s.eventually("busy outcome", budget, func() error {
		if s.metric("nodeagent_stale_create_reconcile_total", `nodeagent_stale_create_reconcile_total{outcome="busy"}`) < 1 {
			return fmt.Errorf("no busy outcome yet")
		}
		return nil
	})
	s.release("vm.clone.files-copied")
	s.eventually("gave up at the budget", budget, func() error {
		v, _ := s.get("web")
		if v.Status.Lifecycle != nodeagent.LifecycleFailed || !strings.Contains(v.Status.Message, "did not leave creating") {
			return fmt.Errorf("%q %q", v.Status.Lifecycle, v.Status.Message)
		}
		return nil
	})
	if c := s.metric("nodeagent_stale_create_reconcile_total", `nodeagent_stale_create_reconcile_total{outcome="collected"}`); c != 0 {
		t.Fatalf("collected = %v with the bug on", c)
	}
}

// strandCreate SIGKILLs an agent while its vm clone child is parked after
// the placeholder was reserved, and returns the placeholder's id. The child
// stays parked (alive, holding the ops lock) until released.
func (s *stack) strandCreate() string {
	s.t.Helper()
	s.startAgent(fp("vm.clone.files-copied=pause"))
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	s.parked("vm.clone.files-copied")
	s.killAgent()
	vm := s.vmByName("web")
	if vm == nil || vm.State != vmctl.StateCreating {
		s.t.Fatalf("want a creating placeholder, got %+v", vm)
	}
	return vm.ID
}

// TestInterruptedSaveLeavesVMMPaused (seed 001 #2): systemctl stop while
// snapshot save has the guest paused; the VMM stays Paused; the resumed
// hibernate completes.
func TestInterruptedSaveLeavesVMMPaused(t *testing.T) {
	s := newStack(t)
	v := s.readyVM("web", nil)
	s.signalAgent(syscall.SIGTERM)
	s.startAgent(fp("snapshot.save.paused=pause"))
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
	s.parked("snapshot.save.paused")
	s.signalAgent(syscall.SIGTERM)
	if st := s.vmmState(v.Status.VMID); st != chapi.StatePaused {
		t.Fatalf("fault did not land: VMM state %q, want Paused", st)
	}
	s.startAgent(nil)
	s.waitAPI()
	s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
	if n := s.metric("nodeagent_startup_resume_total", `nodeagent_startup_resume_total{op="hibernate"}`); n != 1 {
		t.Fatalf("startup_resume_total{hibernate} = %v", n)
	}
	if n := sum(s.scrape()["nodeagent_lifecycle_failed_total"]); n != 0 {
		t.Fatalf("failed writes: %v", s.scrape()["nodeagent_lifecycle_failed_total"])
	}
}

// pendingHolder leaves a pending snapshot record holding the name "web":
// the agent is SIGKILLed while its save child is parked after the pending
// record was written. With killChild the orphan dies there (lease free);
// otherwise it stays parked holding the exclusive lease. Returns the pid.
func (s *stack) pendingHolder(killChild bool) int {
	s.t.Helper()
	s.readyVM("web", nil)
	s.signalAgent(syscall.SIGTERM)
	s.startAgent(fp("snapshot.save.pending=pause"))
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
	child := s.parked("snapshot.save.pending")
	s.killAgent()
	if killChild {
		_ = syscall.Kill(child, syscall.SIGKILL)
		s.waitDead(child, "killed save child")
	}
	var pending bool
	for _, sn := range s.snapshots() {
		pending = pending || sn.Name == "web" && sn.State == vmctl.SnapPending
	}
	if !pending {
		s.t.Fatalf("fault did not land: no pending holder of web: %+v", s.snapshots())
	}
	return child
}

// TestSaveKilledMidFlightPendingHolder (seed 001 #3): the resumed hibernate
// removes the pending holder by the ID parsed from "already in use by" and
// succeeds in one attempt with no failed write.
func TestSaveKilledMidFlightPendingHolder(t *testing.T) {
	s := newStack(t)
	s.pendingHolder(true)
	s.startAgent(nil)
	s.waitAPI()
	s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
	m := s.scrape()
	if n := sum(m["nodeagent_lifecycle_failed_total"]); n != 0 {
		t.Fatalf("failed writes: %v", m["nodeagent_lifecycle_failed_total"])
	}
	if ok := m["nodeagent_snapshot_save_total"][`nodeagent_snapshot_save_total{result="ok"}`]; ok != 1 {
		t.Fatalf("snapshot_save_total: %v", m["nodeagent_snapshot_save_total"])
	}
	if n := m["nodeagent_startup_resume_total"][`nodeagent_startup_resume_total{op="hibernate"}`]; n != 1 {
		t.Fatalf("resumed %v times", n)
	}
}

// TestSaveLeaseHeldIsWaitedFor (seed 001 #3, fourth issue): the agent is
// SIGKILLed while its save child is past the VM's ops lock, holding its build
// lease and pending record (parked at snapshot.save.pending). The orphaned
// child is a real dead save: the restarted agent's resumed hibernate boots
// the VM (the ops lock is free), is refused for the held name, and its
// `snapshot rm <holder>` meets the lease the orphan still holds. Released, the
// orphan finishes (or dies on its next write to the dead agent's pipe) and
// lets the lease go. The refusal is a transient: it is waited for, with no
// failed write; with save-no-lease-wait it fails at once.
func TestSaveLeaseHeldIsWaitedFor(t *testing.T) {
	for _, tc := range []struct {
		name       string
		env        []string
		wantFailed bool
	}{
		{"fixed", nil, false},
		{"bug-save-no-lease-wait", bug("save-no-lease-wait"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t)
			orphan := s.pendingHolder(false)
			if !alive(orphan) {
				t.Fatalf("the orphaned save child %d is gone", orphan)
			}
			s.startAgent(tc.env, "--lease-wait", "1200s")
			s.waitAPI()
			s.eventually("the agent's rm met the dead save's lease", budget, func() error {
				b, _ := os.ReadFile(s.agent.log)
				if !strings.Contains(string(b), "snapshot name held") {
					return fmt.Errorf("name not met yet")
				}
				if strings.Contains(string(b), "snapshot lease held by a live process") {
					return nil
				}
				if v, _ := s.get("web"); v.Status.Lifecycle == nodeagent.LifecycleFailed {
					return nil
				}
				return fmt.Errorf("rm not refused yet")
			})
			if !alive(orphan) {
				t.Fatalf("the orphan %d died before its lease was met", orphan)
			}
			s.release("snapshot.save.pending")
			s.waitDead(orphan, "released orphaned save")
			s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
			n := sum(s.scrape()["nodeagent_lifecycle_failed_total"])
			if tc.wantFailed != (n > 0) {
				t.Fatalf("failed writes = %v, want failed: %v", n, tc.wantFailed)
			}
		})
	}
}

// TestRegressSaveRecovery: with the historical recovery (match only "already
// exists", or rm by name) a pending holder strands the hibernate.
func TestRegressSaveRecovery(t *testing.T) {
	for _, tc := range []struct{ bug, want string }{
		{"save-match-already-exists-only", "already in use by"},
		{"save-rm-by-name", "rm by name failed"},
	} {
		t.Run(tc.bug, func(t *testing.T) {
			s := newStack(t)
			s.pendingHolder(true)
			s.startAgent(bug(tc.bug))
			s.waitAPI()
			s.eventually("hibernate fails", budget, func() error {
				v, _ := s.get("web")
				if v.Status.Lifecycle != nodeagent.LifecycleFailed || !strings.Contains(v.Status.Message, tc.want) {
					return fmt.Errorf("%q %q", v.Status.Lifecycle, v.Status.Message)
				}
				return nil
			})
		})
	}
}

// TestHibernateOwedOnCrashedVM (seed 001 #4): the agent is stopped during the
// hibernate before any save, the VMM is kill -9'd; the resumed hibernate
// starts the VM first and completes. With the historical gate on the listed
// state the VM is never booted.
func TestHibernateOwedOnCrashedVM(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   []string
		fixed bool
	}{
		{"fixed", nil, true},
		{"bug-resume-start-gated-on-listed-state", bug("resume-start-gated-on-listed-state"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t)
			v := s.readyVM("web", nil)
			s.signalAgent(syscall.SIGTERM)
			s.startAgent(fp("agent.hibernate.dhcp-released=pause"))
			s.waitAPI()
			s.put("web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
			s.parked("agent.hibernate.dhcp-released")
			s.signalAgent(syscall.SIGTERM)
			vm := s.vmByName("web")
			if vm == nil || vm.Pid <= 0 || vm.ID != v.Status.VMID {
				t.Fatalf("no VMM to kill: %+v", vm)
			}
			_ = syscall.Kill(vm.Pid, syscall.SIGKILL)
			s.waitDead(vm.Pid, "VMM")
			s.startAgent(tc.env, "--retry-attempts", "2")
			s.waitAPI()
			if tc.fixed {
				s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
				if n := s.metric("nodeagent_startup_resume_total", `nodeagent_startup_resume_total{op="hibernate"}`); n != 1 {
					t.Fatalf("startup_resume_total{hibernate} = %v", n)
				}
				return
			}
			s.eventually("parked failed", budget, func() error {
				v, _ := s.get("web")
				if v.Status.Lifecycle != nodeagent.LifecycleFailed || !strings.Contains(v.Status.Message, "retries exhausted") {
					return fmt.Errorf("%q %q", v.Status.Lifecycle, v.Status.Message)
				}
				return nil
			})
		})
	}
}

// TestTransientFailureLeavesFailed (seed 001 #5): a one-off failure writes
// failed, and the agent leaves failed by itself (bounded retry with backoff).
// With the historical sticky failed the intent stays parked.
func TestTransientFailureLeavesFailed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   []string
		fixed bool
	}{
		{"fixed", nil, true},
		{"bug-failed-sticky", bug("failed-sticky"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t)
			s.readyVM("web", append(fp("agent.hibernate.saved=1*error(registry blip)"), tc.env...))
			s.put("web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
			s.eventually("failed written", budget, func() error {
				if n := s.metric("nodeagent_lifecycle_failed_total", `nodeagent_lifecycle_failed_total{reason="snapshot"}`); n != 1 {
					return fmt.Errorf("failed_total{snapshot} = %v", n)
				}
				return nil
			})
			if tc.fixed {
				s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
				return
			}
			// Several backoff periods (2s..10s at scale 1 → 0.1..0.5s).
			time.Sleep(3 * time.Second)
			v, _ := s.get("web")
			if v.Status.Lifecycle != nodeagent.LifecycleFailed {
				t.Fatalf("sticky failed left failed: %+v", v.Status)
			}
			// A new generation is still a way out.
			s.put("web", nodeagent.Intent{Snapshot: s.base})
			s.waitGoal("web", nodeagent.LifecycleReady, budget)
		})
	}
}
