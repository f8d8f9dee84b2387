package runner

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/lazyfs"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/powercut"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
	"github.com/vmchaos/vmchaos/scenarios/stack"
)

// The power cut (issue #22): the case's stack runs with its durable dirs on
// lazy filesystems; the fault stops and kills every process of the node at
// once and drops every write that was not durable (powercut.Node.Cut); the
// supervisor then starts the units as a boot would (Restart=always, after
// RestartSec), and the usual convergence check runs, plus what a cut must
// keep (checker.AckedIntentsKept, checker.RecordsHaveData, the ledger's
// acked disk markers).

// After a cut the agent unit starts once more: the boot.
func init() { faultRestarts[scenarios.FaultPowerCut] = 1 }

// hasPowerCut reports whether a scenario cuts the power.
func hasPowerCut(s *scenarios.Scenario) bool {
	for _, f := range s.Faults {
		if f.Kind == scenarios.FaultPowerCut {
			return true
		}
	}
	return false
}

// lazyStack is the stack option of a power-cut case (of every case with
// always: --lazyfs): its durable dirs on lazy filesystems. It says why when this host cannot mount one (then the
// case is inconclusive: a precondition, not a verdict on the product).
func lazyStack(s *scenarios.Scenario, always bool) (stack.LazyMount, string) {
	if !always && !hasPowerCut(s) {
		return nil, ""
	}
	if why := fuseAvailable(); why != "" {
		return nil, why
	}
	return func(durable, volatile, nss []string) (stack.Unmounter, error) {
		return powercut.MountIn(durable, volatile, nss)
	}, ""
}

// fuseAvailable is lazyfs.Available; a test replaces it to see a host
// without FUSE.
var fuseAvailable = lazyfs.Available

// preconditionErr is a case the host cannot run.
func preconditionErr(err error) error { return &caseError{who: byPrecondition, err: err} }

// cutState is what a power cut leaves for the checks after it.
type cutState struct {
	cutNs     int64
	listed    []nodeagent.VMView // what the rebooted agent lists first
	listErr   error
	coldBoot  string // why a guest may boot fresh afterwards ("" when no VMM died)
	recordsOK *reports.Invariant
}

// nodeProcs are every process of the node: the units' (agent, daemon, their
// vmctl children) as the supervisor tracks them, and the case's other
// processes (VMMs, vmctl processes the harness ran as an operator would),
// identified by the case's unique dirs. The harness's own observer is not
// the node's.
func (cr *caseRun) nodeProcs(ctx context.Context) []injector.Proc {
	seen := map[int]bool{}
	var out []injector.Proc
	for _, u := range []string{cr.st.AgentUnit, cr.st.DaemonUnit} {
		ps, err := cr.st.Sup().Procs(ctx, u)
		if err != nil {
			continue // a unit this case never started
		}
		for _, p := range ps {
			if !seen[p.PID] {
				seen[p.PID] = true
				out = append(out, p)
			}
		}
	}
	harness := cr.st.HarnessPIDs()
	for _, p := range cr.st.Processes() {
		if !seen[p.PID] && !harness[p.PID] {
			seen[p.PID] = true
			out = append(out, injector.Proc{PID: p.PID, Start: p.Start})
		}
	}
	return out
}

// cutPlan is what a power cut at a trigger lists before the trigger: the
// node's processes and the agent's main pid (supervisor round trips, 1 ms to
// tens of ms each while the sandbox's systemd is busy), so that the stop
// follows the hit at once instead of after them.
type cutPlan struct {
	procs   []injector.Proc
	mainPID injector.Proc
}

func (cr *caseRun) planCut(ctx context.Context) *cutPlan {
	pl := &cutPlan{procs: cr.nodeProcs(ctx)}
	if pid, err := cr.st.Sup().MainPID(ctx, cr.st.AgentUnit); err == nil && pid > 0 {
		pl.mainPID, _ = injector.Identify(pid)
	}
	return pl
}

