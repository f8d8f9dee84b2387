package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/stack"
)

// victimArm is a fault armed inside its victim (issue #20): the process that
// hits the trigger point is the one the fault kills, so it gets
// `POINT=1*signal(KILL,OFFSET,once=TOKEN)` in its environment and kills
// itself OFFSET after its hit on its own clock; trace delivery and the
// harness's wake-up drop out of the error. The token makes it one-shot: the
// restarted agent (same unit environment) and the agent's later children
// (they inherit it) go on unharmed.
type victimArm struct {
	token, spec string
	trigger     injector.Trigger // as armed (sigkill-vmm: narrowed to its VM's id)
	harness     bool             // the spec goes to the harness's own vmctl processes, not the agent
}

// inVictimOff opts the runner out of in-victim arming (A/B against the
// harness path): VMCHAOS_INJECTOR_INVICTIM=0.
var inVictimOff = os.Getenv("VMCHAOS_INJECTOR_INVICTIM") == "0"

// victimArms decides, once per case (after the fault's offset is placed),
// which faults are armed in their victim. Only a SIGKILL of the process that
// hits an `at POINT + OFFSET` point at its first hit qualifies: sigkill-main
// where the agent hits the point, sigkill-child where the agent's vmctl
// child of the fault's kind does, sigkill-direct (a vmctl the harness
// started), sigkill-vmm at a fakech point of a VM that exists at arming
// (its VMM hits it; the spec is narrowed to that VM's id, which fakech's
// hits carry, and reaches the VMM through the agent and vmctl, whose
// environment it inherits). Everything else — supervisor faults (stop, restart, kill-all go
// through systemctl or its stand-in), after-exit and park triggers, a victim
// that is not the hitter — keeps the harness path.
func (cr *caseRun) victimArms() map[int]victimArm {
	if cr.vArms != nil || inVictimOff {
		return cr.vArms
	}
	cr.vArms = map[int]victimArm{}
	for i, f := range cr.s.Faults {
		t, err := injector.ParseTrigger(cr.r.triggerString(cr.c, i))
		if err != nil || t.Kind != injector.TriggerAt || t.N > 1 {
			continue
		}
		proc, op := pointOf(t.Point)
		var harness bool
		switch {
		case f.Kind == "sigkill-main" && f.Unit != "daemon" && proc == "nodeagent":
		case f.Kind == "sigkill-child" && proc == "vmctl" && (f.Child == "" || strings.HasSuffix(f.Child, "-"+op)):
		case f.Kind == "sigkill-direct" && proc == "vmctl":
			harness = true
		case f.Kind == "sigkill-vmm" && proc == "fakech":
			if t.VM = cr.injFault(f).VM; t.VM == "" {
				continue // not created yet: a spec without @vm= would arm any VMM
			}
		default:
			continue
		}
		token := fmt.Sprintf("c%x-f%d", cr.armSalt(), i)
		spec, err := injector.VictimSpecOnce(cr.victimFault(f), t, token)
		if err != nil {
			continue // the harness path then
		}
		cr.vArms[i] = victimArm{token: token, spec: spec, trigger: t, harness: harness}
	}
	return cr.vArms
}

// armSalt keeps tokens of different cases (and repeats) apart in one
// control dir.
func (cr *caseRun) armSalt() int64 {
	if cr.salt == 0 {
		cr.salt = failpoint.Now()
	}
	return cr.salt
}

// victimSpecs joins the in-victim specs for the agent (harness=false) or
// for the harness's own processes.
func (cr *caseRun) victimSpecs(harness bool) []string {
	var out []string
	for i := range cr.s.Faults {
		if a, ok := cr.victimArms()[i]; ok && a.harness == harness {
			out = append(out, a.spec)
		}
	}
	return out
}

// victimFault is the injector fault of a catalogue fault, sigkill-direct
// included (the hitter: a vmctl the harness started).
func (cr *caseRun) victimFault(f scenarios.Fault) injector.Fault {
	if f.Kind == "sigkill-direct" {
		return injector.Fault{Kind: injector.FaultSigkillHitter}
	}
	return cr.injFault(f)
}

// withSpecs is a VMCHAOS_FAILPOINTS value with specs added.
func withSpecs(fps string, specs []string) string {
	if fps != "" {
		specs = append([]string{fps}, specs...)
	}
	return strings.Join(specs, ";")
}

// withoutPoints drops the rules of a VMCHAOS_FAILPOINTS spec at points.
func withoutPoints(spec string, points map[string]bool) string {
	var keep []string
	for _, rule := range strings.Split(spec, ";") {
		name, _, _ := strings.Cut(rule, "=")
		if rule != "" && !points[strings.TrimSpace(name)] {
			keep = append(keep, rule)
		}
	}
	return strings.Join(keep, ";")
}

// pointOf is the process that hits a point and its operation (catalogue).
func pointOf(name string) (proc, op string) {
	for _, p := range failpoint.Catalogue {
		if p.Name == name {
			return p.Proc, p.Op
		}
	}
	return "", ""
}

