package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// parkWait bounds the wait for the VMM to park at the case's point.
const parkWait = 60 * time.Second

// settle is how long the released VMM gets to finish the request its dead
// client sent (scaled: fakech's durations are).
func (mc *mgrCase) settle() time.Duration {
	return floor(mc.r.scale(2*time.Second), 200*time.Millisecond)
}

// inject delivers the case's fault and judges where it landed with the one
// landing judgement (judgeLanding). An error is a harness failure or a
// missed window (landingErr); a fault that was delivered but outside its
// window comes back with Landed false.
func (mc *mgrCase) inject(ctx context.Context, window time.Duration) (reports.Injection, error) {
	if mc.mc.Trigger == scenarios.MgrTrigKillVMM {
		return mc.killVMM(ctx)
	}
	inj, w, err := mc.plan(window)
	if err != nil {
		return inj, err
	}
	mark := mc.trace.Mark()
	fromNs := failpoint.Now()
	t0 := time.Now()
	rv, err := mc.startVerb(mc.mc.Op.Call)
	if err != nil {
		return inj, productErr(ManagerSetup, fmt.Errorf("start the verb: %w", err))
	}
	pid := rv.cmd.Process.Pid
	inj.VictimPID = pid
	mc.verbEvs = append(mc.verbEvs, failpoint.Event{TsNs: fromNs, Point: mgrVerbStarted, Pid: pid})
	if err := mc.waitToFire(ctx, rv, mark, t0); err != nil {
		return inj, err
	}
	if mc.mc.VMMOnly {
		return mc.killVMMUnderVerb(ctx, rv, mark, fromNs)
	}
	if mc.mc.PowerCut {
		return mc.cutUnderVerb(ctx, inj, w, rv, fromNs)
	}
	if mc.mc.Freeze {
		return mc.freezeVerb(ctx, inj, w, rv, fromNs)
	}
	inj.RequestedNs = failpoint.Now()
	// The verb is our own child and not yet waited for, so its pid cannot
	// have been reused: a plain kill(2) hits exactly it.
	err = rv.cmd.Process.Signal(syscall.SIGKILL)
	inj.ActualNs = failpoint.Now()
	if err != nil {
		inj.Err = err.Error()
		_ = mc.releasePark()
		return inj, harnessErr(fmt.Errorf("SIGKILL the verb: %w", err))
	}
	code, err := rv.wait(ctx, 10*time.Second)
	if err != nil {
		return inj, harnessErr(err)
	}
	mc.verbEvs = append(mc.verbEvs, failpoint.Event{TsNs: rv.exitNs, Point: mgrVerbExited, Pid: pid})
	if mc.mc.Parks() {
		if mc.mc.ThenKillVMM {
			// the second fault: the parked VMM dies before it can finish
			// the dead client's request
			second, err := mc.killParkedVMM(mark)
			mc.second = &second
			if err != nil {
				_ = mc.releasePark()
				return inj, err
			}
		}
		// The VMM finishes the request of its dead client, as a real one
		// would once its handler returns.
		if err := mc.releasePark(); err != nil {
			return inj, harnessErr(err)
		}
		time.Sleep(mc.settle())
		pid = 0 // the window is the VMM's parked point, whoever hit it
	}
	// The window must be open when the kill was requested: ActualNs is
	// taken after kill(2) returned, and a descheduled runner can take it
	// after the verb already died of that very signal.
	mc.landAt(&inj, w, fromNs, inj.RequestedNs, pid)
	if inj.Landed && code != -1 {
		inj.Landed, inj.Err = false, fmt.Sprintf("%s exited %d on its own before the SIGKILL", mc.mc.Op.Verb, code)
	}
	return inj, nil
}

