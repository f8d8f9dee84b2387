package runner

import (
	"math"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios/checker"
	"github.com/vmchaos/vmchaos/scenarios/stack"
)

// The runner's own trace-derived judgements (fault-landed, the while-down
// check of a double fault, no-unexpected-restart) go through the same
// trace-loss guard as the checker's history invariants: a judgement whose
// window may hold a lost datagram does not pass.

// traceLost is the trace-loss guard of a judgement over [fromNs, toNs] of
// evs (a whole trace in arrival order: in stamp order a datagram stamped
// before it took its number, a failpoint.signal, would read as a gap): ""
// when no datagram may have been lost in that window, else the loss
// (injector.LostBetween, sequence gaps per emitting process), for the
// judgement to refuse to pass.
func traceLost(evs []failpoint.Event, fromNs, toNs int64) string {
	ls := injector.LostBetween(evs, fromNs, toNs)
	if len(ls) == 0 {
		return ""
	}
	return "the trace is incomplete in the window judged: " + checker.Losses(ls).Error()
}

// landingOn is judgeLanding over the trace of ts (the case's stack, or the
// cluster node whose phase the trigger read) behind the trace-loss guard
// (guardedLanding).
func landingOn(ts *stack.Stack, w phaseWindow, fromNs, faultNs int64, pid int) landing {
	return guardedLanding(ts.Trace.Events(), ts.Trace.Sorted(), w, fromNs, faultNs, pid)
}

// guardedLanding is judgeLanding (over sorted, the trace in time order)
// refused when arrival (the same trace in arrival order) may have lost a
// datagram between fromNs and the fault: not landed, with the loss as the
// reason, for the lost one may be the opener, the closer or an operation's
// start. The phase it hit is still named.
func guardedLanding(arrival, sorted []failpoint.Event, w phaseWindow, fromNs, faultNs int64, pid int) landing {
	if lost := traceLost(arrival, fromNs, faultNs); lost != "" {
		return landing{Phase: stackPhaseAt(sorted, faultNs), Why: "landing in " + w.String() + " not proven: " + lost}
	}
	return judgeLanding(sorted, w, fromNs, faultNs, pid)
}

// restartsUnproven is the guard of NoUnexpectedRestart, which counts agent
// starts from the arming on: with a datagram lost since then (or malformed,
// or the socket gone) it returns the invariant failed with the guard's
// evidence, and true.
func (cr *caseRun) restartsUnproven() (reports.Invariant, bool) {
	tr := cr.st.Trace
	bad, lastBad := tr.Malformed()
	return restartsGuard(tr.Events(), tr.Path(), bad, lastBad, cr.armNs)
}

// restartsGuard is restartsUnproven over a trace's events (arrival order),
// its socket path, its malformed count and the arming time.
func restartsGuard(evs []failpoint.Event, sockPath string, bad int, lastBad string, armNs int64) (reports.Invariant, bool) {
	lost := injector.LostBetween(evs, armNs, math.MaxInt64)
	return checker.TraceGuard(NoUnexpectedRestart, checker.TraceLoss(sockPath, bad, lastBad, checker.Losses(lost)))
}
