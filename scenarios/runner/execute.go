package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
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

// execute runs the case; a returned error is an infrastructure failure
// (inconclusive). The verdict is written into cr.rc.
func (cr *caseRun) execute(ctx context.Context, budget time.Duration) error {
	st, s, r := cr.st, cr.s, cr.r
	if err := st.StartAgent(ctx); err != nil {
		return err
	}
	if s.Env.Daemon {
		if err := st.StartDaemon(ctx, floor(r.scale(orDefault(s.Env.DaemonEvery, 5*time.Second)), 50*time.Millisecond)); err != nil {
			return err
		}
	}
	for _, step := range s.Setup {
		step.Wait = true
		if err := cr.step(ctx, step, budget); err != nil {
			return fmt.Errorf("setup %s %s: %w", step.Kind, step.VM, err)
		}
	}
	if windowed(s) && (cr.c.HasFrac || cr.c.HasOff) {
		refusal, err := cr.placeFault(ctx, budget)
		if err != nil {
			return fmt.Errorf("measuring the window of %s: %w", cr.c.ID, err)
		}
		if refusal != "" {
			cr.rc.Verdict, cr.rc.Reason = reports.Inconclusive, refusal
			return nil
		}
	}
	// Counters are sampled from the end of the setup on, so the re-arm
	// restart below is covered too: a counter must survive every restart.
	cr.scraper = checker.NewScraper(cr.metricsAddr, 50*time.Millisecond, failpoint.Now)
	cr.scraper.ScrapeNow(ctx, failpoint.Now)
	// Arm: the setup ran with an agent without failpoints (it must not
	// park at the case's point); the armed agent replaces it.
	fps := cr.failpoints()
	st.SetHarnessFailpoints(fps)
	if fps != "" {
		if err := st.Arm(ctx, fps); err != nil {
			return err
		}
		// the armed agent adopted the setup's VMs: wait until it reports
		// every goal again before the operation starts
		for name := range cr.goals {
			if err := cr.waitGoal(ctx, name, budget); err != nil {
				return fmt.Errorf("armed agent: %w", err)
			}
		}
	}
	if s.Expect.Events {
		if _, err := st.StartObserver(0.25); err != nil {
			return fmt.Errorf("observer: %w", err)
		}
	}
	cr.scraper.ScrapeNow(ctx, failpoint.Now)
	mark := st.Trace.Mark()

	// Arm every fault, then start the operation.
	type pending struct {
		idx  []int
		wait func(context.Context) ([]reports.Injection, error)
	}
	var waits []pending
	parks := map[string][]int{}
	var parkOrder []string
	for i, f := range s.Faults {
		trig := r.triggerString(cr.c, i)
		switch {
		case strings.HasPrefix(trig, "park "):
			if _, ok := parks[trig]; !ok {
				parkOrder = append(parkOrder, trig)
			}
			parks[trig] = append(parks[trig], i)
		case f.Kind == "none" || f.Trigger == "now":
			// nothing to arm; "now" fires after the act steps, below
		case strings.HasPrefix(trig, "after-exit "):
			// The agent's exit events carry the child pid, not its argv:
			// the kind is matched through the exec event of that pid.
			i, trig := i, trig
			waits = append(waits, pending{[]int{i}, func(ctx context.Context) ([]reports.Injection, error) {
				return cr.afterExit(ctx, mark, i, trig)
			}})
		case f.Kind == "failpoint":
			i, trig := i, trig
			waits = append(waits, pending{[]int{i}, func(ctx context.Context) ([]reports.Injection, error) {
				return cr.waitFailpoint(ctx, mark, i, trig)
			}})
		case f.Kind == "sigkill-direct":
			i, trig := i, trig
			waits = append(waits, pending{[]int{i}, func(ctx context.Context) ([]reports.Injection, error) {
				return cr.killDirect(ctx, mark, i, trig)
			}})
		default:
			t, err := injector.ParseTrigger(trig)
			if err != nil {
				return fmt.Errorf("fault %d: %w", i, err)
			}
			a, err := cr.inj.Arm(ctx, cr.injFault(f), t, injector.From(mark))
			if err != nil {
				return fmt.Errorf("arm fault %d: %w", i, err)
			}
			i := i
			waits = append(waits, pending{[]int{i}, func(ctx context.Context) ([]reports.Injection, error) {
				in, err := a.Wait(ctx)
				if err != nil {
					a.Cancel()
					return nil, err
				}
				return []reports.Injection{cr.record(i, in)}, nil
			}})
		}
	}
	for _, trig := range parkOrder {
		idx := parks[trig]
		trig := trig
		waits = append(waits, pending{idx, func(ctx context.Context) ([]reports.Injection, error) {
			return cr.park(ctx, mark, trig, idx)
		}})
	}
	// Injection waits run concurrently with the act steps.
	type result struct {
		injs []reports.Injection
		err  error
	}
	wctx, wcancel := context.WithTimeout(ctx, budget)
	defer wcancel()
	results := make([]chan result, len(waits))
	for i, w := range waits {
		ch := make(chan result, 1)
		results[i] = ch
		go func(w pending) {
			injs, err := w.wait(wctx)
			ch <- result{injs, err}
		}(w)
	}
	for _, step := range s.Act {
		if err := cr.step(ctx, step, budget); err != nil {
			wcancel()
			return fmt.Errorf("act %s %s: %w", step.Kind, step.VM, err)
		}
	}
	for i, f := range s.Faults {
		if f.Trigger != "now" || f.Kind == "none" {
			continue
		}
		if cr.c.HasOff {
			time.Sleep(r.scale(cr.c.Offset))
		}
		cr.rc.Injections = append(cr.rc.Injections, cr.now(ctx, i))
	}
	var waitErrs []string
	for i, ch := range results {
		res := <-ch
		if res.err != nil {
			waitErrs = append(waitErrs, fmt.Sprintf("fault %v: %v", waits[i].idx, res.err))
			for _, j := range waits[i].idx {
				cr.rc.Injections = append(cr.rc.Injections, reports.Injection{Fault: s.Faults[j].Kind,
					Trigger: r.triggerString(cr.c, j), Err: res.err.Error(), IntendedPhase: intended(s.Faults[j])})
			}
			continue
		}
		for k, j := range waits[i].idx {
			if j == 0 && k < len(res.injs) {
				cr.margin(res.injs[k])
			}
		}
		cr.rc.Injections = append(cr.rc.Injections, res.injs...)
	}
	sort.SliceStable(cr.rc.Injections, func(i, j int) bool { return cr.rc.Injections[i].ActualNs < cr.rc.Injections[j].ActualNs })
	for _, in := range cr.rc.Injections {
		if cr.faultNs == 0 || (in.ActualNs > 0 && in.ActualNs < cr.faultNs) {
			cr.faultNs = in.ActualNs
		}
	}
	if cr.faultNs == 0 {
		cr.faultNs = failpoint.Now()
	}
	// A fault that did not land where the scenario intended makes the case
	// inconclusive, never pass.
	var notLanded []string
	for _, in := range cr.rc.Injections {
		if !in.Landed {
			notLanded = append(notLanded, fmt.Sprintf("%s (%s) landed in %q, intended %q%s", in.Fault, in.Trigger, in.LastPhase, in.IntendedPhase, errSuffix(in.Err)))
		}
	}
	if len(cr.rc.Injections) > 0 {
		cr.rc.LandedPhase = cr.stackPhase(cr.rc.Injections[0])
	}
	if len(waitErrs) > 0 || len(notLanded) > 0 {
		cr.rc.Verdict = reports.Inconclusive
		cr.rc.Reason = "fault did not land as intended: " + strings.Join(append(waitErrs, notLanded...), "; ")
		cr.rc.Invariants = append(cr.rc.Invariants, reports.Invariant{Name: checker.FaultLanded, OK: false, Evidence: cr.rc.Reason})
		return nil
	}
	cr.rc.Invariants = append(cr.rc.Invariants, reports.Invariant{Name: checker.FaultLanded, OK: true})

	adopted := map[string]string{}
	if s.Expect.Adopted {
		if vms, err := st.ListVMs(ctx); err == nil {
			for _, v := range vms {
				if _, ours := cr.goals[v.Name]; ours {
					adopted[v.Name] = v.ID
				}
			}
		}
	}

	// Restore service like an operator: a stopped unit is started again
	// (after the WhileStopped steps and StopFor). Without a stop, the
	// WhileStopped steps run at once, while the agent is down for RestartSec.
	stopped := false
	for _, f := range s.Faults {
		stopped = stopped || f.Kind == "stop"
	}
	if !stopped {
		for _, step := range s.WhileStopped {
			if err := cr.step(ctx, step, budget); err != nil {
				return fmt.Errorf("while down %s %s: %w", step.Kind, step.VM, err)
			}
		}
	}
	for _, f := range s.Faults {
		if f.Kind != "stop" {
			continue
		}
		stoppedAt := cr.faultNs
		for _, step := range s.WhileStopped {
			if err := cr.step(ctx, step, budget); err != nil {
				return fmt.Errorf("while stopped %s %s: %w", step.Kind, step.VM, err)
			}
		}
		if d := r.scale(f.StopFor) - time.Duration(failpoint.Now()-stoppedAt); d > 0 {
			time.Sleep(d)
		}
		unit := st.AgentUnit
		if f.Unit == "daemon" {
			unit = st.DaemonUnit
		}
		if err := st.Sup().StartAgain(ctx, unit); err != nil {
			return fmt.Errorf("operator start of %s: %w", unit, err)
		}
		break
	}
	if err := waitUp(ctx, st); err != nil {
		return err
	}
	for _, step := range s.After {
		if err := cr.step(ctx, step, budget); err != nil {
			return fmt.Errorf("after %s %s: %w", step.Kind, step.VM, err)
		}
	}

	// Converged and stable: every state invariant holds for StablePolls
	// consecutive polls, within the budget.
	in := &checker.Input{Stack: st, Goals: cr.goals, Generation: cr.gens, DirectVMs: s.Expect.DirectVMs,
		AdoptedIDs: adopted, BaseName: baseSnapshot}
	invs, convergedNs := cr.converge(ctx, in, budget)
	if convergedNs > 0 {
		cr.rc.ConvergeMs = float64(convergedNs-cr.faultNs) / 1e6
		if cr.rc.ConvergeMs < 0 {
			cr.rc.ConvergeMs = 0
		}
	}
	cr.rc.Invariants = append(cr.rc.Invariants, invs...)
	if convergedNs == 0 && checker.AllOK(invs) {
		// every invariant held at the last poll but never StablePolls
		// times in a row: the state kept flapping
		cr.rc.Invariants = append(cr.rc.Invariants, reports.Invariant{Name: checker.Stable, OK: false,
			Evidence: fmt.Sprintf("the state never held for %d consecutive polls within %s", cr.r.opts.StablePolls, budget)})
	}
	cr.rc.Invariants = append(cr.rc.Invariants, cr.history(ctx, convergedNs > 0, budget)...)
	cr.rc.Metrics = cr.metricDeltas()

	cr.rc.Verdict = reports.Pass
	var bad []string
	for _, inv := range cr.rc.Invariants {
		if !inv.OK {
			bad = append(bad, inv.Name)
		}
	}
	if len(bad) > 0 {
		cr.rc.Verdict = reports.Fail
		cr.rc.Reason = "violated: " + strings.Join(bad, ", ")
		if convergedNs == 0 {
			cr.rc.Reason += fmt.Sprintf(" (not converged within %s)", budget)
		}
	}
	return nil
}

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