// plan is the injection record and the window of the case's trigger, and
// arms a park: from then on the first hit of the point parks.
func (mc *mgrCase) plan(window time.Duration) (reports.Injection, phaseWindow, error) {
	c := mc.mc
	switch c.Trigger {
	case scenarios.MgrTrigPark:
		inj := reports.Injection{Fault: mc.faultKind(), Trigger: "park " + c.Point}
		for _, f := range []string{".release", ".paused"} {
			if err := os.Remove(filepath.Join(mc.ctl, c.Point+f)); err != nil && !os.IsNotExist(err) {
				return inj, phaseWindow{}, harnessErr(err)
			}
		}
		return inj, phaseWindow{Open: c.Point}, nil
	case scenarios.MgrTrigOffset:
		off := time.Duration(float64(window) * c.Fraction)
		mc.rc.OffsetMs = float64(off) / float64(time.Millisecond)
		inj := reports.Injection{Fault: mc.faultKind(), Trigger: fmt.Sprintf("%s start + %.0f%% of %s (%s)", c.Op.Verb, c.Fraction*100,
			window.Round(time.Millisecond), off.Round(time.Millisecond))}
		// the verb's own lifetime is the window an offset must land in
		return inj, phaseWindow{Open: mgrVerbStarted, Close: mgrVerbExited}, nil
	}
	return reports.Injection{}, phaseWindow{}, harnessErr(fmt.Errorf("unknown trigger %q", c.Trigger))
}

// faultKind is what the case delivers at its park or offset.
func (mc *mgrCase) faultKind() string {
	switch {
	case mc.mc.PowerCut:
		return scenarios.MgrFaultPowerCut
	case mc.mc.Freeze:
		return scenarios.MgrFaultFreeze
	}
	return "sigkill-verb"
}

// land judges the injection against its window over the case's trace and
// the verb's own start and exit.
func (mc *mgrCase) land(inj *reports.Injection, w phaseWindow, fromNs int64, pid int) {
	mc.landAt(inj, w, fromNs, inj.ActualNs, pid)
}

// landAt is land with the fault's time given.
func (mc *mgrCase) landAt(inj *reports.Injection, w phaseWindow, fromNs, faultNs int64, pid int) {
	evs := append(mc.trace.Events(), mc.verbEvs...)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].TsNs < evs[j].TsNs })
	inj.IntendedPhase = w.String()
	l := judgeLanding(evs, w, fromNs, faultNs, pid)
	inj.LastPhase, inj.Landed = l.Phase, l.Landed && inj.Err == ""
	if !l.Landed {
		inj.Err = l.Why
	} else if w.Open == mgrVerbStarted {
		at := "no VMM phase yet"
		if p := vmmPhaseAt(evs, fromNs, faultNs); p != "" {
			at = "VMM at " + p
		}
		inj.LastPhase = "inside " + string(mc.mc.Op.Verb) + " (" + at + ")"
	}
}

// vmmPhaseAt is the last VMM phase (ch.*) since the verb started (fromNs)
// and at or before ns: an earlier one is the fixture's, not this verb's.
func vmmPhaseAt(evs []failpoint.Event, fromNs, ns int64) string {
	last := ""
	for _, e := range evs {
		if e.TsNs >= fromNs && e.TsNs <= ns && strings.HasPrefix(e.Point, "ch.") {
			last = e.Point
		}
	}
	return last
}

// waitToFire polls until the fault is due (the VMM parked at the point, or
// the offset passed since t0). A verb that exits first, or a park that
// never comes, is a missed window.
func (mc *mgrCase) waitToFire(ctx context.Context, rv *running, mark int, t0 time.Time) error {
	c := mc.mc
	target := t0.Add(time.Duration(mc.rc.OffsetMs * float64(time.Millisecond)))
	deadline := time.Now().Add(parkWait)
	for {
		select {
		case code := <-rv.exit:
			rv.exit <- code
			phases := mc.phasesSince(mark)
			if c.Parks() {
				_ = mc.releasePark()
				return landingErr(fmt.Errorf("%s exited %d after %s without the VMM parking at %s (VMM phases: %s)",
					c.Op.Verb, code, time.Since(t0).Round(time.Millisecond), c.Point, orDash(phases)))
			}
			return landingErr(fmt.Errorf("%s finished (exit %d) in %s, before the offset %.0fms: the window was shorter than calibrated (VMM phases: %s)",
				c.Op.Verb, code, time.Since(t0).Round(time.Millisecond), mc.rc.OffsetMs, orDash(phases)))
		case <-ctx.Done():
			_ = rv.cmd.Process.Kill()
			return harnessErr(ctx.Err())
		case <-time.After(time.Millisecond):
		}
		if c.Parks() {
			if _, err := os.Stat(filepath.Join(mc.ctl, c.Point+".paused")); err == nil {
				return nil
			}
		} else if !time.Now().Before(target) {
			select {
			case code := <-rv.exit: // it ended while the poll slept
				rv.exit <- code
				continue
			default:
				return nil
			}
		}
		if time.Now().After(deadline) {
			_ = rv.cmd.Process.Kill()
			_ = mc.releasePark()
			return landingErr(fmt.Errorf("%s did not reach %s within %s (VMM phases: %s)", c.Op.Verb, c.Point, parkWait, orDash(mc.phasesSince(mark))))
		}
	}
}

