package runner

import (
	"fmt"
	"strings"

	"github.com/vmchaos/vmchaos/failpoint"
)

// SteadyState is the phase of a fault meant to hit a stack with no
// operation in flight (trigger "now").
const SteadyState = "steady state"

// phaseWindow is the closed window a fault must land in. Every trigger kind
// is judged against one: a field or sweep window (Open → Close), a parked
// point (Open = the point, Close "" = the next phase of the process that
// hit it, which a parked process cannot reach), or steady state.
type phaseWindow struct {
	Open, Close string
	Steady      bool
}

func (w phaseWindow) String() string {
	switch {
	case w.Steady:
		return SteadyState
	case w.Close == "":
		return w.Open
	}
	return w.Open + ".." + w.Close
}

// landing is the judgement of one fault against its window.
type landing struct {
	Landed  bool
	Phase   string // where the stack was when the fault hit
	Why     string // not landed: which edge it missed and by how much
	OpenNs  int64  // when the window opened (0: not before the fault)
	CloseNs int64  // when it closed, if it did before the fault
}

// operationStarts are the points that begin an operation: a fault meant for
// steady state that comes after one of them hit an operation in flight.
var operationStarts = map[string]bool{
	"agent.create.begin": true, "agent.hibernate.begin": true, "agent.wake.begin": true, "agent.delete.begin": true,
	"vm.create.reserved": true, "vm.clone.reserved": true, "snapshot.save.locked": true, "vm.rm.tombstoned": true,
	"snapshot.rm.tombstoned": true,
}

// judgeLanding is the one landing judgement: a fault at faultNs landed iff
// its window had opened (the first hit of Open at or after fromNs, by pid
// when pid > 0) and had not closed yet (Close was not hit after the open and
// at or before the fault; with Close "", the opener made no further phase).
// Steady state: no operation began between fromNs and the fault. evs must be
// sorted by time. A fault that missed names the phase it hit.
func judgeLanding(evs []failpoint.Event, w phaseWindow, fromNs, faultNs int64, pid int) landing {
	l := landing{Phase: stackPhaseAt(evs, faultNs)}
	if w.Steady {
		for _, e := range evs {
			if e.TsNs < fromNs || e.TsNs > faultNs {
				continue
			}
			if operationStarts[e.Point] {
				l.Why = fmt.Sprintf("meant for steady state, but %s began %s before the fault (it hit %s)", e.Point, ms(faultNs-e.TsNs), l.Phase)
				return l
			}
		}
		l.Landed, l.Phase = true, SteadyState
		return l
	}
	var open *failpoint.Event
	for i := range evs {
		e := &evs[i]
		if e.TsNs >= fromNs && e.Point == w.Open && (pid <= 0 || e.Pid == pid) {
			open = e
			break
		}
	}
	if open == nil || open.TsNs > faultNs {
		l.Why = fmt.Sprintf("before its window %s opened (%s not reached yet); it hit %s", w, w.Open, orDash(l.Phase))
		return l
	}
	l.OpenNs = open.TsNs
	for _, e := range evs {
		if e.TsNs <= open.TsNs {
			continue
		}
		closes := e.Point == w.Close
		if w.Close == "" {
			closes = e.Pid == open.Pid && !bookkeeping(e.Point)
		}
		if !closes {
			continue
		}
		if e.TsNs <= faultNs {
			l.CloseNs = e.TsNs
			if w.Close == "" {
				l.Phase = e.Point
				l.Why = fmt.Sprintf("after its window %s closed: the process had moved on to %s %s before the fault", w, e.Point, ms(faultNs-e.TsNs))
			} else {
				l.Why = fmt.Sprintf("after its window %s closed: the operation had reached %s %s before the fault; it hit %s", w, w.Close, ms(faultNs-e.TsNs), orDash(l.Phase))
			}
			return l
		}
		break
	}
	l.Landed = true
	if w.Close == "" {
		l.Phase = w.Open
	}
	return l
}

// bookkeeping points are emitted by the agent's other goroutines (its
// watcher, child accounting, the wedge detector) and by the store whatever
// the operation does: they are no phase of the operation.
func bookkeeping(point string) bool {
	// failpoint.signal is the in-victim fault's own announcement, not a
	// phase: stamped at the fault, it would always be "where it landed".
	// agent.wedged is the detector's report of an intent held past its
	// budget, which a park held long under load is: the parked operation
	// has not moved on (3 of 460 runs of selftest --count 20 at 12 stacks
	// at once came out inconclusive on it).
	return strings.HasPrefix(point, "agent.child.") || strings.HasPrefix(point, "store.commit.") ||
		point == failpoint.SignalPoint || point == "agent.wedged"
}

// stackPhaseAt is the last phase any process of the stack reached at or
// before tsNs, ignoring bookkeeping points.
func stackPhaseAt(evs []failpoint.Event, tsNs int64) string {
	last := ""
	for _, e := range evs {
		if e.TsNs > tsNs {
			break
		}
		if !bookkeeping(e.Point) {
			last = e.Point
		}
	}
	return last
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