func waitUp(ctx context.Context, st *stack.Stack) error {
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return st.Agent.WaitUp(wctx)
}

// failpoints is VMCHAOS_FAILPOINTS of the armed stack: a pause for every
// park trigger, plus the scenario's own actions.
func (cr *caseRun) failpoints() string {
	var parts []string
	seen := map[string]bool{}
	for i, f := range cr.s.Faults {
		trig := cr.r.triggerString(cr.c, i)
		if !strings.HasPrefix(trig, "park ") || f.Kind == "none" && f.Trigger == "" {
			continue
		}
		t, err := injector.ParseTrigger(trig)
		if err != nil {
			continue
		}
		spec := t.Point + "=pause"
		if t.VM != "" {
			spec += "@vm=" + t.VM
		}
		if !seen[spec] {
			seen[spec] = true
			parts = append(parts, spec)
		}
	}
	if cr.s.Env.Failpoints != "" {
		parts = append(parts, cr.s.Env.Failpoints)
	}
	return strings.Join(parts, ";")
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
	if f.Unit == "daemon" {
		unit = cr.st.DaemonUnit
	}
	out := injector.Fault{Kind: f.Kind, Unit: unit, Child: f.Child}
	if f.Kind == "sigkill-vmm" {
		if v, ok, _ := cr.st.VMByName(context.Background(), f.VM); ok {
			out.VM = v.ID
		}
	}
	// stop: the harness starts the unit again itself (WhileStopped steps run
	// in between), so the injector must not.
	return out
}

