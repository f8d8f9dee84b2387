package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
)

// execute runs the case through its phases — arm, act, inject, restore,
// converge — and returns what they found; judge turns that into the
// verdict. A phase error says who failed (caseError).
func (cr *caseRun) execute(ctx context.Context, budget time.Duration) outcome {
	o := outcome{Budget: budget}
	// every way out of the timed part gives the machine back (restore
	// gives it back as soon as the faults are in)
	defer cr.clock.leave()
	o.Err = cr.arm(ctx, budget)
	cr.laps.lap("arm")
	if o.Err == nil && cr.refusal != "" {
		o.Refusal = cr.refusal
		return o
	}
	var waits []pendingFault
	if o.Err == nil {
		waits, o.Err = cr.armFaults(ctx)
	}
	var results []chan faultResult
	wctx, wcancel := context.WithTimeout(ctx, budget)
	defer wcancel()
	if o.Err == nil {
		results = startWaits(wctx, waits)
		o.Err = cr.act(ctx, budget)
		cr.laps.lap("act")
	}
	if o.Err == nil {
		o.NotLanded = cr.inject(ctx, waits, results)
		cr.laps.lap("inject")
		if len(o.NotLanded) > 0 {
			// a fault whose trigger point never came: the stack is
			// judged as it is (stall.go); any other miss proves nothing
			if o.Err = cr.judgeStall(ctx, budget); o.Err == nil {
				return o
			}
		}
	}
	if o.Err == nil {
		o.Err = cr.restore(ctx, budget)
		cr.laps.lap("restore")
	}
	if o.Err == nil {
		o.Invariants, o.Converged = cr.converge(ctx, budget)
		o.Certain = cr.ff.certain
	}
	if o.Err != nil && culpritOf(o.Err) == byProduct {
		cr.attachEvidence(ctx, o.Err)
		// converge never ran: what a power cut must keep is judged anyway
		cr.rc.Invariants = append(cr.rc.Invariants, cr.powerCutInvariants()...)
	}
	return o
}

// arm brings the stack to the moment before the operation: the agent (and
// daemon) up, the setup's goals reached with an unarmed agent, the fault
// placed in its window, then an agent armed with the case's failpoints that
// confirmed every goal again.
func (cr *caseRun) arm(ctx context.Context, budget time.Duration) error {
	st, s, r := cr.st, cr.s, cr.r
	if err := st.StartAgent(ctx); err != nil {
		return startErr(err)
	}
	if cr.cl != nil {
		if err := cr.cl.startAgents(ctx); err != nil {
			return startErr(err)
		}
	}
	cr.laps.lap("agent")
	daemonEvery := floor(r.scale(orDefault(s.Env.DaemonEvery, 5*time.Second)), 50*time.Millisecond)
	if s.Env.Daemon && !s.Env.DaemonArmed {
		if err := st.StartDaemon(ctx, daemonEvery); err != nil {
			return harnessErr(err)
		}
	}
	if err := cr.preCalibrate(ctx, budget); err != nil {
		return err
	}
	for _, step := range s.Setup {
		step.Wait = true
		if err := cr.step(ctx, step, budget); err != nil {
			return stepErr("setup", step, err)
		}
	}
	cr.laps.lap("setup")
	if windowed(s) && (cr.c.HasFrac || cr.c.HasOff) {
		refusal, err := cr.placeFault(ctx, budget)
		if err != nil {
			return fmt.Errorf("measuring the window of %s: %w", cr.c.ID, err)
		}
		if refusal != "" {
			cr.refusal = refusal
			return nil
		}
	}
	// Counters are sampled from the end of the setup on, so the re-arm
	// restart below is covered too: a counter must survive every restart.
	cr.scraper = checker.NewScraperDial(cr.metricsAddr, cr.st.MetricsDial(), 50*time.Millisecond, failpoint.Now)
	cr.scraper.ScrapeNow(ctx, failpoint.Now)
	// The setup ran with an agent without failpoints (it must not park at
	// the case's point); the armed agent replaces it.
	// The in-victim specs go to the processes that hit their points: the
	// agent (and its children, which inherit its environment) or the
	// harness's own vmctl processes.
	cr.laps.lap("window")
	// from the armed agent on (it carries the in-victim timers), through
	// the act and the injection, an at/after-exit trigger, an offset, a
	// while-down fault or a now fault in flight lands by the clock
	// (suite.Classify): an alone case holds the machine
	if err := cr.clock.enter(ctx); err != nil {
		return err
	}
	own := cr.armedOwn()
	fps := withSpecs(own, cr.victimSpecs(false))
	st.SetHarnessFailpoints(withSpecs(own, cr.victimSpecs(true)))
	if fps != "" {
		if err := st.Arm(ctx, fps); err != nil {
			return startErr(err)
		}
		// the armed agent adopted the setup's VMs: it must report every
		// goal again before the operation starts
		for name := range cr.goals {
			if err := cr.waitGoal(ctx, name, budget); err != nil {
				return productErr(GoalReached, fmt.Errorf("armed agent: %w", err))
			}
		}
	}
	if cr.cl != nil {
		if err := cr.armNodes(ctx); err != nil {
			return startErr(err)
		}
	}
	if s.Expect.Events {
		if _, err := st.StartObserver(0.25); err != nil {
			return harnessErr(fmt.Errorf("observer: %w", err))
		}
	}
	cr.scraper.ScrapeNow(ctx, failpoint.Now)
	if s.Expect.Adopted {
		cr.listBaseline(ctx)
	}
	// the setup's ledger writes are done: the act's is the one parked
	if err := cr.armLedgerPark(); err != nil {
		return err
	}
	cr.mark, cr.armNs = st.Trace.Mark(), failpoint.Now()
	if s.Env.DaemonArmed {
		// started after the mark: its first pass is the case's
		if err := st.StartDaemonFP(ctx, daemonEvery, cr.failpoints()); err != nil {
			return harnessErr(err)
		}
	}
	return nil
}

