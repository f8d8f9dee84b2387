package runner

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// calibVM is the VM a case runs its operation on, before the fault is
// armed, to measure the operation's window on its own stack (calib-0,
// calib-1, ...: calibRuns of them, one after the other).
const (
	calibVM   = "calib"
	calibRuns = 2
)

// minGuard is the least distance a fixed offset must keep from a window
// edge it does not share with its trigger: on a loaded 2-core machine a
// signal lands a millisecond or two late, whatever the spread measured.
const minGuard = 2 * time.Millisecond

// maxPlace is how far into its window a fixed offset may sit: a run's
// window came out down to 59% of the narrowest calibration under heavy load.
const maxPlace = 0.6

// opWindow is the first fault's window measured on the case's stack, on
// the axis of its trigger's hit: the latest start and the earliest end over
// the calibration runs, and how far the end moved between them.
type opWindow struct {
	W              [2]string
	StartNs, EndNs int64
	SpreadNs       int64 // of the end edge
	StartSpreadNs  int64
	Source         string
}

// windowed reports whether the case's first fault has a closed window that
// its offset is placed in (at and after-exit triggers): those are measured
// before the fault is armed.
func windowed(s *scenarios.Scenario) bool {
	if len(s.Faults) == 0 {
		return false
	}
	f := s.Faults[0]
	t := f.Trigger
	return f.Window[0] != "" && f.Window[1] != "" && (strings.HasPrefix(t, "at ") || strings.HasPrefix(t, "after-exit "))
}

// spanAfter finds, among evs at or after fromNs, the trigger's hit and the
// window's edges after it: start = first Open at or after the hit, end =
// first Close after the start; both relative to the hit.
func spanAfter(evs []failpoint.Event, t injector.Trigger, w [2]string, fromNs int64) (start, end int64, ok bool) {
	trig, open, closed := spanEdges(evs, t, w, fromNs)
	if closed < 0 {
		return 0, 0, false
	}
	return open - trig, closed - trig, true
}

// spanEdges are the times of the trigger's hit, the window's open and its
// close as spanAfter finds them; -1 for each that never came.
func spanEdges(evs []failpoint.Event, t injector.Trigger, w [2]string, fromNs int64) (trig, open, closed int64) {
	trig, open = -1, -1
	n := 0
	want := max(t.N, 1)
	var match func(*failpoint.Event) bool
	if t.Kind == injector.TriggerAfterExit {
		match = childExit(fromNs, t.Child, "")
	} else {
		match = func(e *failpoint.Event) bool { return e.Point == t.Point }
	}
	for i := range evs {
		e := &evs[i]
		if e.TsNs < fromNs {
			continue
		}
		if trig < 0 {
			// the trigger's own hit may open the window too
			if !match(e) {
				continue
			}
			if n++; n < want {
				continue
			}
			trig = e.TsNs
		}
		switch {
		case open < 0 && e.Point == w[0] && e.TsNs >= trig:
			open = e.TsNs
		case open >= 0 && e.Point == w[1] && e.TsNs > open:
			return trig, open, e.TsNs
		}
	}
	return trig, open, -1
}

// calibSteps are the steps that bring calibration VM vm to the operation
// (prep) and the operation itself, for a scenario's operation.
func calibSteps(op, vm string) (prep []scenarios.Step, run scenarios.Step) {
	create := scenarios.Step{Kind: scenarios.StepCreate, VM: vm, Wait: true}
	hib := scenarios.Step{Kind: scenarios.StepHibernate, VM: vm, Wait: true}
	switch op {
	case scenarios.OpSave, scenarios.OpHibernate:
		return []scenarios.Step{create}, hib
	case scenarios.OpWake:
		return []scenarios.Step{create, hib}, scenarios.Step{Kind: scenarios.StepWake, VM: vm, Wait: true}
	case scenarios.OpDelete:
		return []scenarios.Step{create}, scenarios.Step{Kind: scenarios.StepDelete, VM: vm, Wait: true}
	}
	return nil, create // create, clone: the agent's create runs `vm clone`
}