// record converts an injector record, applying the scenario's window.
func (cr *caseRun) record(i int, in injector.Injection) reports.Injection {
	f := cr.s.Faults[i]
	out := reports.Injection{Fault: in.Fault.String(), Trigger: in.Trigger.String(), RequestedNs: in.RequestedNs,
		ActualNs: in.ActualNs, Err: in.Err, VictimPID: in.VictimPID, LastPhase: in.LastPhase,
		IntendedPhase: in.IntendedPhase, Landed: in.Landed}
	if in.VictimPID > 0 {
		cr.mu.Lock()
		cr.victims[in.VictimPID] = true
		cr.mu.Unlock()
	}
	if f.Kind == "sigkill-vmm" {
		cr.noteVMMKill(f.VM, in.ActualNs)
	}
	if f.Window[0] != "" && in.Err == "" {
		out.IntendedPhase = f.Window[0] + ".." + f.Window[1]
		ok, why := cr.inWindow(in.TriggerNs, in.ActualNs, f.Window)
		out.Landed = ok
		if !ok {
			out.Err = why
		}
	}
	return out
}

// inWindow: the fault came after the window's first point and before the
// first hit of its last point after that.
func (cr *caseRun) inWindow(fromNs, actualNs int64, w [2]string) (bool, string) {
	if w[1] == "" {
		return true, ""
	}
	for _, e := range cr.st.Trace.Sorted() {
		if e.TsNs < fromNs || e.Point != w[1] {
			continue
		}
		if e.TsNs <= actualNs {
			return false, fmt.Sprintf("the operation had already reached %s %.1fms before the fault", w[1], float64(actualNs-e.TsNs)/1e6)
		}
		break
	}
	return true, ""
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

// now fires fault i immediately (trigger "now").
func (cr *caseRun) now(ctx context.Context, i int) reports.Injection {
	f := cr.s.Faults[i]
	req := failpoint.Now()
	if f.Kind == "sigkill-vmm" {
		// resolve the id before the kill: the event stream must report it
		v, ok, err := cr.st.VMByName(ctx, f.VM)
		if err != nil || !ok {
			return reports.Injection{Fault: f.Kind, Trigger: "now", RequestedNs: req, Err: fmt.Sprintf("no vm %s: %v", f.VM, err), IntendedPhase: "steady state"}
		}
		sent := failpoint.Now()
		pid, err := cr.st.KillVMM(ctx, v.ID)
		out := reports.Injection{Fault: f.Kind, Trigger: "now", RequestedNs: req, ActualNs: sent, VictimPID: pid,
			LastPhase: "steady state", IntendedPhase: "steady state", Landed: err == nil}
		if err != nil {
			out.Err = err.Error()
		}
		cr.mu.Lock()
		cr.kills = append(cr.kills, vmmKill{ID: v.ID, Name: f.VM, TsNs: out.ActualNs})
		cr.mu.Unlock()
		return out
	}
	in := cr.inj.Inject(ctx, cr.injFault(f))
	out := cr.record(i, in)
	out.Trigger, out.LastPhase, out.IntendedPhase = "now", "steady state", "steady state"
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
	hit, err := cr.st.Trace.WaitPoint(ctx, mark, t.Point, 1, t.VM)
	if err != nil {
		return nil, err
	}
	pid, err := failpoint.WaitParked(ctx, cr.st.CtlDir, t.Point)
	if err != nil {
		return nil, err
	}
	if pid != hit.Event.Pid {
		return nil, fmt.Errorf("parked pid %d is not the pid %d that hit %s", pid, hit.Event.Pid, t.Point)
	}
	cr.mu.Lock()
	cr.held = append(cr.held, t.Point)
	cr.mu.Unlock()
	var out []reports.Injection
	var firstNs int64
	for _, i := range idx {
		f := cr.s.Faults[i]
		if f.Kind == "none" {
			// the park itself is the interference (a live operation held
			// at an exact phase while something else happens)
			now := failpoint.Now()
			out = append(out, reports.Injection{Fault: "none (held parked)", Trigger: trig, RequestedNs: now, ActualNs: now,
				VictimPID: pid, LastPhase: t.Point, IntendedPhase: t.Point, Landed: true})
			if firstNs == 0 {
				firstNs = now
			}
			continue
		}
		if f.Kind == "sigkill-direct" {
			// a vmctl the harness started itself, parked: kill it there
			host := cr.st.HostPID(pid)
			rec := reports.Injection{Fault: f.Kind, Trigger: trig, RequestedNs: failpoint.Now(), VictimPID: host, IntendedPhase: t.Point}
			if !cr.isDirect(host) {
				rec.Err = fmt.Sprintf("parked pid %d (host %d) is not a process the harness started", pid, host)
			} else if err := stack.KillProc(host); err != nil {
				rec.Err = err.Error()
			}
			rec.ActualNs = failpoint.Now()
			rec.LastPhase = cr.lastPhase(hit.Event, rec.ActualNs)
			rec.Landed = rec.Err == "" && rec.LastPhase == t.Point
			if firstNs == 0 {
				firstNs = rec.ActualNs
			}
			cr.mu.Lock()
			cr.victims[pid] = true
			cr.mu.Unlock()
			out = append(out, rec)
			continue
		}
		in := cr.inj.Inject(ctx, cr.injFault(f))
		rec := reports.Injection{Fault: in.Fault.String(), Trigger: trig, RequestedNs: in.RequestedNs, ActualNs: in.ActualNs,
			Err: in.Err, VictimPID: in.VictimPID, IntendedPhase: t.Point}
		if firstNs == 0 {
			firstNs = in.ActualNs
		}
		// The parked process cannot have moved on: its last phase is the
		// point unless the fault hit something else.
		rec.LastPhase = cr.lastPhase(hit.Event, in.ActualNs)
		rec.Landed = in.Err == "" && rec.LastPhase == t.Point
		if in.VictimPID > 0 {
			cr.mu.Lock()
			cr.victims[in.VictimPID] = true
			cr.mu.Unlock()
		}
		out = append(out, rec)
	}
	f := cr.s.Faults[idx[0]]
	switch {
	case f.ReleaseAfter == "reconcile-started":
		go cr.releaseWhen(ctx, t.Point, func(ctx context.Context) { cr.waitReconcile(ctx) })
	case f.ReleaseAfter != "":
		go cr.releaseWhen(ctx, t.Point, func(ctx context.Context) {
			_, _ = cr.st.Trace.Wait(ctx, mark, 1, func(e *failpoint.Event) bool { return e.Point == f.ReleaseAfter && e.TsNs > firstNs })
		})
	case f.ReleaseAfterChild != "":
		go cr.releaseWhen(ctx, t.Point, func(ctx context.Context) { cr.waitChildExit(ctx, mark, firstNs, f.ReleaseAfterChild) })
	default:
		cr.release(t.Point)
	}
	return out, nil
}

func (cr *caseRun) releaseWhen(ctx context.Context, point string, cond func(context.Context)) {
	cond(ctx)
	cr.release(point)
}

func (cr *caseRun) release(point string) {
	_ = failpoint.Release(cr.st.CtlDir, point)
	cr.mu.Lock()
	defer cr.mu.Unlock()
	for i, p := range cr.held {
		if p == point {
			cr.held = append(cr.held[:i], cr.held[i+1:]...)
			break
		}
	}
}

func (cr *caseRun) releaseAll() {
	cr.mu.Lock()
	held := append([]string(nil), cr.held...)
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

// afterExit fires fault i OFFSET after the N-th exit of an agent child of
// the trigger's kind.
func (cr *caseRun) afterExit(ctx context.Context, mark, i int, trig string) ([]reports.Injection, error) {
	t, err := injector.ParseTrigger(trig)
	if err != nil {
		return nil, err
	}
	hit, err := cr.st.Trace.Wait(ctx, mark, t.N, childExit(0, t.Child, t.VM))
	if err != nil {
		return nil, err
	}
	req := hit.Event.TsNs + int64(t.Offset)
	if d := time.Duration(req - failpoint.Now()); d > 0 {
		time.Sleep(d)
	}
	in := cr.inj.Inject(ctx, cr.injFault(cr.s.Faults[i]))
	in.Trigger, in.RequestedNs, in.TriggerNs, in.TriggerPID = t, req, hit.Event.TsNs, hit.Event.Pid
	in.IntendedPhase = "agent.child.exit"
	time.Sleep(20 * time.Millisecond) // datagrams sent before the kill
	if e, ok := cr.st.Trace.LastOf(hit.Event.Pid, in.ActualNs); ok {
		in.LastPhase = e.Point
	}
	in.Landed = in.Err == "" && in.LastPhase != ""
	return []reports.Injection{cr.record(i, in)}, nil
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

// waitFailpoint: a VMCHAOS_FAILPOINTS action is the fault; it landed when
// the trigger point was hit.
func (cr *caseRun) waitFailpoint(ctx context.Context, mark, i int, trig string) ([]reports.Injection, error) {
	t, err := injector.ParseTrigger(trig)
	if err != nil {
		return nil, err
	}
	hit, err := cr.st.Trace.WaitPoint(ctx, mark, t.Point, t.N, t.VM)
	if err != nil {
		return nil, err
	}
	return []reports.Injection{{Fault: "failpoint " + cr.s.Env.Failpoints, Trigger: trig, RequestedNs: hit.Event.TsNs,
		ActualNs: hit.Event.TsNs, LastPhase: t.Point, IntendedPhase: t.Point, Landed: true}}, nil
}

// killDirect SIGKILLs a vmctl the harness started itself, OFFSET after the
// trigger point (seed 002: a clone killed 59 ms after its placeholder).
func (cr *caseRun) killDirect(ctx context.Context, mark, i int, trig string) ([]reports.Injection, error) {
	t, err := injector.ParseTrigger(trig)
	if err != nil {
		return nil, err
	}
	hit, err := cr.st.Trace.WaitPoint(ctx, mark, t.Point, t.N, t.VM)
	if err != nil {
		return nil, err
	}
	req := hit.Event.TsNs + int64(t.Offset)
	if d := time.Duration(req - failpoint.Now()); d > 0 {
		time.Sleep(d)
	}
	host := cr.st.HostPID(hit.Event.Pid)
	rec := reports.Injection{Fault: "sigkill-direct", Trigger: trig, RequestedNs: req, VictimPID: host, IntendedPhase: t.Point}
	if !cr.isDirect(host) {
		rec.Err = fmt.Sprintf("pid %d (host %d) that hit %s is not a process the harness started", hit.Event.Pid, host, t.Point)
		rec.ActualNs = failpoint.Now()
		return []reports.Injection{rec}, nil
	}
	err = stack.KillProc(host)
	rec.ActualNs = failpoint.Now()
	if err != nil {
		rec.Err = err.Error()
		return []reports.Injection{rec}, nil
	}
	time.Sleep(20 * time.Millisecond) // let datagrams sent before the kill arrive
	if e, ok := cr.st.Trace.LastOf(hit.Event.Pid, rec.ActualNs); ok {
		rec.LastPhase = e.Point
	}
	f := cr.s.Faults[i]
	rec.Landed = true
	if f.Window[0] != "" {
		rec.IntendedPhase = f.Window[0] + ".." + f.Window[1]
		ok, why := cr.inWindow(hit.Event.TsNs, rec.ActualNs, f.Window)
		rec.Landed, rec.Err = ok, why
	}
	cr.mu.Lock()
	cr.victims[hit.Event.Pid] = true
	cr.mu.Unlock()
	return []reports.Injection{rec}, nil
}

// step runs one harness step.
func (cr *caseRun) step(ctx context.Context, step scenarios.Step, budget time.Duration) error {
	st := cr.st
	names := []string{step.VM}
	if step.N > 0 {
		names = names[:0]
		for i := 0; i < step.N; i++ {
			names = append(names, fmt.Sprintf("%s-%d", step.VM, i))
		}
	}
	switch step.Kind {
	case scenarios.StepCreate, scenarios.StepWake, scenarios.StepHibernate:
		hib := step.Kind == scenarios.StepHibernate
		for _, n := range names {
			if hib {
				cr.cycles[n] = true
			}
			if err := cr.put(ctx, n, nodeagent.Intent{Snapshot: baseSnapshot, Hibernate: hib}); err != nil {
				return err
			}
		}
		if step.Wait {
			for _, n := range names {
				if err := cr.waitGoal(ctx, n, budget); err != nil {
					return err
				}
			}
		}
	case scenarios.StepDelete:
		if err := st.Agent.Delete(ctx, step.VM); err != nil {
			return err
		}
		cr.goals[step.VM] = checker.GoalDeleted
		if step.Wait {
			return cr.waitGoal(ctx, step.VM, budget)
		}
	case scenarios.StepLedgerWrite:
		g, err := cr.guest(ctx, step.VM)
		if err != nil {
			return err
		}
		cr.ledger[step.VM]++
		if _, err := st.Ledger.WriteMarkers(ctx, g, cr.ledger[step.VM]); err != nil {
			return err
		}
		// the baseline the next wake's boot id and RAM markers are
		// compared against (recorded now: the guest may be unreachable,
		// e.g. paused, right before the hibernate)
		if _, err := st.Ledger.RecordBootID(ctx, g); err != nil {
			return err
		}
	case scenarios.StepDirectClone:
		cmd, exit, err := st.StartProc("direct-clone-"+step.VM, "vm", "clone", "--name", step.VM, baseSnapshot)
		if err != nil {
			return err
		}
		cr.mu.Lock()
		cr.direct[step.VM] = &directProc{pid: cmd.Process.Pid, exit: exit}
		cr.mu.Unlock()
	case scenarios.StepDirectSave:
		v, ok, err := st.VMByName(ctx, step.VM)
		if err != nil || !ok {
			return fmt.Errorf("direct-save: no vm %s (%v)", step.VM, err)
		}
		cmd, exit, err := st.StartProc("direct-save-"+step.VM, "snapshot", "save", "--name", step.VM+"-manual", v.ID)
		if err != nil {
			return err
		}
		cr.mu.Lock()
		cr.direct["save-"+step.VM] = &directProc{pid: cmd.Process.Pid, exit: exit}
		cr.mu.Unlock()
	case scenarios.StepHoldLease:
		return cr.holdLease(ctx, step.VM)
	case scenarios.StepOrphanPause:
		return cr.orphanPause(ctx, step.VM)
	case scenarios.StepReconcile:
		// the record exists (creating) once the clone reserved it
		var id string
		deadline := time.Now().Add(budget)
		for id == "" && time.Now().Before(deadline) {
			if v, ok, _ := st.VMByName(ctx, step.VM); ok {
				id = v.ID
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if id == "" {
			return fmt.Errorf("reconcile: no record named %s", step.VM)
		}
		cmd, exit, err := st.StartProc("reconcile-"+step.VM, "vm", "reconcile-stale-create", id, "-o", "json")
		if err != nil {
			return err
		}
		cr.mu.Lock()
		cr.direct["reconcile"] = &directProc{pid: cmd.Process.Pid, exit: exit}
		cr.mu.Unlock()
	case scenarios.StepKillVMM:
		v, ok, err := st.VMByName(ctx, step.VM)
		if err != nil || !ok {
			return fmt.Errorf("kill-vmm: no vm %s (%v)", step.VM, err)
		}
		sent := failpoint.Now() // events must be stamped after the signal, not after we saw the death
		if _, err := st.KillVMM(ctx, v.ID); err != nil {
			return err
		}
		cr.mu.Lock()
		cr.kills = append(cr.kills, vmmKill{ID: v.ID, Name: step.VM, TsNs: sent})
		cr.mu.Unlock()
	case scenarios.StepWipeStatus:
		return wipeStatus(st.State, step.VM)
	case scenarios.StepCounterClaim:
		return cr.counterClaim(ctx, step.VM, budget)
	default:
		return fmt.Errorf("unknown step %q", step.Kind)
	}
	return nil
}

func (cr *caseRun) put(ctx context.Context, name string, in nodeagent.Intent) error {
	// A resumed operation's claim refuses counter-intents until it is
	// done; a caller retries (the way the kubelet retries an update).
	deadline := time.Now().Add(floor(cr.r.scale(60*time.Second), 20*time.Second))
	for {
		err := cr.st.Agent.Put(ctx, name, in)
		if err == nil {
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
	v, ok, err := cr.st.VMByName(ctx, name)
	if err != nil {
		return ledger.Guest{}, err
	}
	if !ok || v.GuestAddress() == "" {
		return ledger.Guest{}, fmt.Errorf("ledger: vm %s has no guest address", name)
	}
	return ledger.Guest{Name: name, Addr: v.GuestAddress()}, nil
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

// converge waits, with Gomega's Eventually(...).MustPassRepeatedly(n),
// until every state invariant held StablePolls times in a row; it returns the
// last evaluation and the CLOCK_MONOTONIC time of the first poll of the
// stable streak (0 if the budget ran out).
func (cr *caseRun) converge(ctx context.Context, in *checker.Input, budget time.Duration) ([]reports.Invariant, int64) {
	every := floor(cr.r.scale(time.Second), 50*time.Millisecond)
	var last []reports.Invariant
	var first, lastTs int64
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
		lastTs = p.TsNs
		gg.Expect(violated(last)).To(gomega.BeEmpty())
	}).WithTimeout(budget).WithPolling(every).MustPassRepeatedly(cr.r.opts.StablePolls).Should(gomega.Succeed())
	_ = lastTs
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

// stackPhase is where the operation was when the fault landed: the victim's
// last phase, unless that is only the agent's child bookkeeping, in which
// case the last phase any process of the stack reached.
func (cr *caseRun) stackPhase(in reports.Injection) string {
	if in.LastPhase != "" && !strings.HasPrefix(in.LastPhase, "agent.child.") {
		return in.LastPhase
	}
	last := in.LastPhase
	for _, e := range cr.st.Trace.Sorted() {
		if e.TsNs > in.ActualNs {
			break
		}
		if !strings.HasPrefix(e.Point, "agent.child.") && !strings.HasPrefix(e.Point, "store.commit.") {
			last = e.Point
		}
	}
	return last
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
	cmd, exit, err := cr.st.StartProcFP("hold-lease-reader", point+"=pause", "vm", "clone", "--name", "reader", name)
	if err != nil {
		return err
	}
	cr.mu.Lock()
	cr.direct["reader"] = &directProc{pid: cmd.Process.Pid, exit: exit}
	cr.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pid, err := failpoint.WaitParked(wctx, cr.st.CtlDir, point)
	if err != nil {
		return fmt.Errorf("hold-lease: %w", err)
	}
	if !cr.isDirect(cr.st.HostPID(pid)) {
		return fmt.Errorf("hold-lease: parked pid %d is not the reader the harness started", pid)
	}
	cr.mu.Lock()
	cr.held = append(cr.held, point)
	cr.mu.Unlock()
	go cr.releaseWhen(ctx, point, func(ctx context.Context) { cr.waitChildExit(ctx, from, fromNs, "snapshot rm") })
	return nil
}

// lastPhase is the last phase the parked operation reached by tsNs: the last
// event of the parked process for the same VM, ignoring the agent's child
// bookkeeping (the agent is many goroutines: its watcher keeps emitting
// agent.child.* while one operation is parked).
func (cr *caseRun) lastPhase(parked failpoint.Event, tsNs int64) string {
	last := ""
	for _, e := range cr.st.Trace.Sorted() {
		if e.TsNs > tsNs {
			break
		}
		if e.Pid != parked.Pid || strings.HasPrefix(e.Point, "agent.child.") {
			continue
		}
		if parked.VM != "" && e.VM != "" && e.VM != parked.VM {
			continue
		}
		last = e.Point
	}
	return last
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
	cmd, exit, err := cr.st.StartProcFP("orphan-pause-"+name, point+"=pause", "snapshot", "save", "--name", name+"-orphan", v.ID)
	if err != nil {
		return err
	}
	cr.mu.Lock()
	cr.direct["orphan-"+name] = &directProc{pid: cmd.Process.Pid, exit: exit}
	cr.mu.Unlock()
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
