package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/onsi/gomega"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
	"github.com/vmchaos/vmchaos/scenarios/stack"
)

const baseSnapshot = "base"

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return ": " + e
}

func intended(f scenarios.Fault) string {
	if f.Window[0] != "" {
		return f.Window[0] + ".." + f.Window[1]
	}
	_, rest, _ := strings.Cut(f.Trigger, " ")
	return rest
}

// failpoints is VMCHAOS_FAILPOINTS of the armed stack: a pause for every
// park trigger, plus the scenario's own actions.
func (cr *caseRun) failpoints() string {
	parts := cr.parkSpecs("")
	if cr.s.Env.Failpoints != "" {
		parts = append(parts, cr.s.Env.Failpoints)
	}
	return strings.Join(parts, ";")
}

// parkSpecs are the pauses of the park triggers read on node ("": the
// case's own stack; another node of a cluster arms its agent with its own,
// armNodes).
func (cr *caseRun) parkSpecs(node string) []string {
	var parts []string
	seen := map[string]bool{}
	for i, f := range cr.s.Faults {
		trig := cr.r.triggerString(cr.c, i)
		if f.Node != node || !strings.HasPrefix(trig, "park ") || f.Kind == "none" && f.Trigger == "" {
			continue
		}
		t, err := injector.ParseTrigger(trig)
		if err != nil {
			continue
		}
		vm := ""
		if t.VM != "" {
			vm = "@vm=" + t.VM
		}
		spec := t.Point + "=pause" + vm
		if t.N > 1 {
			// park POINT#N: the first N-1 hits of the process (of that VM)
			// go on, the N-th parks (the first rule whose count is not
			// spent runs, failpoint.hit)
			spec = fmt.Sprintf("%s=%d*sleep(0)%s;%s", t.Point, t.N-1, vm, spec)
		}
		if !seen[spec] {
			seen[spec] = true
			parts = append(parts, spec)
		}
	}
	return parts
}