// armedOwn is the case's own failpoints as the armed agent and the
// harness's vmctls get them: none when they are the daemon's alone
// (Env.DaemonArmed), none at the startup points when the act restarts the
// agent (that restart arms them, StepRestartAgent).
func (cr *caseRun) armedOwn() string {
	switch {
	case cr.s.Env.DaemonArmed:
		return ""
	case scenarios.RestartsAgent(cr.s):
		return withoutPoints(cr.failpoints(), scenarios.StartupPoints)
	}
	return cr.failpoints()
}

// pendingFault is an armed fault (or the faults sharing one parked point)
// whose injection record comes from wait.
type pendingFault struct {
	idx  []int
	wait func(context.Context) ([]reports.Injection, error)
}

type faultResult struct {
	injs []reports.Injection
	err  error
}

// armFaults arms every fault of the scenario before the operation starts.
func (cr *caseRun) armFaults(ctx context.Context) ([]pendingFault, error) {
	s, r, mark := cr.s, cr.r, cr.mark
	var waits []pendingFault
	parks := map[string][]int{}
	var parkOrder []string
	for i, f := range s.Faults {
		i, trig := i, r.triggerString(cr.c, i)
		switch {
		case strings.HasPrefix(trig, "park "):
			if _, ok := parks[trig]; !ok {
				parkOrder = append(parkOrder, trig)
			}
			parks[trig] = append(parks[trig], i)
		case f.Kind == "none" || f.Trigger == "now" || f.Trigger == scenarios.TriggerWhileDown:
			// nothing to arm; "now" fires after the act steps, while-down
			// once the first fault is in (inject)
		case f.Kind == "failpoint":
			waits = append(waits, pendingFault{[]int{i}, func(ctx context.Context) ([]reports.Injection, error) {
				return cr.waitFailpoint(ctx, mark, i, trig)
			}})
		case f.Kind == scenarios.FaultPowerCut:
			// listed now, before the operation starts: listing asks the
			// supervisor, and the trigger may come before that is done
			pl := cr.planCut(ctx)
			waits = append(waits, pendingFault{[]int{i}, func(ctx context.Context) ([]reports.Injection, error) {
				return cr.cutAt(ctx, mark, i, trig, pl)
			}})
		default:
			// at and after-exit (sigkill-direct included): armed in the
			// injector, in the victim where it hits the point (victimArms),
			// else fired from the trace reader thread (no hand-off between
			// the hit and the signal; a harness goroutine woke up to 200 ms
			// late under load)
			t, err := injector.ParseTrigger(trig)
			if err != nil {
				return nil, harnessErr(fmt.Errorf("fault %d: %w", i, err))
			}
			w, err := cr.armTimed(ctx, i, t)
			if err != nil {
				return nil, err
			}
			waits = append(waits, w)
		}
	}
	for _, trig := range parkOrder {
		idx, trig := parks[trig], trig
		waits = append(waits, pendingFault{idx, func(ctx context.Context) ([]reports.Injection, error) {
			return cr.park(ctx, mark, trig, idx)
		}})
	}
	return waits, nil
}

