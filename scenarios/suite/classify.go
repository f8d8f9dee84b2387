package suite

import (
	"strings"

	"github.com/vmchaos/vmchaos/scenarios"
)

// Class says whether a case may share the machine with other cases of the
// run (issue #37).
type Class string

const (
	// Shared cases land their faults at an exact phase (a park holds the
	// process until the harness fires) or at steady state: the load beside
	// them changes how long they take, not where the fault lands.
	Shared Class = "shared"
	// Alone cases land their faults by the clock (at, after-exit, an
	// offset, a sweep point, a down period that ends on a timer), or
	// calibrate a window before arming: a neighbour's CPU would move the
	// fault or stretch the measured window, so nothing of the run runs
	// beside them.
	Alone Class = "alone"
)

// failpointAction is the catalogue's fault kind for a VMCHAOS_FAILPOINTS
// action (scenarios.Fault.Kind "failpoint").
const failpointAction = "failpoint"

// Classify is the class of a case, read from its spec, and why. Rules in
// order; the first that names a clock makes the case alone:
//   - a sweep point (a fraction of a window calibrated on the case's own
//     stack) or a fixed offset: the fault lands at a time after its trigger;
//   - a window calibration (docs/architecture.md §15: an at/after-exit
//     fault's window is measured on the case's stack before arming);
//   - an at or after-exit trigger on any fault but a "failpoint" one (a
//     VMCHAOS_FAILPOINTS action the product runs itself, in the hit of its
//     point; the trigger only waits for the trace to show it, so no clock
//     of the harness places it: runner waitFailpoint);
//   - a while-down second fault after a kill or a freeze: the agent is
//     down for its RestartSec or the freeze's StopFor, a timer, and the
//     harness must land inside it (after a stop the down period ends only
//     when the harness itself starts the unit again, after the while-down
//     fault: no clock, so that case stays shared);
//   - a "now" fault fired while an act step is still in flight (a step
//     without Wait): it lands wherever the operation got to;
//   - while-stopped steps after a fault that is not a stop: they race the
//     agent's RestartSec.
//
// Everything else (park triggers, exact and deterministic per
// docs/architecture.md §7; failpoint actions; "now" at steady state; no
// fault) is shared.
func Classify(c scenarios.Case) (Class, string) {
	s := c.Scenario
	switch {
	case c.HasFrac:
		return Alone, "sweep point (a fraction of a window calibrated on the case's stack)"
	case c.HasOff:
		return Alone, "offset after its trigger"
	case NeedsCalibration(c):
		return Alone, "window calibration"
	}
	stop, action := false, false
	for _, f := range s.Faults {
		t := strings.TrimSpace(f.Trigger)
		switch {
		case f.Kind == failpointAction:
			// placed by the product at its point, whatever the load
			action = true
		case strings.HasPrefix(t, "at "), strings.HasPrefix(t, "after-exit "):
			return Alone, "timed trigger " + t
		case t == scenarios.TriggerWhileDown && !downUntilStarted(s):
			return Alone, "while-down fault (the down period ends on a timer)"
		case t == "now" && f.Kind != "none" && actInFlight(s):
			return Alone, "now fault during an act step in flight"
		}
		stop = stop || f.Kind == "stop"
	}
	if len(s.WhileStopped) > 0 && !stop {
		return Alone, "while-stopped steps race the agent's RestartSec"
	}
	if action {
		return Shared, "failpoint action (the product runs it in the hit of its point)"
	}
	return Shared, "exact phase (park) or steady state"
}

// downUntilStarted: the first fault is a stop, so the agent stays down
// until the harness's operator start (runner restore), which comes after
// every while-down fault was fired (runner inject): the while-down fault
// lands in the down period whatever the load. The runner sends no SIGCONT
// and the supervisor restarts no stopped unit on a timer.
func downUntilStarted(s *scenarios.Scenario) bool {
	return len(s.Faults) > 0 && s.Faults[0].Kind == "stop"
}

// NeedsCalibration mirrors the runner's condition for measuring the first
// fault's window before arming (runner/window.go: windowed, and an offset
// or a fraction to place in it); calibration must run alone.
func NeedsCalibration(c scenarios.Case) bool {
	s := c.Scenario
	if len(s.Faults) == 0 || !(c.HasOff || c.HasFrac) {
		return false
	}
	f := s.Faults[0]
	t := f.Trigger
	return f.Window[0] != "" && f.Window[1] != "" && (strings.HasPrefix(t, "at ") || strings.HasPrefix(t, "after-exit "))
}

// actInFlight reports whether an act step returns before its operation
// finished, so that a "now" fault after the act lands mid-operation.
func actInFlight(s *scenarios.Scenario) bool {
	for _, st := range s.Act {
		if !st.Wait {
			return true
		}
	}
	return false
}