func (cr *caseRun) metricsAddr() string {
	b, err := os.ReadFile(filepath.Join(cr.st.State, nodeagent.MetricsAddrName))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// injFault maps a catalogue fault onto the injector's.
func (cr *caseRun) injFault(f scenarios.Fault) injector.Fault {
	unit := cr.st.AgentUnit
	switch f.Unit {
	case "daemon":
		unit = cr.st.DaemonUnit
	case scenarios.UnitRegistry:
		unit = cr.st.RegistryUnit
	default:
		// another node's agent (cluster cases, Unit: its name): the
		// supervisor is the run's, shared by every node
		if u := cr.nodeUnit(f.Unit); u != "" {
			unit = u
		}
	}
	out := injector.Fault{Kind: f.Kind, Unit: unit, Child: f.Child}
	if f.Kind == "sigstop" || f.Kind == injector.FaultRegistrySigstop || f.Kind == injector.FaultRegistryStorageFull || isNetFault(f.Kind) {
		// the injector sends the SIGCONT or heals the disk or the path
		// (0: it stays frozen, full, cut)
		out.StopFor = cr.r.scale(f.StopFor)
	}
	if f.Kind == "sigkill-vmm" {
		if v, ok, _ := cr.st.VMByName(context.Background(), f.VM); ok {
			out.VM = v.ID
		}
	}
	// stop: the harness starts the unit again itself (WhileStopped steps run
	// in between), so the injector must not.
	return out
}

// record converts an injector record and judges where it landed.
func (cr *caseRun) record(i int, in injector.Injection) reports.Injection {
	f := cr.s.Faults[i]
	out := reports.Injection{Fault: in.Fault.String(), Trigger: in.Trigger.String(), RequestedNs: in.RequestedNs,
		ActualNs: in.ActualNs, Err: in.Err, VictimPID: in.VictimPID, InVictim: in.InVictim, TriggerNs: in.TriggerNs}
	if in.HitRecvNs > 0 && in.TriggerNs > 0 {
		d := in.HitRecvNs - in.TriggerNs // the error itself: reports.FillInjectionErrors
		out.DeliveryNs = &d
	}
	if f.Kind == "sigkill-direct" {
		out.Fault = f.Kind // the injector's sigkill-hitter
	}
	cr.mu.Lock()
	if in.VictimPID > 0 {
		cr.victims[in.VictimPID] = true
	}
	if in.TriggerPID > 0 && (in.InVictim || f.Kind == "sigkill-direct") {
		cr.victims[in.TriggerPID] = true // the victim as its events name it
	}
	cr.mu.Unlock()
	if f.Kind == "sigkill-vmm" {
		cr.noteVMMKill(f.VM, in.ActualNs)
	}
	cr.land(&out, cr.faultWindow(i), in.TriggerNs, 0)
	return out
}

// faultWindow is fault i's closed window: steady state for "now", the
// parked point for "park", else the scenario's Window (Validate makes every
// other trigger name both ends).
func (cr *caseRun) faultWindow(i int) phaseWindow {
	f := cr.s.Faults[i]
	switch {
	case f.Trigger == "now":
		return phaseWindow{Steady: true}
	case strings.HasPrefix(f.Trigger, "park "):
		p, _, _ := strings.Cut(strings.TrimPrefix(f.Trigger, "park "), "@")
		p, _, _ = strings.Cut(p, "#")
		return phaseWindow{Open: strings.TrimSpace(p)}
	}
	return phaseWindow{Open: f.Window[0], Close: f.Window[1]}
}

// land judges an injection against its window (judgeLanding, the one
// landing judgement) and records the result: a fault that was not
// delivered, or hit outside its window, did not land; the phase it hit is
// named either way.
func (cr *caseRun) land(out *reports.Injection, w phaseWindow, fromNs int64, pid int) {
	cr.landOn(cr.st, out, w, fromNs, pid)
}

// landOn is land against the trace of ts (the stack whose process the
// trigger read: another node of a cluster for a fault on its phase).
func (cr *caseRun) landOn(ts *stack.Stack, out *reports.Injection, w phaseWindow, fromNs int64, pid int) {
	out.IntendedPhase = w.String()
	if out.ActualNs == 0 {
		out.Landed = false
		return
	}
	l := landingOn(ts, w, fromNs, out.ActualNs, pid)
	out.LastPhase = l.Phase
	out.Landed = out.Err == "" && l.Landed
	if out.Err == "" && !l.Landed {
		out.Err = l.Why
	}
}

func (cr *caseRun) noteVMMKill(name string, ts int64) {
	id := ""
	if v, ok, _ := cr.st.VMByName(context.Background(), name); ok {
		id = v.ID
	}
	cr.mu.Lock()
	cr.kills = append(cr.kills, vmmKill{ID: id, Name: name, TsNs: ts})
	cr.mu.Unlock()
}

// now fires fault i immediately (trigger "now"): it must hit steady state.
func (cr *caseRun) now(ctx context.Context, i int) reports.Injection {
	f := cr.s.Faults[i]
	if f.Kind == scenarios.FaultPowerCut {
		return cr.cutNow(ctx, i)
	}
	req := failpoint.Now()
	if f.Kind == "sigkill-vmm" {
		// resolve the id before the kill: the event stream must report it
		v, ok, err := cr.st.VMByName(ctx, f.VM)
		if err != nil || !ok {
			return reports.Injection{Fault: f.Kind, Trigger: "now", RequestedNs: req, Err: fmt.Sprintf("no vm %s: %v", f.VM, err), IntendedPhase: SteadyState}
		}
		sent := failpoint.Now()
		pid, err := cr.st.KillVMM(ctx, v.ID)
		out := reports.Injection{Fault: f.Kind, Trigger: "now", RequestedNs: req, ActualNs: sent, VictimPID: pid}
		if err != nil {
			out.Err = err.Error()
		}
		cr.land(&out, cr.faultWindow(i), cr.armNs, 0)
		cr.mu.Lock()
		cr.kills = append(cr.kills, vmmKill{ID: v.ID, Name: f.VM, TsNs: out.ActualNs})
		cr.mu.Unlock()
		return out
	}
	in := cr.inj.Inject(ctx, cr.injFault(f))
	out := reports.Injection{Fault: in.Fault.String(), Trigger: "now", RequestedNs: in.RequestedNs, ActualNs: in.ActualNs,
		Err: in.Err, VictimPID: in.VictimPID}
	if in.VictimPID > 0 {
		cr.mu.Lock()
		cr.victims[in.VictimPID] = true
		cr.mu.Unlock()
	}
	cr.land(&out, cr.faultWindow(i), cr.armNs, 0)
	return out
}

// park handles a park trigger (one or more faults on the same parked
// point): wait for the point to park, inject every fault while it is
// parked, then release it — at once, or when the scenario's hold condition
// is met (the orphan must outlive the restarted agent's first look).
func (cr *caseRun) park(ctx context.Context, mark int, trig string, idx []int) ([]reports.Injection, error) {
	t, err := injector.ParseTrigger(trig)
	if err != nil {
		return nil, err
	}
	ts, mark, err := cr.triggerStack(idx[0], mark)
	if err != nil {
		return nil, err
	}
	hit, err := ts.Trace.WaitPoint(ctx, mark, t.Point, t.N, t.VM)
	if err != nil {
		return nil, err
	}
	pid, err := failpoint.WaitParked(ctx, ts.CtlDir, t.Point)
	if err != nil {
		return nil, err
	}
	if pid != hit.Event.Pid {
		return nil, fmt.Errorf("parked pid %d is not the pid %d that hit %s", pid, hit.Event.Pid, t.Point)
	}
	at := parked{ts.CtlDir, t.Point}
	cr.mu.Lock()
	cr.held = append(cr.held, at)
	cr.mu.Unlock()
	if cr.s.Expect.Adopted {
		cr.listBaseline(ctx) // the parked operation's VM is there now, before its fault
	}
	var out []reports.Injection
	var firstNs int64
	for _, i := range idx {
		rec := cr.parkedFault(ctx, ts, i, trig, t, hit, pid)
		cr.landOn(ts, &rec, cr.faultWindow(i), hit.Event.TsNs, hit.Event.Pid)
		// What the fault caused is what the release waits for. ActualNs is
		// stamped after the signal syscall returned: a harness thread
		// preempted there stamps it after the victim's death was already
		// reported (agent.child.vm-died before ActualNs, seen under load),
		// and the release then waited out the whole budget. RequestedNs is
		// taken before the signal, so nothing the fault caused precedes it.
		if firstNs == 0 {
			firstNs = rec.RequestedNs
			if firstNs == 0 {
				firstNs = rec.ActualNs
			}
		}
		out = append(out, rec)
	}
	cr.releasePark(ctx, ts, mark, at, cr.s.Faults[idx[0]], firstNs)
	return out, nil
}

// parkedFault injects fault i into the stack parked at t's point (hit by
// pid), and records it; the caller judges where it landed (the parked
// process cannot have moved on: its window closes at its next phase).
func (cr *caseRun) parkedFault(ctx context.Context, ts *stack.Stack, i int, trig string, t injector.Trigger, hit injector.Hit, pid int) reports.Injection {
	switch f := cr.s.Faults[i]; f.Kind {
	case "none":
		// the park itself is the interference (a live operation held at
		// an exact phase while something else happens)
		now := failpoint.Now()
		return reports.Injection{Fault: "none (held parked)", Trigger: trig, RequestedNs: now, ActualNs: now, VictimPID: pid}
	case scenarios.FaultPowerCut:
		rec := cr.cutPower(ctx, trig, t.Point, nil)
		rec.IntendedPhase = t.Point
		return rec
	case "sigkill-direct":
		// a vmctl the harness started itself, parked: kill it there,
		// through the injector (its pidfd and its accounting)
		resolve, victim := cr.directHost, pid
		if hit.Event.Proc != "vmctl" {
			// parked in the VMM at a VMM point of the verb: the victim
			// is the harness's vmctl waiting on it, the verb in flight
			self, host, err := cr.lastDirectHost()
			if err != nil {
				return reports.Injection{Fault: f.Kind, Trigger: trig, Err: err.Error(), IntendedPhase: t.Point}
			}
			resolve, victim = func(int) (int, error) { return host, nil }, self
		}
		in := cr.inj.InjectHit(ctx, injector.Fault{Kind: injector.FaultSigkillHitter}, hit, injector.Resolve(resolve))
		cr.noteVictim(victim)
		return reports.Injection{Fault: f.Kind, Trigger: trig, RequestedNs: in.RequestedNs, ActualNs: in.ActualNs,
			VictimPID: in.VictimPID, Err: in.Err, IntendedPhase: t.Point}
	default:
		// With the hit, a child victim is judged as of the park: the parked
		// child itself, never one a restarted agent exec'd since (the faults
		// before this one may have taken long enough for that).
		var opts []injector.ArmOption
		if f.Kind == injector.FaultRegistryRestart {
			opts = append(opts, injector.Between(cr.registryRestartBetween(parked{ts.CtlDir, t.Point}, ts)))
		}
		in := cr.inj.InjectHit(ctx, cr.injFault(f), hit, opts...)
		if in.VictimPID > 0 {
			cr.noteVictim(in.VictimPID)
		}
		if in.Err == "" {
			cr.watchHeal(f.Kind, in.ActualNs)
			cr.watchControlPlaneHeal(f, in.ActualNs)
		}
		return reports.Injection{Fault: in.Fault.String(), Trigger: trig, RequestedNs: in.RequestedNs, ActualNs: in.ActualNs,
			Err: in.Err, VictimPID: in.VictimPID, IntendedPhase: t.Point}
	}
}

// registryDownMax bounds how long a registry-restart at a park keeps the
// registry stopped waiting for the released agent to fail its request
// (scaled: 1 s at time scale 0.05, twice the agent's registry timeout of
// registryEnv): an agent that never fails it lets the path go unexercised
// (failed-left-by-itself says so), it does not hold the case.
const registryDownMax = 20 * time.Second

// registryRestartBetween is what a registry-restart at a parked phase does
// between its stop and its start (injector.Between): release the agent
// and wait until it wrote failed (its request met the stopped registry),
// at most registryDownMax. The trace's events after now are the agent's
// own since the park.
func (cr *caseRun) registryRestartBetween(at parked, ts *stack.Stack) func(context.Context) {
	return func(ctx context.Context) {
		mark, from := ts.Trace.Len(), failpoint.Now()
		cr.release(at)
		wctx, cancel := context.WithTimeout(ctx, cr.r.scale(registryDownMax))
		defer cancel()
		_, _ = ts.Trace.Wait(wctx, mark, 1, func(e *failpoint.Event) bool { return e.Point == "agent.failed" && e.TsNs > from })
	}
}

// noteVictim records a pid the harness killed itself.
func (cr *caseRun) noteVictim(pid int) {
	cr.mu.Lock()
	cr.victims[pid] = true
	cr.mu.Unlock()
}

// releasePark releases the parked point at once, or once f's hold
// condition is met after the first injection at firstNs.
// (ts: the stack whose trace the trigger read, mark its mark).
func (cr *caseRun) releasePark(ctx context.Context, ts *stack.Stack, mark int, at parked, f scenarios.Fault, firstNs int64) {
	switch {
	case f.ReleaseAfter == "reconcile-started":
		go cr.releaseWhen(ctx, at, func(ctx context.Context) { cr.waitReconcile(ctx) })
	case f.ReleaseAfter != "":
		go cr.releaseWhen(ctx, at, func(ctx context.Context) {
			_, _ = ts.Trace.Wait(ctx, mark, 1, func(e *failpoint.Event) bool { return e.Point == f.ReleaseAfter && e.TsNs > firstNs })
		})
	case f.ReleaseAfterChild != "":
		go cr.releaseWhen(ctx, at, func(ctx context.Context) {
			_, _ = ts.Trace.Wait(ctx, mark, 1, childExit(firstNs, strings.ReplaceAll(f.ReleaseAfterChild, " ", "-"), ""))
		})
	default:
		cr.release(at)
	}
}

// parked is a point the harness holds parked, and the control dir of the
// stack it parks in.
type parked struct{ ctl, point string }

func (cr *caseRun) releaseWhen(ctx context.Context, at parked, cond func(context.Context)) {
	cond(ctx)
	cr.release(at)
}

// release releases a held point once: a second release (a fault that
// released it itself, see registryRestartBetween) writes no release a
// later park of the same point would take for its own.
func (cr *caseRun) release(at parked) {
	cr.mu.Lock()
	held := false
	for i, p := range cr.held {
		if p == at {
			cr.held = append(cr.held[:i], cr.held[i+1:]...)
			held = true
			break
		}
	}
	cr.mu.Unlock()
	if held {
		_ = failpoint.Release(at.ctl, at.point)
	}
}

func (cr *caseRun) releaseAll() {
	cr.mu.Lock()
	held := append([]parked(nil), cr.held...)
	cr.mu.Unlock()
	for _, p := range held {
		cr.release(p)
	}
}

// waitChildExit waits until an agent child of kind (e.g. "snapshot rm")
// started after fromNs exited.
func (cr *caseRun) waitChildExit(ctx context.Context, mark int, fromNs int64, kind string) {
	_, _ = cr.st.Trace.Wait(ctx, mark, 1, childExit(fromNs, strings.ReplaceAll(kind, " ", "-"), ""))
}

// childExit matches the exit of an agent child of kind (injector.ChildKind
// form, "snapshot-save"), pairing exit events with exec events by pid.
func childExit(fromNs int64, kind, vm string) func(*failpoint.Event) bool {
	kinds := map[float64]string{}
	return func(e *failpoint.Event) bool {
		if e.TsNs < fromNs {
			return false
		}
		pid, _ := e.Attrs["child_pid"].(float64)
		switch e.Point {
		case "agent.child.exec":
			var argv []string
			if raw, ok := e.Attrs["argv"].([]any); ok {
				for _, a := range raw {
					s, _ := a.(string)
					argv = append(argv, s)
				}
			}
			kinds[pid] = injector.ChildKind(argv)
		case "agent.child.exit":
			return kinds[pid] == kind && (vm == "" || e.VM == vm)
		}
		return false
	}
}

// waitReconcile waits until the harness's reconcile-stale-create exited, or
// ran long enough to be queued behind the held lock.
func (cr *caseRun) waitReconcile(ctx context.Context) {
	deadline := time.After(floor(cr.r.scale(2*time.Second), 300*time.Millisecond))
	for {
		cr.mu.Lock()
		d := cr.direct["reconcile"]
		cr.mu.Unlock()
		if d != nil {
			select {
			case code := <-d.exit:
				d.exit = closedWith(code)
				return
			case <-deadline:
				return
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}

func closedWith(code int) <-chan int {
	ch := make(chan int, 1)
	ch <- code
	return ch
}

// waitFailpoint: a VMCHAOS_FAILPOINTS action is the fault. It fired at the
// first hit of its point (the first action of Env.Failpoints) after arming,
// and it ran only if the trigger (its effect, e.g. agent.failed) came after
// that hit; it must land in the fault's window.
func (cr *caseRun) waitFailpoint(ctx context.Context, mark, i int, trig string) ([]reports.Injection, error) {
	t, err := injector.ParseTrigger(trig)
	if err != nil {
		return nil, err
	}
	hit, err := cr.st.Trace.WaitPoint(ctx, mark, t.Point, t.N, t.VM)
	if err != nil {
		return nil, err
	}
	point, _, _ := strings.Cut(cr.s.Env.Failpoints, "=")
	point = strings.TrimSpace(point)
	// The action runs inside the process, in the hit of its point: that hit
	// is both when it was asked for and when it happened (in the victim,
	// like signal(SIG,DELAY) at DELAY 0). Requested was the arming time,
	// which made the time to reach the point look like an injection error.
	rec := reports.Injection{Fault: "failpoint " + cr.s.Env.Failpoints, Trigger: trig, InVictim: true}
	nth := 1 // the action behind N* pass-through rules runs at the trigger's N-th hit
	if point == t.Point {
		nth = t.N
	}
	for _, e := range cr.st.Trace.Sorted() {
		if e.TsNs > cr.armNs && e.Point == point {
			if nth--; nth > 0 {
				continue
			}
			rec.RequestedNs, rec.ActualNs = e.TsNs, e.TsNs
			break
		}
	}
	switch {
	case rec.ActualNs == 0:
		rec.Err = fmt.Sprintf("%s came without a hit of the action's point %s", t.Point, point)
	case hit.Event.TsNs < rec.ActualNs:
		rec.Err = fmt.Sprintf("%s came %s before the action's point %s: not its effect", t.Point, ms(rec.ActualNs-hit.Event.TsNs), point)
	}
	cr.land(&rec, cr.faultWindow(i), cr.armNs, 0)
	return []reports.Injection{rec}, nil
}

// step runs one harness step.
func (cr *caseRun) step(ctx context.Context, step scenarios.Step, budget time.Duration) error {
	if handled, err := cr.seedPathStep(ctx, step, budget); handled {
		return err
	}
	switch step.Kind {
	case scenarios.StepCreate, scenarios.StepWake, scenarios.StepHibernate:
		return cr.stepIntent(ctx, step, budget)
	case scenarios.StepDelete:
		return cr.stepDelete(ctx, step, budget)
	case scenarios.StepLedgerWrite:
		return cr.stepLedgerWrite(ctx, step)
	case scenarios.StepDirectClone:
		return cr.stepDirect(step.VM, "direct-clone-"+step.VM, "vm", "clone", "--name", step.VM, baseSnapshot)
	case scenarios.StepDirectSave:
		return cr.stepDirectSave(ctx, step)
	case scenarios.StepDirectVmctl:
		return cr.stepDirectVmctl(ctx, step)
	case scenarios.StepHoldLease:
		return cr.holdLease(ctx, step.VM)
	case scenarios.StepOrphanPause:
		return cr.orphanPause(ctx, step.VM)
	case scenarios.StepReconcile:
		return cr.stepReconcile(ctx, step, budget)
	case scenarios.StepKillVMM:
		return cr.stepKillVMM(ctx, step)
	case scenarios.StepWipeStatus:
		if err := wipeStatus(cr.st.State, step.VM); err != nil {
			return harnessErr(err)
		}
		return nil
	case scenarios.StepCounterClaim:
		return cr.counterClaim(ctx, step.VM, budget)
	case scenarios.StepRestartAgent:
		// the armed agent's spec, its startup points' rules included
		if err := cr.st.RestartAgent(ctx, withSpecs(cr.failpoints(), cr.victimSpecs(false))); err != nil {
			return harnessErr(err)
		}
		return nil
	}
	if ok, err := cr.registryStep(ctx, step, budget); ok {
		return err
	}
	if ok, err := cr.clusterStep(ctx, step, budget); ok {
		return err
	}
	return harnessErr(fmt.Errorf("unknown step %q", step.Kind))
}

// stepNames are the VMs a step acts on: VM, or VM-0 … VM-(N-1).
func stepNames(step scenarios.Step) []string {
	if step.N <= 0 {
		return []string{step.VM}
	}
	names := make([]string, step.N)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", step.VM, i)
	}
	return names
}

// stepIntent puts a create, wake or hibernate intent for each of the step's
// VMs and, with Wait, waits for every goal (a wake restarts the writers).
func (cr *caseRun) stepIntent(ctx context.Context, step scenarios.Step, budget time.Duration) error {
	names := stepNames(step)
	hib := step.Kind == scenarios.StepHibernate
	for _, n := range names {
		if hib {
			cr.cycles[n] = true
			cr.noteMACs(ctx, n)
		}
		if err := cr.put(ctx, n, nodeagent.Intent{Snapshot: baseSnapshot, Hibernate: hib}); err != nil {
			return err
		}
	}
	if !step.Wait {
		return nil
	}
	for _, n := range names {
		if err := cr.waitGoal(ctx, n, budget); err != nil {
			return err
		}
	}
	if step.Kind == scenarios.StepWake {
		cr.restartWorkloads(ctx, names) // the writer runs again right after the wake
	}
	return nil
}

// stepDelete deletes the step's intent (waiting for it with Wait).
func (cr *caseRun) stepDelete(ctx context.Context, step scenarios.Step, budget time.Duration) error {
	cr.noteMACs(ctx, step.VM)
	if err := cr.st.Agent.Delete(ctx, step.VM); err != nil {
		return err
	}
	cr.noteAck(step.VM, 0, true, failpoint.Now())
	cr.goals[step.VM] = checker.GoalDeleted
	if step.Wait {
		return cr.waitGoal(ctx, step.VM, budget)
	}
	return nil
}

// stepLedgerWrite writes the next ledger markers into the step's guest,
// records its boot id and starts its writer.
func (cr *caseRun) stepLedgerWrite(ctx context.Context, step scenarios.Step) error {
	g, err := cr.guest(ctx, step.VM)
	if err != nil {
		return err
	}
	cr.ledger[step.VM]++
	_, err = cr.st.Ledger.WriteMarkers(ctx, g, cr.ledger[step.VM])
	if parked := cr.ledgerHook.takeParked(); err != nil {
		if !parked {
			return err
		}
		// the write the case's fault hit while it was parked: its marker
		// stays in flight (journaled intent, no ack: the ledger verdict
		// counts it), which the verdict accepts either way; the markers
		// acked before must hold
		return nil
	}
	// the baseline the next wake's boot id and RAM markers are compared
	// against (recorded now: the guest may be unreachable, e.g. paused,
	// right before the hibernate)
	if _, err := cr.st.Ledger.RecordBootID(ctx, g); err != nil {
		return err
	}
	cr.startWorkload(ctx, step.VM) // runs through the case's operations
	return nil
}

// stepDirect starts a vmctl of the harness's own (key names it in direct).
func (cr *caseRun) stepDirect(key, log string, args ...string) error {
	if _, err := cr.startDirect(key, func() (*exec.Cmd, <-chan int, error) {
		return cr.st.StartProc(log, args...)
	}); err != nil {
		return harnessErr(err)
	}
	return nil
}

// stepDirectVmctl starts `vmctl ARGS` as the harness's own process (a
// manager verb run by itself: sigkill-direct's victim); with Wait it waits
// for the verb's exit and fails unless it is 0.
func (cr *caseRun) stepDirectVmctl(ctx context.Context, step scenarios.Step) error {
	if len(step.Args) < 2 {
		return harnessErr(fmt.Errorf("direct-vmctl: want a verb, got %q", step.Args))
	}
	name := "direct-" + strings.Join(step.Args[:2], "-") + "-" + step.VM
	args := make([]string, len(step.Args))
	for i, a := range step.Args {
		args[i] = strings.ReplaceAll(a, scenarios.ArgImage, cr.st.Image())
	}
	exit, err := cr.startDirect(name, func() (*exec.Cmd, <-chan int, error) {
		return cr.st.StartProc(name, args...)
	})
	if err != nil {
		return harnessErr(err)
	}
	if !step.Wait {
		return nil
	}
	select {
	case code := <-exit:
		cr.mu.Lock()
		if d := cr.direct[name]; d != nil {
			d.exit = closedWith(code)
		}
		cr.mu.Unlock()
		if step.Refused != "" {
			return cr.judgeRefused(step, name, code)
		}
		if code != 0 {
			return fmt.Errorf("vmctl %s: exit %d (log %s.log)", strings.Join(step.Args, " "), code, name)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("vmctl %s: %w", strings.Join(step.Args, " "), ctx.Err())
	}
}

// judgeRefused: a harness-run verb the case expects to be refused
// (Step.Refused) exited non-zero with the refusal in its output.
func (cr *caseRun) judgeRefused(step scenarios.Step, name string, code int) error {
	verb := strings.Join(step.Args, " ")
	if code == 0 {
		return fmt.Errorf("vmctl %s: exit 0, want it refused (%q)", verb, step.Refused)
	}
	b, err := os.ReadFile(filepath.Join(cr.st.LogDir, name+".log"))
	if err != nil {
		return harnessErr(fmt.Errorf("vmctl %s: its log: %w", verb, err))
	}
	if !strings.Contains(string(b), step.Refused) {
		return fmt.Errorf("vmctl %s: exit %d without the refusal %q (log %s.log)", verb, code, step.Refused, name)
	}
	return nil
}

// stepDirectSave starts the harness's own snapshot save of the step's VM.
func (cr *caseRun) stepDirectSave(ctx context.Context, step scenarios.Step) error {
	v, ok, err := cr.st.VMByName(ctx, step.VM)
	if err != nil || !ok {
		return fmt.Errorf("direct-save: no vm %s (%v)", step.VM, err)
	}
	cr.noteSave(step.VM, v.ID)
	return cr.stepDirect("save-"+step.VM, "direct-save-"+step.VM, "snapshot", "save", "--name", step.VM+"-manual", v.ID)
}

// stepReconcile starts the harness's own reconcile-stale-create of the
// step's VM once its record exists (creating, after the clone reserved it).
func (cr *caseRun) stepReconcile(ctx context.Context, step scenarios.Step, budget time.Duration) error {
	var id string
	deadline := time.Now().Add(budget)
	for id == "" && time.Now().Before(deadline) {
		if v, ok, _ := cr.st.VMByName(ctx, step.VM); ok {
			id = v.ID
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if id == "" {
		return fmt.Errorf("reconcile: no record named %s", step.VM)
	}
	return cr.stepDirect("reconcile", "reconcile-"+step.VM, "vm", "reconcile-stale-create", id, "-o", "json")
}

// stepKillVMM SIGKILLs the step's VMM; the event stream must report it.
func (cr *caseRun) stepKillVMM(ctx context.Context, step scenarios.Step) error {
	v, ok, err := cr.st.VMByName(ctx, step.VM)
	if err != nil || !ok {
		return fmt.Errorf("kill-vmm: no vm %s (%v)", step.VM, err)
	}
	sent := failpoint.Now() // events must be stamped after the signal, not after we saw the death
	if _, err := cr.st.KillVMM(ctx, v.ID); err != nil {
		return err
	}
	cr.mu.Lock()
	cr.kills = append(cr.kills, vmmKill{ID: v.ID, Name: step.VM, TsNs: sent})
	cr.mu.Unlock()
	return nil
}

func (cr *caseRun) put(ctx context.Context, name string, in nodeagent.Intent) error {
	// A resumed operation's claim refuses counter-intents until it is
	// done; a caller retries (the way the kubelet retries an update).
	deadline := time.Now().Add(floor(cr.r.scale(60*time.Second), 20*time.Second))
	var ackNs int64
	for {
		err := cr.st.Agent.Put(ctx, name, in)
		if err == nil {
			ackNs = failpoint.Now()
			break
		}
		var ae *stack.APIError
		if !errors.As(err, &ae) || !strings.Contains(ae.Message, "resumed operation still in flight") || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if in.Hibernate {
		cr.goals[name] = checker.GoalHibernated
	} else {
		cr.goals[name] = checker.GoalReady
	}
	if v, err := cr.st.Agent.Get(ctx, name); err == nil {
		cr.gens[name] = v.Generation
	}
	cr.noteAck(name, cr.gens[name], false, ackNs)
	return nil
}

// waitGoal waits until name reached its goal (setup and Wait steps).
func (cr *caseRun) waitGoal(ctx context.Context, name string, budget time.Duration) error {
	goal := cr.goals[name]
	deadline := time.Now().Add(budget)
	var last string
	for time.Now().Before(deadline) {
		v, err := cr.st.Agent.Get(ctx, name)
		switch {
		case goal == checker.GoalDeleted && errors.Is(err, stackErrNotFound):
			return nil
		case err != nil:
			last = err.Error()
		case v.Status.Lifecycle == goal && v.Status.ObservedGeneration >= cr.gens[name]:
			return nil
		default:
			last = v.Status.Lifecycle + " " + v.Status.Message
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not reach %s within %s (last: %s)", name, goal, budget, last)
}

var stackErrNotFound = stack.ErrNotFound

// guest is the ledger's view of a VM: its name and SSH address.
func (cr *caseRun) guest(ctx context.Context, name string) (ledger.Guest, error) {
	_, addr, ok, err := cr.guestNode(name).GuestOf(ctx, name)
	if err != nil {
		return ledger.Guest{}, err
	}
	if !ok || addr == "" {
		return ledger.Guest{}, fmt.Errorf("ledger: vm %s has no guest address", name)
	}
	return ledger.Guest{Name: name, Addr: addr}, nil
}

// wipeStatus removes the agent's local status markers of name (intent and
// generation kept): the disk loss the seed 001 coverage gap asks about.
func wipeStatus(stateDir, name string) error {
	p := filepath.Join(stateDir, "vms", name+".json")
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("wipe status: %w", err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("wipe status %s: %w", p, err)
	}
	for _, k := range []string{"status", "op", "step", "snapshot_id", "remove_vm_id", "nic_dropped"} {
		delete(doc, k)
	}
	nb, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return os.WriteFile(p, nb, 0o644)
}

// counterClaim puts a counter-intent (wake) while the resumed hibernate holds
// its claim: the first answer must be the claim refusal; it is retried until
// accepted.
func (cr *caseRun) counterClaim(ctx context.Context, name string, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	refused := ""
	for time.Now().Before(deadline) {
		err := cr.st.Agent.Put(ctx, name, nodeagent.Intent{Snapshot: baseSnapshot})
		if err == nil {
			cr.goals[name] = checker.GoalReady
			if v, err := cr.st.Agent.Get(ctx, name); err == nil {
				cr.gens[name] = v.Generation
			}
			inv := reports.Invariant{Name: "resume-claim-exclusion", OK: refused != ""}
			if refused == "" {
				inv.Evidence = "the counter-intent was accepted at once: no resume claim was observed"
			} else {
				inv.Evidence = "refused first with: " + refused
			}
			cr.rc.Invariants = append(cr.rc.Invariants, inv)
			return nil
		}
		var ae *stack.APIError
		if errors.As(err, &ae) && strings.Contains(ae.Message, "resumed operation still in flight") {
			refused = ae.Message
		} else if !errors.As(err, &ae) {
			// the agent may still be starting
		} else {
			return fmt.Errorf("counter-claim: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("counter-claim: not accepted within %s", budget)
}

// pollStable waits, with Gomega's Eventually(...).MustPassRepeatedly(n),
// until every state invariant held StablePolls times in a row; it returns the
// last evaluation and the CLOCK_MONOTONIC time of the first poll of the
// stable streak (0 if the budget ran out).
func (cr *caseRun) pollStable(ctx context.Context, in *checker.Input, budget time.Duration) ([]reports.Invariant, int64) {
	every := floor(cr.r.scale(time.Second), 50*time.Millisecond)
	return converge(ctx, in, budget, every, cr.r.opts.StablePolls, func(p *checker.Poll) {
		cr.stopIfCertain(in, p) // failfast.go
	})
}

// converge is the one convergence loop of every case, agent or manager:
// Gomega polls the state table every `every` until it held `polls` times in
// a row (MustPassRepeatedly) or budget ran out. onViolation, when set, sees
// every poll that failed an invariant and may end the wait at once
// (gomega.StopTrying) when the verdict is already certain.
func converge(ctx context.Context, in *checker.Input, budget, every time.Duration, polls int, onViolation func(*checker.Poll)) ([]reports.Invariant, int64) {
	var last []reports.Invariant
	var first int64
	failed := false
	g := gomega.NewGomega(func(string, ...int) { failed = true })
	g.Eventually(ctx, func(gg gomega.Gomega) {
		p := checker.Collect(ctx, in, failpoint.Now)
		last = checker.Evaluate(in, p)
		if !checker.AllOK(last) {
			first = 0
		} else if first == 0 {
			first = p.TsNs
		}
		if !checker.AllOK(last) && onViolation != nil {
			onViolation(p)
		}
		gg.Expect(violated(last)).To(gomega.BeEmpty())
	}).WithTimeout(budget).WithPolling(every).MustPassRepeatedly(polls).Should(gomega.Succeed())
	if failed {
		return last, 0
	}
	return last, first
}

func violated(invs []reports.Invariant) []string {
	var out []string
	for _, i := range invs {
		if !i.OK {
			out = append(out, i.Name+": "+i.Evidence)
		}
	}
	return out
}

// isDirect reports whether host pid is a vmctl the harness started (or the
// child of the nsenter that started it in the sandbox).
func (cr *caseRun) isDirect(pid int) bool {
	if pid <= 0 {
		return false
	}
	parent := stack.ParentOf(pid)
	cr.mu.Lock()
	defer cr.mu.Unlock()
	for _, d := range cr.direct {
		if d.pid == pid || d.pid == parent {
			return true
		}
	}
	return false
}

// holdLease starts a clone of snapshot name as VM "reader", parked at
// vm.clone.reserved (the snapshot's lease held shared), and releases it once
// an agent `snapshot rm` child started after now has exited.
func (cr *caseRun) holdLease(ctx context.Context, name string) error {
	const point = "vm.clone.reserved"
	from := cr.st.Trace.Mark()
	fromNs := failpoint.Now()
	if _, err := cr.startDirect("reader", func() (*exec.Cmd, <-chan int, error) {
		return cr.st.StartProcFP("hold-lease-reader", point+"=pause", "vm", "clone", "--name", "reader", name)
	}); err != nil {
		return harnessErr(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pid, err := failpoint.WaitParked(wctx, cr.st.CtlDir, point)
	if err != nil {
		return fmt.Errorf("hold-lease: %w", err)
	}
	if !cr.isDirect(cr.st.HostPID(pid)) {
		return fmt.Errorf("hold-lease: parked pid %d is not the reader the harness started", pid)
	}
	at := parked{cr.st.CtlDir, point}
	cr.mu.Lock()
	cr.held = append(cr.held, at)
	cr.mu.Unlock()
	go cr.releaseWhen(ctx, at, func(ctx context.Context) { cr.waitChildExit(ctx, from, fromNs, "snapshot rm") })
	return nil
}

// orphanPause runs `snapshot save` of name as the harness, parks it right
// after it paused the VMM and SIGKILLs it there: the VMM stays Paused under a
// running record, the state a dead capture leaves (seed 001 #2).
func (cr *caseRun) orphanPause(ctx context.Context, name string) error {
	const point = "snapshot.save.paused"
	v, ok, err := cr.st.VMByName(ctx, name)
	if err != nil || !ok {
		return fmt.Errorf("orphan-pause: no vm %s (%v)", name, err)
	}
	exit, err := cr.startDirect("orphan-"+name, func() (*exec.Cmd, <-chan int, error) {
		return cr.st.StartProcFP("orphan-pause-"+name, point+"=pause", "snapshot", "save", "--name", name+"-orphan", v.ID)
	})
	if err != nil {
		return harnessErr(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pid, err := failpoint.WaitParked(wctx, cr.st.CtlDir, point)
	if err != nil {
		return fmt.Errorf("orphan-pause: %w", err)
	}
	host := cr.st.HostPID(pid)
	if !cr.isDirect(host) {
		return fmt.Errorf("orphan-pause: parked pid %d is not the save the harness started", pid)
	}
	if err := stack.KillProc(host); err != nil {
		return fmt.Errorf("orphan-pause: kill %d: %w", host, err)
	}
	select {
	case <-exit:
	case <-wctx.Done():
		return fmt.Errorf("orphan-pause: save %d did not die", host)
	}
	// later saves must not park here
	return failpoint.Release(cr.st.CtlDir, point)
}