// measureWindow runs the case's operation on VMs calib-N with the unarmed
// agent and measures the first fault's window after its trigger in each
// run: calibRuns runs, one after the other, and the narrowest reading (a
// load hiccup in one of them would otherwise stretch the window); a fixed
// offset needs one.
func (cr *caseRun) measureWindow(ctx context.Context, budget time.Duration) (opWindow, error) {
	return cr.measureVia()(ctx, budget, cr.calibVMs(), cr.calibIssued)
}

// measureVia is how the case measures its window: measureOn unless a test
// set cr.measure.
func (cr *caseRun) measureVia() func(context.Context, time.Duration, []string, bool) (opWindow, error) {
	if cr.measure != nil {
		return cr.measure
	}
	return cr.measureOn
}

// measureOn is measureWindow on calibration VMs vms (their first
// preparatory step already issued when issued).
func (cr *caseRun) measureOn(ctx context.Context, budget time.Duration, vms []string, issued bool) (opWindow, error) {
	f := cr.s.Faults[0]
	t, err := injector.ParseTrigger(f.Trigger + " + 0ms")
	if err != nil {
		return opWindow{}, harnessErr(fmt.Errorf("trigger %q: %w", f.Trigger, err))
	}
	ow := opWindow{W: f.Window, StartNs: -1, EndNs: -1}
	var got []string
	minEnd, maxEnd, minStart := int64(-1), int64(-1), int64(-1)
	t0 := time.Now()
	// The steps that only bring the calibration VMs to the operation run
	// for all of them at once (nothing is measured there; the first may
	// already have been issued beside the setup, see preCalibrate); the
	// measured operation runs on one VM at a time.
	prep0, _ := calibSteps(cr.s.Op, vms[0])
	for k := range prep0 {
		for _, vm := range vms {
			prep, _ := calibSteps(cr.s.Op, vm)
			st := prep[k]
			st.Wait = false
			if k == 0 && issued {
				continue
			}
			if err := cr.step(ctx, st, budget); err != nil {
				return ow, stepErr("calibration", st, err)
			}
		}
		for _, vm := range vms {
			if err := cr.waitGoal(ctx, vm, budget); err != nil {
				return ow, stepErr("calibration", scenarios.Step{Kind: prep0[k].Kind, VM: vm}, err)
			}
		}
	}
	// The measured runs are the timed part's start: from here to the
	// fault, nothing else of the run may stretch this stack's windows
	// (an alone case holds the machine; the preparation above and the
	// setup beside it measured nothing and shared it).
	if err := cr.clock.enter(ctx); err != nil {
		return ow, err
	}
	for _, vm := range vms {
		_, run := calibSteps(cr.s.Op, vm)
		fromNs := failpoint.Now()
		if err := cr.step(ctx, run, budget); err != nil {
			return ow, stepErr("calibration", run, err)
		}
		// the goal is reported before the last datagram may have been
		// read: give the trace a moment
		var start, end int64
		ok := false
		deadline := time.Now().Add(2 * time.Second)
		for !ok && time.Now().Before(deadline) {
			if start, end, ok = spanAfter(cr.st.Trace.Sorted(), t, f.Window, fromNs); !ok {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if !ok {
			return ow, cr.noWindow(ctx, vm, t, f.Window, fromNs)
		}
		got = append(got, fmt.Sprintf("%s..%s", ms(start), ms(end)))
		ow.StartNs = max(ow.StartNs, start)
		if minStart < 0 || start < minStart {
			minStart = start
		}
		if minEnd < 0 || end < minEnd {
			minEnd = end
		}
		maxEnd = max(maxEnd, end)
	}
	ow.EndNs, ow.SpreadNs, ow.StartSpreadNs = minEnd, maxEnd-minEnd, ow.StartNs-minStart
	ow.Source = fmt.Sprintf("%d calibration run(s) on this stack (%.1fs): %s after the trigger", len(vms), time.Since(t0).Seconds(), strings.Join(got, ", "))
	return ow, nil
}

// calibVMs are the calibration VMs of the case: a fraction is placed from
// the narrowest of calibRuns readings; a fixed field offset sits a few
// percent into a window many times longer and only needs to know the window
// is not too short: one run.
func (cr *caseRun) calibVMs() []string {
	runs := calibRuns
	if !cr.c.HasFrac {
		runs = 1
	}
	vms := make([]string, runs)
	for i := range vms {
		vms[i] = fmt.Sprintf("%s-%d", calibVM, i)
	}
	return vms
}

// preCalibrate issues the first preparatory step of the calibration VMs
// (their create) before the setup runs, so they are created alongside the
// setup's VMs instead of after them: nothing is measured there.
func (cr *caseRun) preCalibrate(ctx context.Context, budget time.Duration) error {
	if !windowed(cr.s) || !(cr.c.HasFrac || cr.c.HasOff) {
		return nil
	}
	vms := cr.calibVMs()
	prep, _ := calibSteps(cr.s.Op, vms[0])
	if len(prep) == 0 {
		return nil
	}
	for _, vm := range vms {
		p, _ := calibSteps(cr.s.Op, vm)
		st := p[0]
		st.Wait = false
		if err := cr.step(ctx, st, budget); err != nil {
			return stepErr("calibration", st, err)
		}
	}
	cr.calibIssued = true
	return nil
}

// placeFault measures the first fault's window and places the case's
// offset in it: a fraction becomes an absolute offset; a fixed offset is
// checked, and a case whose offset cannot lie inside its window at this
// time scale is refused before it runs (refusal != ""). The offset is
// recorded unscaled, like every catalogue offset, so the repro line replays
// it exactly.
func (cr *caseRun) placeFault(ctx context.Context, budget time.Duration) (refusal string, err error) {
	ow, err := cr.measureWindow(ctx, budget)
	if err != nil {
		return "", err
	}
	if !cr.c.HasFrac {
		if ow, err = cr.confirmShort(ctx, budget, ow); err != nil {
			return "", err
		}
	}
	cr.win = &ow
	scale := cr.r.opts.Scale
	var off time.Duration // scaled
	switch {
	case cr.c.HasFrac:
		span, note := cr.r.narrowestSpan(cr.s, ow)
		ow.Source += note
		off = time.Duration(ow.StartNs + int64(cr.c.Frac*float64(span)))
		cr.c.Offset, cr.c.HasOff = (time.Duration(float64(off) / scale)).Round(time.Microsecond), true
		cr.rc.OffsetMs = float64(cr.c.Offset) / float64(time.Millisecond)
		cr.rc.Trigger = cr.r.triggerString(cr.c, 0)
		cr.rc.Repro = cr.r.repro(cr.c, cr.bugs)
	default:
		off = cr.scaledOffset()
	}
	cr.rc.Window = &reports.WindowMargin{Open: ow.W[0], Close: ow.W[1], StartMs: nsMs(ow.StartNs), EndMs: nsMs(ow.EndNs),
		SpreadMs: nsMs(ow.SpreadNs), Source: ow.Source, PlannedMs: nsMs(int64(off))}
	note := fmt.Sprintf("window %s → %s: %s..%s after the trigger (%s); fault planned at %s (--offset %s at scale %g)\n",
		ow.W[0], ow.W[1], ms(ow.StartNs), ms(ow.EndNs), ow.Source, ms(int64(off)), injector.FormatOffset(cr.c.Offset), scale)
	if werr := os.WriteFile(filepath.Join(cr.st.CaseDir, "window.txt"), []byte(note), 0o644); werr != nil {
		return "", harnessErr(fmt.Errorf("window.txt: %w", werr))
	}
	if cr.c.HasFrac {
		return "", nil
	}
	// A fixed field offset keeps its value. It must lie in the first
	// maxPlace of the window (the headroom the coarse sweeps keep: this run
	// may be faster than the fastest calibration) and clear the end by
	// minGuard; after a start edge that is not the trigger's own hit it
	// must clear the start by that edge's spread and minGuard.
	lo, hi := cr.fixedBounds(ow)
	if off < lo || off > hi {
		return fmt.Sprintf("window too short at time scale %g: the fault at %s after %s (offset %s) must lie in %s → %s, measured %s..%s after it on this stack, so within %s..%s; run at a larger --time-scale",
			scale, ms(int64(off)), cr.s.Faults[0].Trigger, injector.FormatOffset(cr.c.Offset), ow.W[0], ow.W[1],
			ms(ow.StartNs), ms(ow.EndNs), ms(int64(lo)), ms(int64(hi))), nil
	}
	return "", nil
}

// narrowestSpan is the span a fraction is placed in: the narrower of the
// case's own calibration and the narrowest one any earlier case of this run
// measured for the same operation window. On a loaded machine both of a
// case's calibrations can come out stretched (a run came out at 27-46% of
// them under load average 20-30), and a fraction of a stretched window lands
// after the end; the run's narrowest reading is the floor.
func (r *Runner) narrowestSpan(s *scenarios.Scenario, ow opWindow) (int64, string) {
	f := s.Faults[0]
	key := s.Op + "|" + f.Trigger + "|" + ow.W[0] + "|" + ow.W[1]
	own := ow.EndNs - ow.StartNs
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.narrowest == nil {
		r.narrowest = map[string]int64{}
	}
	prev, ok := r.narrowest[key]
	if !ok || own < prev {
		r.narrowest[key] = own
	}
	if ok && prev < own {
		return prev, fmt.Sprintf("; placed in the narrowest span this run measured for it, %s (this case's: %s)", ms(prev), ms(own))
	}
	return own, ""
}

// fixedBounds is where the case's fixed offset may lie in window ow (see
// placeFault).
func (cr *caseRun) fixedBounds(ow opWindow) (lo, hi time.Duration) {
	lo, hi = ow.fixedRange(cmp.Or(cr.s.MaxPlace, maxPlace))
	if !slices.Contains(cr.s.Offsets, cr.c.Offset) {
		// an offset given by hand (a repro of a resolved fraction):
		// replayed as asked, as long as it lies inside the window
		hi = time.Duration(ow.EndNs) - minGuard
	}
	return lo, hi
}

// scaledOffset is the case's offset as the run places it: scaled, to the
// microsecond.
func (cr *caseRun) scaledOffset() time.Duration {
	return cr.r.scale(cr.c.Offset).Round(time.Microsecond)
}

// confirmShort measures a fixed offset's window once more, on a fresh
// calibration VM, when its one reading leaves the offset outside where it
// may lie, and keeps the wider reading: one short run must not refuse the
// case (s001-h-delete-restart-144ms's delete measures 11.0–16 ms; one
// reading of 11.9 ms refused its 7.2 ms at the default 60 %). A fault
// placed after the end of a faster run still shows as not landed.
func (cr *caseRun) confirmShort(ctx context.Context, budget time.Duration, ow opWindow) (opWindow, error) {
	off := cr.scaledOffset()
	if lo, hi := cr.fixedBounds(ow); off >= lo && off <= hi {
		return ow, nil
	}
	again, err := cr.measureVia()(ctx, budget, []string{fmt.Sprintf("%s-%d", calibVM, len(cr.calibVMs()))}, false)
	if err != nil {
		return ow, err
	}
	if again.EndNs-again.StartNs <= ow.EndNs-ow.StartNs {
		ow.Source += fmt.Sprintf("; a second run measured %s..%s, no wider", ms(again.StartNs), ms(again.EndNs))
		return ow, nil
	}
	again.Source = ow.Source + fmt.Sprintf("; too short for the offset: a second run measured %s..%s, the wider one counts", ms(again.StartNs), ms(again.EndNs))
	return again, nil
}

// fixedRange is where a fixed offset may lie in the window: in its first
// place (a fraction: maxPlace unless the scenario says; see placeFault).
func (ow opWindow) fixedRange(place float64) (lo, hi time.Duration) {
	lo = time.Duration(ow.StartNs)
	if ow.StartNs > 0 {
		lo += max(time.Duration(ow.StartSpreadNs), minGuard)
	}
	hi = min(time.Duration(ow.StartNs)+time.Duration(place*float64(ow.EndNs-ow.StartNs)), time.Duration(ow.EndNs)-minGuard)
	return lo, hi
}

// margin fills the case's window margin from the injection of the first
// fault: its time after the trigger's hit (requested − scaled offset), the
// start edge as this run hit it, the end edge as this run hit it before the
// fault or else as measured.
func (cr *caseRun) margin(in reports.Injection) {
	w := cr.rc.Window
	if w == nil || cr.win == nil || in.ActualNs == 0 || in.RequestedNs == 0 {
		return
	}
	// the offset exactly as the trigger carried it (µs-rounded, see
	// triggerString): a trigger time 0.2µs late would miss its own hit
	trig := in.RequestedNs - int64(cr.scaledOffset())
	startM, endM, observed := marginOf(cr.st.Trace.Sorted(), *cr.win, trig, in.ActualNs)
	w.Fired, w.FaultMs = true, nsMs(in.ActualNs-trig)
	w.MarginStartMs, w.MarginEndMs, w.EndObserved = nsMs(startM), nsMs(endM), observed
}

// marginOf is a fault's distance to its window's edges on the axis of its
// trigger's hit at trigNs: to the start this run hit (else the measured
// one), and to the end this run hit before the fault (observed) or else the
// measured end. Negative: outside.
func marginOf(evs []failpoint.Event, ow opWindow, trigNs, faultNs int64) (start, end int64, observed bool) {
	fault := faultNs - trigNs
	startRel, endRel := ow.StartNs, ow.EndNs
	openNs := int64(-1)
	for _, e := range evs {
		if e.TsNs < trigNs {
			continue
		}
		if openNs < 0 && e.Point == ow.W[0] {
			openNs = e.TsNs
			if e.TsNs <= faultNs {
				startRel = e.TsNs - trigNs
			}
			continue
		}
		if openNs >= 0 && e.Point == ow.W[1] && e.TsNs > openNs {
			if e.TsNs <= faultNs {
				endRel, observed = e.TsNs-trigNs, true
			}
			break
		}
	}
	return fault - startRel, endRel - fault, observed
}

func nsMs(ns int64) float64 { return float64(ns) / 1e6 }

func ms(ns int64) string { return fmt.Sprintf("%.1fms", float64(ns)/1e6) }

// noWindow judges a calibration run whose trace has no window: the phase it
// lacks is named, and the stack is judged at once (stall.go): off its goal
// is the product's fail; at its goal the operation took another path and
// the fault cannot be placed, nothing proven either way.
func (cr *caseRun) noWindow(ctx context.Context, vm string, t injector.Trigger, w [2]string, fromNs int64) error {
	missing := spanMissing(cr.st.Trace.Sorted(), t, w, fromNs)
	if ev := cr.goalEvidence(ctx); len(ev) > 0 {
		return productErr(OperationProgressed, fmt.Errorf("calibration %s: the operation never reached %s and the stack is off its goal: %s",
			vm, missing, strings.Join(ev, "; ")))
	}
	return landingErr(fmt.Errorf("calibration %s: no %s → %s after %s in the trace (%s never came; every goal reached)", vm, w[0], w[1], t.Point, missing))
}

// spanMissing names the first point of a calibration span (spanEdges)
// that never came after fromNs: the trigger's, the window's open or close.
func spanMissing(evs []failpoint.Event, t injector.Trigger, w [2]string, fromNs int64) string {
	switch trig, open, _ := spanEdges(evs, t, w, fromNs); {
	case trig < 0:
		return "the trigger " + t.String()
	case open < 0:
		return w[0]
	}
	return w[1]
}