// stopNode SIGSTOPs the planned processes, their descendants (a child
// started since the plan has a stopped parent, so it can start no more) and
// the case's other processes, then completes the list the slow way (the
// supervisor's view) and stops what that adds. It returns every process it
// stopped.
func (cr *caseRun) stopNode(ctx context.Context, pl *cutPlan) []injector.Proc {
	harness := cr.st.HarnessPIDs()
	seen := map[injector.Proc]bool{}
	var out []injector.Proc
	var stop func(p injector.Proc)
	stop = func(p injector.Proc) {
		if seen[p] || harness[p.PID] {
			return
		}
		seen[p] = true
		fd, err := injector.OpenPidFD(p)
		if err != nil {
			return // gone already, or its pid was reused
		}
		_ = fd.Signal(syscall.SIGSTOP)
		_ = fd.Close()
		out = append(out, p)
		for _, c := range injector.Children(p.PID) {
			if cp, err := injector.Identify(c); err == nil {
				stop(cp)
			}
		}
	}
	for _, p := range pl.procs {
		stop(p)
	}
	for _, p := range cr.st.Processes() {
		stop(injector.Proc{PID: p.PID, Start: p.Start})
	}
	for _, p := range cr.nodeProcs(ctx) {
		stop(p)
	}
	return out
}