// armTimed arms an `at`/`after-exit` fault in the injector — in its victim
// when victimArms says so — and returns its wait. sigkill-direct is the
// injector's sigkill-hitter, allowed only on a vmctl the harness started.
func (cr *caseRun) armTimed(ctx context.Context, i int, t injector.Trigger) (pendingFault, error) {
	f := cr.s.Faults[i]
	opts := []injector.ArmOption{injector.From(cr.mark)}
	if a, ok := cr.victimArms()[i]; ok {
		opts = append(opts, injector.Once(a.token))
		t = a.trigger
	}
	if f.Kind == "sigkill-direct" {
		opts = append(opts, injector.HitterProc("vmctl"), injector.Resolve(cr.directHost))
	}
	a, err := cr.inj.Arm(ctx, cr.victimFault(f), t, opts...)
	if err != nil {
		return pendingFault{}, harnessErr(fmt.Errorf("arm fault %d: %w", i, err))
	}
	return pendingFault{[]int{i}, func(ctx context.Context) ([]reports.Injection, error) {
		in, err := a.Wait(ctx)
		if err != nil {
			a.Cancel()
			return nil, err
		}
		return []reports.Injection{cr.record(i, in)}, nil
	}}, nil
}

// startDirect starts a vmctl as the harness, records it as direct[key] and
// returns its exit channel. The process may send its first datagram, and be
// identified by directHost on the injector's side, before start returns its
// pid; while it is not recorded yet, starting tells directHost to wait for
// it rather than call it a process the harness did not start.
func (cr *caseRun) startDirect(key string, start func() (*exec.Cmd, <-chan int, error)) (<-chan int, error) {
	cr.mu.Lock()
	cr.starting++
	cr.mu.Unlock()
	cmd, exit, err := start()
	cr.mu.Lock()
	defer cr.mu.Unlock()
	cr.starting--
	if err == nil {
		d := &directProc{pid: cmd.Process.Pid, exit: exit}
		if cr.st.Namespaced() {
			go cr.learnDirect(d)
		} else {
			d.self, d.host = d.pid, d.pid
		}
		cr.direct[key] = d
		cr.lastDirect = key
	}
	cr.directChanged()
	return exit, err
}

// learnDirect finds a sandboxed direct vmctl, nsenter's child, and records
// its pids while it lives: it may kill itself a few ms after its first
// datagram, before a loaded harness has asked who sent it. self -1 records
// that it was gone first.
func (cr *caseRun) learnDirect(d *directProc) {
	self, host := -1, 0
	if nsenter, err := injector.Identify(d.pid); err == nil {
	poll:
		for giveUp := time.Now().Add(30 * time.Second); nsenter.Alive() && time.Now().Before(giveUp); time.Sleep(time.Millisecond) {
			for _, c := range stack.ChildrenOf(d.pid) {
				if s := stack.NSLocal(c); s > 0 {
					self, host = s, c
					break poll
				}
			}
		}
	}
	cr.mu.Lock()
	d.self, d.host = self, host
	cr.directChanged()
	cr.mu.Unlock()
}

// directChanged wakes directHost's waiters; call with cr.mu held.
func (cr *caseRun) directChanged() {
	if cr.directAdded != nil {
		close(cr.directAdded)
		cr.directAdded = nil
	}
}

// directHost is the host pid of the vmctl the harness started whose pid, as
// it sees itself, is pid, from the record startDirect and learnDirect keep
// (the process may be gone from /proc by now). While a start is not
// recorded yet, or a sandboxed one's pids not learnt, it waits for them.
func (cr *caseRun) directHost(pid int) (int, error) {
	giveUp := time.After(30 * time.Second) // a start that takes longer is a stuck harness
	for {
		cr.mu.Lock()
		pending := cr.starting
		for _, d := range cr.direct {
			if pid > 0 && d.self == pid {
				cr.mu.Unlock()
				return d.host, nil
			}
			if d.self == 0 {
				pending++
			}
		}
		if pending == 0 {
			cr.mu.Unlock()
			return 0, errors.New("not a process the harness started")
		}
		if cr.directAdded == nil {
			cr.directAdded = make(chan struct{})
		}
		changed := cr.directAdded
		cr.mu.Unlock()
		select {
		case <-changed:
		case <-giveUp:
			return 0, errors.New("not a process the harness started (a harness vmctl was still starting after 30s)")
		}
	}
}

// lastDirectHost is the pids (its own, the host's) of the vmctl the
// harness started last,
// once learnt: the verb in flight when a park holds the VMM it waits on
// (sigkill-direct at a VMM point kills that vmctl, not the parked VMM).
func (cr *caseRun) lastDirectHost() (self, host int, err error) {
	cr.mu.Lock()
	d, key := cr.direct[cr.lastDirect], cr.lastDirect
	cr.mu.Unlock()
	if d == nil {
		return 0, 0, errors.New("no vmctl of the harness's own was started")
	}
	for giveUp := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		cr.mu.Lock()
		self, host = d.self, d.host
		cr.mu.Unlock()
		switch {
		case self > 0:
			return self, host, nil
		case self < 0:
			return 0, 0, fmt.Errorf("the harness's vmctl %s was gone before its pid was learnt", key)
		case time.Now().After(giveUp):
			return 0, 0, fmt.Errorf("the harness's vmctl %s: pid not learnt in 30 s", key)
		}
	}
}