// startWaits runs the injection waits concurrently with the act steps.
func startWaits(ctx context.Context, waits []pendingFault) []chan faultResult {
	results := make([]chan faultResult, len(waits))
	for i, w := range waits {
		ch := make(chan faultResult, 1)
		results[i] = ch
		go func(w pendingFault) {
			injs, err := w.wait(ctx)
			ch <- faultResult{injs, err}
		}(w)
	}
	return results
}

// act starts the interrupted operation and fires the "now" faults.
func (cr *caseRun) act(ctx context.Context, budget time.Duration) error {
	for _, step := range cr.s.Act {
		if err := cr.step(ctx, step, budget); err != nil {
			return stepErr("act", step, err)
		}
	}
	for i, f := range cr.s.Faults {
		if f.Trigger != "now" || f.Kind == "none" {
			continue
		}
		if cr.c.HasOff {
			time.Sleep(cr.r.scale(cr.c.Offset))
		}
		cr.rc.Injections = append(cr.rc.Injections, cr.now(ctx, i))
	}
	return nil
}

// inject collects every injection record and judges where each fault landed
// (judgeLanding, one judgement for every trigger kind). It returns the
// faults that missed, each naming the phase it hit.
func (cr *caseRun) inject(ctx context.Context, waits []pendingFault, results []chan faultResult) []string {
	s := cr.s
	var missed []string
	for i, ch := range results {
		res := <-ch
		if res.err != nil {
			if p := unreachedPoint(cr.r.triggerString(cr.c, waits[i].idx[0]), res.err); p != "" {
				cr.unreached = append(cr.unreached, p)
			}
			missed = append(missed, fmt.Sprintf("fault %v: %v", waits[i].idx, res.err))
			for _, j := range waits[i].idx {
				cr.rc.Injections = append(cr.rc.Injections, reports.Injection{Fault: s.Faults[j].Kind,
					Trigger: cr.r.triggerString(cr.c, j), Err: res.err.Error(), IntendedPhase: intended(s.Faults[j])})
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
	cr.rc.Injections = append(cr.rc.Injections, cr.injectWhileDown(ctx, firstInjection(cr.rc.Injections))...)
	sort.SliceStable(cr.rc.Injections, func(i, j int) bool { return cr.rc.Injections[i].ActualNs < cr.rc.Injections[j].ActualNs })
	for _, in := range cr.rc.Injections {
		if cr.faultNs == 0 || (in.ActualNs > 0 && in.ActualNs < cr.faultNs) {
			cr.faultNs = in.ActualNs
		}
	}
	if cr.faultNs == 0 {
		cr.faultNs = failpoint.Now()
	}
	for _, in := range cr.rc.Injections {
		if !in.Landed {
			missed = append(missed, fmt.Sprintf("%s (%s) landed in %q, intended %q%s", in.Fault, in.Trigger, in.LastPhase, in.IntendedPhase, errSuffix(in.Err)))
		}
	}
	// every case reports where its (first) fault landed
	if len(cr.rc.Injections) > 0 {
		cr.rc.LandedPhase = cr.rc.Injections[0].LastPhase
	}
	inv := reports.Invariant{Name: checker.FaultLanded, OK: len(missed) == 0}
	if !inv.OK {
		inv.Evidence = strings.Join(missed, "; ")
	}
	cr.rc.Invariants = append(cr.rc.Invariants, inv)
	return missed
}

// restore brings service back the way an operator would: a stopped unit is
// started again (after the WhileStopped steps and StopFor); without a stop
// the WhileStopped steps run at once, while the agent is down for
// RestartSec. Then the agent must serve again, and the After steps run.
func (cr *caseRun) restore(ctx context.Context, budget time.Duration) error {
	st, s := cr.st, cr.s
	if s.Expect.Adopted {
		cr.adoptBaseline()
	}
	var stop *scenarios.Fault
	for i := range s.Faults {
		if s.Faults[i].Kind == "stop" {
			stop = &s.Faults[i]
			break
		}
	}
	for _, step := range s.WhileStopped {
		if err := cr.step(ctx, step, budget); err != nil {
			return stepErr("while down", step, err)
		}
	}
	if stop != nil {
		if d := cr.r.scale(stop.StopFor) - time.Duration(failpoint.Now()-cr.faultNs); d > 0 {
			time.Sleep(d)
		}
		unit := cr.injFault(*stop).Unit // the agent's, the daemon's or another node's
		if err := st.Sup().StartAgain(ctx, unit); err != nil {
			return harnessErr(fmt.Errorf("operator start of %s: %w", unit, err))
		}
	}
	// the faults are in and the while-stopped steps (which race the
	// agent's RestartSec) ran: what follows waits on the product
	cr.clock.leave()
	if err := cr.waitServing(ctx, 60*time.Second); err != nil {
		return productErr(ServedAfterRestart, fmt.Errorf("the agent did not serve again after the fault: %w", err))
	}
	if err := cr.waitHealed(ctx, budget); err != nil {
		return err
	}
	for _, step := range s.After {
		if err := cr.step(ctx, step, budget); err != nil {
			return stepErr("after", step, err)
		}
	}
	return nil
}

// converge waits for a converged and stable state — every state invariant
// holds for StablePolls consecutive polls within the budget — then checks
// the history invariants, the metric deltas and the agent's restarts.
func (cr *caseRun) converge(ctx context.Context, budget time.Duration) ([]reports.Invariant, bool) {
	in := &checker.Input{Stack: cr.st, Goals: cr.goals, Generation: cr.gens, DirectVMs: cr.s.Expect.DirectVMs,
		AdoptedIDs: cr.adopted, AdoptedErr: cr.adoptErr, BaseName: baseSnapshot}
	if cr.st.Cocoon != nil {
		// cocoon has no check verb (its adapter says ErrNotSupported):
		// the invariants that need one are left out, never held
		in.Without = map[checker.Source]bool{checker.SrcCheck: true}
		// nor a per-VM ops lock: a poll where no cocoon verb runs is
		// quiescent (nothing owns a creating record any more)
		in.InFlight = cr.st.CocoonVerbs
	}
	invs, convergedNs := cr.pollStable(ctx, in, budget)
	cr.laps.lap("poll")
	if convergedNs > 0 {
		cr.rc.ConvergeMs = max(float64(convergedNs-cr.faultNs)/1e6, 0)
		if cr.healNs > 0 {
			ms := max(float64(convergedNs-cr.healNs)/1e6, 0)
			cr.rc.ConvergeAfterHealMs = &ms
		}
	}
	if convergedNs == 0 && checker.AllOK(invs) {
		// every invariant held at the last poll but never StablePolls
		// times in a row: the state kept flapping
		invs = append(invs, reports.Invariant{Name: checker.Stable, OK: false,
			Evidence: fmt.Sprintf("the state never held for %d consecutive polls within %s", cr.r.opts.StablePolls, budget)})
	}
	invs = append(invs, cr.history(ctx, convergedNs > 0, budget)...)
	cr.laps.lap("history")
	invs = append(invs, cr.restarts())
	invs = append(invs, cr.powerCutInvariants()...)
	cr.rc.Metrics = cr.metricDeltas()
	cr.rc.Invariants = append(cr.rc.Invariants, invs...)
	return cr.rc.Invariants, convergedNs > 0
}

// faultRestarts are the agent starts each fault kind causes (the unit's
// Restart=always after a kill or a restart, the operator's start after a
// stop).
var faultRestarts = map[string]int{"sigkill-main": 1, "restart": 1, "kill-all": 1, "stop": 1}

// restarts is NoUnexpectedRestart: after the armed agent, the agent unit
// started once per injected fault that restarts it, never more — a
// crash-looping agent restarts on its own.
func (cr *caseRun) restarts() reports.Invariant {
	if inv, lost := cr.restartsUnproven(); lost {
		return inv
	}
	starts, want := unexpectedStarts(cr.st.Trace.Sorted(), cr.s.Faults, cr.armNs, cr.faultNs)
	want += actionRestarts(cr.s)
	inv := reports.Invariant{Name: NoUnexpectedRestart, OK: len(starts) <= want}
	if !inv.OK {
		inv.Evidence = fmt.Sprintf("the agent started %d times after the fault(s), %d expected from the injected faults: %s\n%s",
			len(starts), want, strings.Join(starts, ", "), cr.evidence(context.Background()))
	}
	return inv
}

// actionRestarts is the agent start a failpoint fault's kill or exit
// action at one of the agent's own points causes (the unit's Restart=always
// after it): one, as the coverage cases' once= actions fire once; an error
// at a startup point ends the agent's run the same way. Each operator's
// restart of the act (StepRestartAgent) is one start too.
func actionRestarts(s *scenarios.Scenario) int {
	n := 0
	for _, st := range s.Act {
		if st.Kind == scenarios.StepRestartAgent {
			n++
		}
	}
	point, kind := scenarios.FailpointAction(s)
	if kind == scenarios.CovFailpointError && scenarios.StartupPoints[point] {
		return n + 1
	}
	if kind != scenarios.CovFailpointKill && kind != scenarios.CovFailpointExit {
		return n
	}
	if p, ok := failpoint.Lookup(point); ok && p.Proc == "nodeagent" {
		return n + 1
	}
	return n
}

// unexpectedStarts lists the agent starts after armNs and how many the
// faults explain.
func unexpectedStarts(evs []failpoint.Event, faults []scenarios.Fault, armNs, faultNs int64) ([]string, int) {
	want := 0
	for _, f := range faults {
		if f.Unit != "daemon" {
			want += faultRestarts[f.Kind]
		}
	}
	var starts []string
	for _, e := range evs {
		if e.Point == "agent.started" && e.TsNs > armNs {
			starts = append(starts, fmt.Sprintf("pid %d at fault%+.1fms", e.Pid, float64(e.TsNs-faultNs)/1e6))
		}
	}
	return starts, want
}

// judge decides the verdict from the outcome (the one verdict function) and
// records it; a product error becomes its invariant with the evidence.
func (cr *caseRun) judge(o outcome) {
	if ce, ok := o.Err.(*caseError); ok && ce.who == byProduct {
		cr.rc.Invariants = append(cr.rc.Invariants, reports.Invariant{Name: ce.invariant, OK: false,
			Evidence: strings.TrimSpace(ce.err.Error() + "\n" + ce.evidence)})
	}
	reports.AttributeLayers(cr.rc.Invariants)
	cr.rc.Verdict, cr.rc.Reason, cr.rc.Culprit = verdictOf(o)
}

// attachEvidence adds the agent's last log lines and its unit's status to a
// product error, while the stack is still up.
func (cr *caseRun) attachEvidence(ctx context.Context, err error) {
	if ce, ok := err.(*caseError); ok {
		ce.evidence = cr.evidence(ctx)
	}
}

// evidenceLines is how much of the agent's log a product failure carries.
const evidenceLines = 20

// evidence is the agent unit's status and the last lines of its log.
func (cr *caseRun) evidence(ctx context.Context) string {
	var b strings.Builder
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pid, err := cr.st.Sup().MainPID(sctx, cr.st.AgentUnit)
	starts := 0
	for _, e := range cr.st.Trace.Sorted() {
		if e.Point == "agent.started" {
			starts++
		}
	}
	fmt.Fprintf(&b, "unit %s: main pid %d", cr.st.AgentUnit, pid)
	if err != nil {
		fmt.Fprintf(&b, " (%v)", err)
	}
	fmt.Fprintf(&b, ", %d agent starts in the case\n", starts)
	if tail := lastLines(filepath.Join(cr.st.LogDir, "nodeagent.log"), evidenceLines); tail != "" {
		fmt.Fprintf(&b, "last %d lines of nodeagent.log:\n%s", evidenceLines, tail)
	}
	return b.String()
}

// lastLines is the last n lines of a file ("" when unreadable).
func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stepErr classifies a failed step by who failed: a goal the product did not
// reach, or an agent that refused or did not answer, is the product's;
// anything else the harness's.
func stepErr(phase string, step scenarios.Step, err error) error {
	if _, ok := err.(*caseError); ok {
		return err
	}
	return productErr(GoalReached, fmt.Errorf("%s %s %s: %w", phase, step.Kind, step.VM, err))
}

// startErr classifies a failed agent start: the supervisor refusing the unit
// is the harness's; an agent that never answered is the product's.
func startErr(err error) error {
	if strings.Contains(err.Error(), "not answering") {
		return productErr(ServedAfterRestart, err)
	}
	return harnessErr(err)
}