// phasesSince lists the ch.* points the case's VMMs reported since mark.
func (mc *mgrCase) phasesSince(mark int) string {
	var ps []string
	for _, e := range mc.trace.Since(mark) {
		if strings.HasPrefix(e.Point, "ch.") {
			ps = append(ps, e.Point)
		}
	}
	return strings.Join(ps, ",")
}

// killVMM kill -9s the VMM of the fixture's VM, found through the
// manager's record and checked against the VMM's command line; it must hit
// steady state (no verb in flight).
func (mc *mgrCase) killVMM(ctx context.Context) (reports.Injection, error) {
	inj := reports.Injection{Fault: "sigkill-vmm", Trigger: "now"}
	fromNs := failpoint.Now()
	vms, err := mc.m.VMs(ctx)
	if err != nil {
		return inj, productErr(ManagerListed, fmt.Errorf("vm list: %w", err))
	}
	var vm manager.VM
	for _, v := range vms {
		if v.Name == scenarios.MgrSrcVM {
			vm = v
		}
	}
	if vm.PID <= 0 || !alive(vm.PID) {
		return inj, productErr(ManagerSetup, fmt.Errorf("VM %s has no live VMM after its create (record %+v)", scenarios.MgrSrcVM, vm))
	}
	if id, ok := mc.m.VMMOf(argvOf(vm.PID)); !ok || id != vm.ID {
		return inj, productErr(ManagerSetup, fmt.Errorf("the record's pid %d is not the VMM of %s (%v)", vm.PID, vm.ID, argvOf(vm.PID)))
	}
	// The stream must have shown the VM running before the kill: a stream
	// that first lists it after the kill shows it stale whether or not it
	// notices deaths (cocoon v0.2.7 does not), so the check would pass by
	// timing alone.
	if err := mc.streamShowsRunning(ctx, vm.ID); err != nil {
		return inj, err
	}
	inj.VictimPID = vm.PID
	inj.RequestedNs = failpoint.Now()
	inj.ActualNs, err = killPID(vm.PID)
	if err != nil {
		inj.Err = err.Error()
		return inj, harnessErr(err)
	}
	mc.land(&inj, phaseWindow{Steady: true}, fromNs, 0)
	return inj, nil
}