// cutPower is the fault: the cut, then (the node is down; the supervisor
// boots the units after RestartSec) the release of a parked point, so the
// rebooted stack is not held there again, and the first look at what the
// rebooted stack kept. With a plan (at and after-exit triggers) the node is
// stopped first, from the plan, and the cut's time is that stop's.
func (cr *caseRun) cutPower(ctx context.Context, trig, parked string, pl *cutPlan) reports.Injection {
	rec := reports.Injection{Fault: scenarios.FaultPowerCut, Trigger: trig, RequestedNs: failpoint.Now()}
	node, ok := cr.st.Lazy.(*powercut.Node)
	if !ok {
		rec.Err = "the case's stack is not on lazy filesystems"
		return rec
	}
	var procs []injector.Proc
	if pl != nil {
		rec.ActualNs = failpoint.Now() // the SIGSTOP of the planned processes follows at once
		procs = cr.stopNode(ctx, pl)
		if pl.mainPID.PID > 0 && pl.mainPID.Exists() {
			rec.VictimPID = pl.mainPID.PID
		}
	} else {
		procs = cr.nodeProcs(ctx)
		if pid, err := cr.st.Sup().MainPID(ctx, cr.st.AgentUnit); err == nil {
			rec.VictimPID = pid
		}
	}
	vmms := 0
	for _, p := range procs {
		if sp, ok := cr.st.Identify(p.PID); ok && sp.Name() == "cloud-hypervisor" {
			vmms++
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if pl == nil {
		rec.ActualNs = failpoint.Now() // the SIGSTOP of every process follows at once
	}
	// the power-cut kind of the injector's one list, on this case's node
	_, err := injector.FaultKindPowerCut.Inject(cctx, injector.Target{Node: node, Procs: procs})
	if parked != "" {
		_ = failpoint.Release(cr.st.CtlDir, parked)
	}
	if err != nil {
		rec.Err = err.Error()
		return rec
	}
	cs := &cutState{cutNs: rec.ActualNs}
	if vmms > 0 {
		cs.coldBoot = fmt.Sprintf("power cut: %d VMM(s) died with the node; a guest not saved durably boots fresh", vmms)
	}
	// Right after the cut, before the booted agent acts: a record without
	// its data is a durability bug, whatever the agent does next.
	inv := cr.recordsHaveData(ctx)
	cs.recordsOK = &inv
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	if err := cr.waitServing(wctx, 60*time.Second); err != nil {
		cs.listErr = fmt.Errorf("the agent did not serve after the reboot: %w", err)
	} else {
		cs.listed, cs.listErr = cr.st.Agent.List(wctx)
	}
	wcancel()
	cr.mu.Lock()
	cr.cut = cs
	cr.mu.Unlock()
	return rec
}

// recordsHaveData reads the manager's own check of the store as the cut left
// it: the store loads, no VM record past creating is without its disk, no
// ready snapshot without its files.
func (cr *caseRun) recordsHaveData(ctx context.Context) reports.Invariant {
	return recordsHaveDataAfterCut(ctx, cr.st.ManagerObserver())
}

// recordsHaveDataAfterCut is the judgement of recordsHaveData on any
// manager's check (the agent's stack, a manager-verb case's adapter).
func recordsHaveDataAfterCut(ctx context.Context, obs manager.Observer) reports.Invariant {
	inv := reports.Invariant{Name: checker.RecordsHaveData + "-after-cut"}
	rep, err := obs.Check(ctx)
	if err != nil {
		inv.Evidence = "manager check after the cut: " + err.Error()
		return inv
	}
	// a store that does not load proves nothing about its records: it is
	// itself the loss (an index renamed into place before it was durable)
	ev := rep.Of(manager.CheckStoreLoadable)
	ev = append(ev, rep.Of(checker.CheckVMData)...)
	ev = append(ev, rep.Of(manager.CheckSnapshotData)...)
	inv.OK = len(ev) == 0
	if inv.OK {
		inv.Evidence = "every record the cut kept has its data"
	} else {
		inv.Evidence = strings.Join(ev, "; ")
	}
	return inv
}

// cutNow is a power cut fired right after the act steps (trigger "now").
func (cr *caseRun) cutNow(ctx context.Context, i int) reports.Injection {
	rec := cr.cutPower(ctx, "now", "", cr.planCut(ctx))
	cr.land(&rec, cr.faultWindow(i), cr.armNs, 0)
	return rec
}

// cutAt is a power cut OFFSET after the N-th hit of a point, or after the
// exit of an agent child (at and after-exit triggers), from the plan made
// when the fault was armed. It waits on the trace like killDirect: a late
// wake-up under load shows in the landing.
func (cr *caseRun) cutAt(ctx context.Context, mark, i int, trig string, pl *cutPlan) ([]reports.Injection, error) {
	t, err := injector.ParseTrigger(trig)
	if err != nil {
		return nil, err
	}
	var hit injector.Hit
	switch t.Kind {
	case injector.TriggerAt:
		hit, err = cr.st.Trace.WaitPoint(ctx, mark, t.Point, t.N, t.VM)
	case injector.TriggerAfterExit:
		hit, err = cr.st.Trace.Wait(ctx, mark, t.N, childExit(cr.armNs, t.Child, t.VM))
	default:
		return nil, fmt.Errorf("power cut: trigger %q", trig)
	}
	if err != nil {
		return nil, err
	}
	due := hit.Event.TsNs + int64(t.Offset)
	if d := time.Duration(due - failpoint.Now()); d > 0 {
		time.Sleep(d)
	}
	rec := cr.cutPower(ctx, trig, "", pl)
	rec.RequestedNs = due
	cr.land(&rec, cr.faultWindow(i), hit.Event.TsNs, 0)
	return []reports.Injection{rec}, nil
}

// powerCutInvariants are judged once the case converged (or not): what the
// rebooted agent listed first against every acknowledged intent change, and
// the store as the cut left it.
func (cr *caseRun) powerCutInvariants() []reports.Invariant {
	cr.mu.Lock()
	cs, acks := cr.cut, append([]checker.Ack(nil), cr.acks...)
	cr.mu.Unlock()
	if !hasPowerCut(cr.s) {
		return nil
	}
	if cs == nil {
		return []reports.Invariant{{Name: checker.AckedIntentsKept, Evidence: "no power cut completed: nothing to judge"}}
	}
	out := []reports.Invariant{checker.AckedIntentsKeptInvariant(acks, cs.cutNs, cs.listed, cs.listErr)}
	if cs.recordsOK != nil {
		out = append(out, *cs.recordsOK)
	}
	return out
}

// noteAck records an intent change the agent acknowledged.
func (cr *caseRun) noteAck(name string, gen int64, del bool, atNs int64) {
	cr.mu.Lock()
	cr.acks = append(cr.acks, checker.Ack{Name: name, Generation: gen, Delete: del, AtNs: atNs})
	cr.mu.Unlock()
}

// noteRelease records the case's own node's release of a VM to the control
// plane (a migration's source), answered at atNs.
func (cr *caseRun) noteRelease(name string, atNs int64) {
	cr.mu.Lock()
	cr.acks = append(cr.acks, checker.Ack{Name: name, Released: true, AtNs: atNs})
	cr.mu.Unlock()
}

// coldBootReason is why a guest may have booted fresh (a VMM died in the
// cut), for the ledger's verification.
func (cr *caseRun) coldBootReason() string {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	if cr.cut == nil {
		return ""
	}
	return cr.cut.coldBoot
}