// deathSeen: the event stream reports the killed VMM's VM as no longer
// running (cocoon and vmctl: MODIFIED "stopped (stale)") after the kill.
func (mc *mgrCase) deathSeen(ctx context.Context, killNs int64) reports.Invariant {
	inv := reports.Invariant{Name: VMMDeathSeen}
	limit := time.Now().Add(10 * time.Second)
	for time.Now().Before(limit) && ctx.Err() == nil {
		for _, e := range mc.events.since(killNs) {
			if e.ev.Name == scenarios.MgrSrcVM && e.ev.State != manager.StateRunning {
				inv.OK = true
				inv.Evidence = fmt.Sprintf("%s %s %q %.0fms after the kill", e.ev.Type, e.ev.ID, e.ev.State, float64(e.ns-killNs)/1e6)
				return inv
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	inv.Evidence = fmt.Sprintf("no event for %s left running within 10s of the kill (events after it: %s)", scenarios.MgrSrcVM, mc.events.describe(killNs))
	return inv
}

// streamShowsRunning waits until the event stream has reported VM id
// running; a stream that does not within 10 s fails the manager's event
// stream (a product failure with what it did print).
func (mc *mgrCase) streamShowsRunning(ctx context.Context, id string) error {
	limit := time.Now().Add(10 * time.Second) // safety net
	for time.Now().Before(limit) && ctx.Err() == nil {
		for _, e := range mc.events.since(0) {
			if e.ev.ID == id && e.ev.State == manager.StateRunning {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return productErr(ManagerEventStream, fmt.Errorf("the event stream never showed %s running within 10s of its create (events: %s)", id, mc.events.describe(0)))
}

// killParkedVMM kill -9s the VMM that hit the case's park point since mark
// (the one the dead verb talked to), checked against its command line.
func (mc *mgrCase) killParkedVMM(mark int) (reports.Injection, error) {
	inj := reports.Injection{Fault: "sigkill-vmm", Trigger: "after the verb's SIGKILL, the VMM parked at " + mc.mc.Point,
		IntendedPhase: mc.mc.Point}
	// The park file holds the hitter's pid, written before it blocks; the
	// trace datagram of the hit may not have been read yet.
	pctx, cancel := context.WithTimeout(context.Background(), time.Second)
	pid, err := failpoint.WaitParked(pctx, mc.ctl, mc.mc.Point)
	cancel()
	if err != nil {
		for _, e := range mc.trace.Since(mark) {
			if e.Point == mc.mc.Point && e.Pid > 0 {
				pid = e.Pid
			}
		}
	}
	inj.VictimPID = pid
	if inj.VictimPID == 0 || !alive(inj.VictimPID) {
		return inj, harnessErr(fmt.Errorf("no live VMM parked at %s to kill (hit by pid %d)", mc.mc.Point, inj.VictimPID))
	}
	if _, ok := mc.m.VMMOf(argvOf(inj.VictimPID)); !ok {
		return inj, harnessErr(fmt.Errorf("pid %d that hit %s is no VMM of the manager (%v)", inj.VictimPID, mc.mc.Point, argvOf(inj.VictimPID)))
	}
	inj.RequestedNs = failpoint.Now()
	if inj.ActualNs, err = killPID(inj.VictimPID); err != nil {
		inj.Err = err.Error()
		return inj, harnessErr(err)
	}
	inj.Landed, inj.LastPhase = true, "parked at "+mc.mc.Point
	return inj, nil
}

// verbEndWait bounds how long a verb whose VMM died may take to end.
const verbEndWait = 30 * time.Second

// killVMMUnderVerb kill -9s the VMM parked at the case's point while the
// verb waits on it alive, releases the park and waits for the verb to end:
// one that outlives its VMM by verbEndWait hangs (VerbEndsWhenVMMDies).
func (mc *mgrCase) killVMMUnderVerb(ctx context.Context, rv *running, mark int, fromNs int64) (reports.Injection, error) {
	inj, err := mc.killParkedVMM(mark)
	inj.Trigger = "park " + mc.mc.Point
	if err != nil {
		_ = mc.releasePark()
		_ = rv.cmd.Process.Kill()
		return inj, err
	}
	if err := mc.releasePark(); err != nil {
		return inj, harnessErr(err)
	}
	code, err := rv.wait(ctx, verbEndWait)
	if err != nil {
		return inj, productErr(VerbEndsWhenVMMDies, fmt.Errorf("%s did not end within %s of its VMM's death: %w", mc.mc.Op.Verb, verbEndWait, err))
	}
	mc.verbEvs = append(mc.verbEvs, failpoint.Event{TsNs: rv.exitNs, Point: mgrVerbExited, Pid: rv.cmd.Process.Pid})
	mc.verbEnd = fmt.Sprintf("%s exited %d after its VMM's death: %s", mc.mc.Op.Verb, code, logTail(rv.log, 1))
	mc.landAt(&inj, phaseWindow{Open: mc.mc.Point}, fromNs, inj.RequestedNs, 0)
	return inj, nil
}
