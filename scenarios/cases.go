package scenarios

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2/types"
	"github.com/vmchaos/vmchaos/injector"
)

// Case is one scenario at one offset: the unit the runner executes and the
// reports count.
type Case struct {
	ID       string // scenario id, plus "@OFFSET" when the scenario has offsets
	Scenario *Scenario
	Offset   time.Duration // real-time offset (scaled by the runner)
	HasOff   bool
	// Frac (with HasFrac) is a fine-sweep offset as a fraction of the
	// operation's window (the first fault's Window). The runner measures
	// the window on the case's stack and resolves it into Offset/HasOff
	// before arming; the id keeps the fraction so it is the same in every
	// run.
	Frac    float64
	HasFrac bool
	Speed   string
	Labels  []string
}

// caseID is the id of a scenario at an offset.
func caseID(s *Scenario, off time.Duration, hasOff bool) string {
	if !hasOff {
		return s.ID
	}
	return s.ID + "@" + injector.FormatOffset(off)
}

// fracCaseID is the id of a scenario at a fraction of its window.
func fracCaseID(s *Scenario, frac float64) string {
	return s.ID + "@" + FormatFrac(frac)
}

// FormatFrac prints a window fraction as a percentage ("35%", "2.5%").
func FormatFrac(f float64) string {
	return strconv.FormatFloat(math.Round(f*1e6)/1e4, 'f', -1, 64) + "%"
}

// ParseFracSweep expands a fraction sweep "FROM%..TO%/STEP%" (both ends
// inclusive when STEP divides the range) or a comma list "5%,50%" into
// fractions of the window in [0, 1].
func ParseFracSweep(spec string) ([]float64, error) {
	spec = strings.TrimSpace(spec)
	pct := func(x string) (float64, error) {
		x = strings.TrimSpace(x)
		n, ok := strings.CutSuffix(x, "%")
		if !ok {
			return 0, fmt.Errorf("fraction sweep %q: %q is not a percentage", spec, x)
		}
		v, err := strconv.ParseFloat(n, 64)
		if err != nil || math.IsNaN(v) || v < 0 || v > 100 {
			return 0, fmt.Errorf("fraction sweep %q: %q: want 0%%..100%%", spec, x)
		}
		return v, nil
	}
	var out []float64
	if from, rest, ok := strings.Cut(spec, ".."); ok {
		to, step, ok := strings.Cut(rest, "/")
		if !ok {
			return nil, fmt.Errorf("fraction sweep %q: want FROM%%..TO%%/STEP%%", spec)
		}
		a, err := pct(from)
		if err != nil {
			return nil, err
		}
		b, err := pct(to)
		if err != nil {
			return nil, err
		}
		st, err := pct(step)
		if err != nil {
			return nil, err
		}
		if st <= 0 || b < a {
			return nil, fmt.Errorf("fraction sweep %q: want STEP > 0 and TO >= FROM", spec)
		}
		// integer steps so 0.1-style steps do not drift past TO
		for i := 0; ; i++ {
			v := a + float64(i)*st
			if v > b+1e-9 {
				break
			}
			out = append(out, math.Round(v*1e4)/1e6)
		}
		return out, nil
	}
	for _, x := range strings.Split(spec, ",") {
		v, err := pct(x)
		if err != nil {
			return nil, err
		}
		out = append(out, math.Round(v*1e4)/1e6)
	}
	return out, nil
}

// IsFracSweep reports whether a sweep spec is in fractions of the window.
func IsFracSweep(spec string) bool { return strings.Contains(spec, "%") }

// Labels returns the scenario's labels for one speed.
func (s *Scenario) labelsFor(speed, backend string) []string {
	l := []string{"backend:" + backend, "op:" + s.Op, "speed:" + speed}
	seen := map[string]bool{}
	for _, f := range s.Faults {
		if f.Kind != "" && !seen[f.Kind] {
			seen[f.Kind] = true
			l = append(l, "fault:"+f.Kind)
		}
	}
	if len(s.SeedRef) >= 3 && s.SeedRef[0] >= '0' && s.SeedRef[0] <= '9' {
		l = append(l, "seed:"+s.SeedRef[:3])
	}
	if strings.HasPrefix(s.ID, "sweep-") {
		l = append(l, "sweep")
	}
	return append(l, s.Labels...)
}

// Expand turns the catalogue into cases for one backend: a scenario with
// fixed offsets gives one case per offset; a sweep gives its coarse offsets as
// speed:fast cases and its fine offsets (those not already coarse) as
// speed:slow cases.
func Expand(backend string) ([]Case, error) {
	var out []Case
	for i := range Catalogue {
		s := &Catalogue[i]
		if !contains(s.BackendList(), backend) {
			continue
		}
		add := func(off time.Duration, hasOff bool, speed string) {
			out = append(out, Case{ID: caseID(s, off, hasOff), Scenario: s, Offset: off, HasOff: hasOff,
				Speed: speed, Labels: s.labelsFor(speed, backend)})
		}
		switch {
		case s.Sweep != "" || s.FineSweep != "":
			addFrac := func(f float64, speed string) {
				out = append(out, Case{ID: fracCaseID(s, f), Scenario: s, Frac: f, HasFrac: true,
					Speed: speed, Labels: s.labelsFor(speed, backend)})
			}
			// Coarse sweeps in fractions of the window measured on each
			// case's stack stay inside the window however fast the machine
			// runs the operation (issue #19: absolute ones sat on its edge).
			doneFrac := map[float64]bool{}
			var coarse []time.Duration
			if IsFracSweep(s.Sweep) {
				fracs, err := ParseFracSweep(s.Sweep)
				if err != nil {
					return nil, fmt.Errorf("scenario %s: sweep: %w", s.ID, err)
				}
				speed := "fast"
				if s.Speed != "" {
					speed = s.Speed // a field case placed by a fraction
				}
				for _, f := range fracs {
					doneFrac[f] = true
					addFrac(f, speed)
				}
			} else if s.Sweep != "" {
				var err error
				if coarse, err = injector.ParseSweep(s.Sweep); err != nil {
					return nil, fmt.Errorf("scenario %s: sweep: %w", s.ID, err)
				}
			}
			done := map[time.Duration]bool{}
			for _, o := range coarse {
				done[o] = true
				add(o, true, "fast")
			}
			if IsFracSweep(s.FineSweep) {
				fracs, err := ParseFracSweep(s.FineSweep)
				if err != nil {
					return nil, fmt.Errorf("scenario %s: fine sweep: %w", s.ID, err)
				}
				for _, f := range fracs {
					if !doneFrac[f] {
						addFrac(f, "slow")
					}
				}
				continue
			}
			if s.FineSweep == "" {
				continue
			}
			fine, err := injector.ParseSweep(s.FineSweep)
			if err != nil {
				return nil, fmt.Errorf("scenario %s: fine sweep: %w", s.ID, err)
			}
			for _, o := range fine {
				if !done[o] {
					add(o, true, "slow")
				}
			}
		case len(s.Offsets) > 0:
			for _, o := range s.Offsets {
				add(o, true, s.Speed)
			}
		default:
			add(0, false, s.Speed)
		}
	}
	return out, nil
}

// CaseFor builds the case of one scenario at one offset (repro, sweep,
// bisect): an offset is only meaningful for scenarios whose first trigger
// takes one.
func CaseFor(id string, off time.Duration, hasOff bool, backend string) (Case, error) {
	s, ok := Lookup(id)
	if !ok {
		return Case{}, fmt.Errorf("unknown scenario %q (see `vmchaos run --list`)", id)
	}
	if hasOff && !s.TakesOffset() {
		return Case{}, fmt.Errorf("scenario %s: its trigger %q takes no offset", id, s.Faults[0].Trigger)
	}
	speed := s.Speed
	if speed == "" {
		speed = "slow"
	}
	if !hasOff && len(s.Offsets) > 0 {
		hasOff, off = true, s.Offsets[0]
	}
	if !hasOff && IsFracSweep(s.Sweep) {
		// a sweep in fractions: its first coarse fraction
		if fracs, err := ParseFracSweep(s.Sweep); err == nil && len(fracs) > 0 {
			return CaseForFrac(id, fracs[0], backend)
		}
	}
	if !hasOff && s.Sweep != "" && !IsFracSweep(s.Sweep) {
		if offs, err := injector.ParseSweep(s.Sweep); err == nil && len(offs) > 0 {
			hasOff, off = true, offs[0]
		}
	}
	return Case{ID: caseID(s, off, hasOff), Scenario: s, Offset: off, HasOff: hasOff, Speed: speed,
		Labels: s.labelsFor(speed, backend)}, nil
}

// CaseForFrac builds the case of one scenario at a fraction of its first
// fault's window (repro/sweep with "35%"): the runner resolves it into an
// absolute offset on the case's stack, as in `vmchaos run`.
func CaseForFrac(id string, frac float64, backend string) (Case, error) {
	s, ok := Lookup(id)
	if !ok {
		return Case{}, fmt.Errorf("unknown scenario %q (see `vmchaos run --list`)", id)
	}
	if !s.TakesOffset() || s.Faults[0].Window[0] == "" || s.Faults[0].Window[1] == "" {
		return Case{}, fmt.Errorf("scenario %s: a fraction offset needs a trigger that takes an offset and a window with both ends", id)
	}
	if frac < 0 || frac > 1 {
		return Case{}, fmt.Errorf("scenario %s: fraction %v outside 0%%..100%%", id, frac)
	}
	return Case{ID: fracCaseID(s, frac), Scenario: s, Frac: frac, HasFrac: true, Speed: "slow",
		Labels: s.labelsFor("slow", backend)}, nil
}

// TakesOffset reports whether the first fault's trigger takes an offset.
func (s *Scenario) TakesOffset() bool {
	if len(s.Faults) == 0 {
		return false
	}
	t := s.Faults[0].Trigger
	return t == "now" || strings.HasPrefix(t, "at ") || strings.HasPrefix(t, "after-exit ")
}

// Filter keeps the cases whose labels match a Ginkgo label-filter expression
// (same semantics as `ginkgo --label-filter`).
func Filter(cases []Case, expr string) ([]Case, error) {
	if strings.TrimSpace(expr) == "" {
		return cases, nil
	}
	match, err := types.ParseLabelFilter(expr)
	if err != nil {
		return nil, fmt.Errorf("label filter %q: %w", expr, err)
	}
	var out []Case
	for _, c := range cases {
		if match(c.Labels) {
			out = append(out, c)
		}
	}
	return out, nil
}

// Validate checks the catalogue: unique ids, parseable triggers and sweeps,
// known fault kinds and step kinds, targets naming real bugs.
func Validate(bugNames []string) error {
	ids := map[string]bool{}
	var errs []string
	known := map[string]bool{}
	for _, b := range bugNames {
		known[b] = true
	}
	for _, s := range Catalogue {
		if ids[s.ID] {
			errs = append(errs, "duplicate id "+s.ID)
		}
		ids[s.ID] = true
		if s.Op == "" || s.Title == "" {
			errs = append(errs, s.ID+": missing op or title")
		}
		if len(s.Faults) == 0 {
			errs = append(errs, s.ID+": no fault")
		}
		for i, f := range s.Faults {
			if !FaultKinds[f.Kind] {
				errs = append(errs, fmt.Sprintf("%s: unknown fault kind %q", s.ID, f.Kind))
			}
			// every fault has a closed window (issue #12): a window with
			// no end would count any landing as landed
			timed := strings.HasPrefix(f.Trigger, "at ") || strings.HasPrefix(f.Trigger, "after-exit ") || f.Kind == "failpoint"
			if timed && f.Kind != "none" && (f.Window[0] == "" || f.Window[1] == "") {
				errs = append(errs, fmt.Sprintf("%s: fault %s %q needs a closed window (both ends)", s.ID, f.Kind, f.Trigger))
			}
			if f.Node != "" && (s.Env.Nodes < 2 || !strings.HasPrefix(f.Trigger, "park ")) {
				errs = append(errs, fmt.Sprintf("%s: fault %s on node %q needs a cluster (Env.Nodes >= 2) and a park trigger", s.ID, f.Kind, f.Node))
			}
			if f.Trigger == TriggerWhileDown && i == 0 {
				errs = append(errs, s.ID+": "+TriggerWhileDown+" needs a first fault that takes the agent down")
			}
			if f.Trigger != "" && f.Trigger != "now" && f.Trigger != TriggerWhileDown {
				trig := f.Trigger
				if !strings.HasPrefix(trig, "park ") {
					trig += " + 0ms"
				}
				if _, err := injector.ParseTrigger(trig); err != nil {
					errs = append(errs, fmt.Sprintf("%s: %v", s.ID, err))
				}
			}
		}
		for _, st := range append(append(append(append([]Step{}, s.Setup...), s.Act...), s.WhileStopped...), s.After...) {
			if !StepKinds[st.Kind] {
				errs = append(errs, fmt.Sprintf("%s: unknown step kind %q", s.ID, st.Kind))
			}
		}
		if IsFracSweep(s.Sweep) || IsFracSweep(s.FineSweep) {
			for _, sw := range []string{s.Sweep, s.FineSweep} {
				if IsFracSweep(sw) {
					if _, err := ParseFracSweep(sw); err != nil {
						errs = append(errs, fmt.Sprintf("%s: %v", s.ID, err))
					}
				}
			}
			if len(s.Faults) > 0 && (s.Faults[0].Window[0] == "" || s.Faults[0].Window[1] == "") {
				errs = append(errs, s.ID+": a fraction sweep needs the first fault's window (both ends)")
			}
		}
		if s.Env.NetMode != "" && s.Env.NetMode != NetModeTap {
			errs = append(errs, fmt.Sprintf("%s: net mode %q: want %q or none", s.ID, s.Env.NetMode, NetModeTap))
		}
		for _, t := range s.Targets {
			if !known[t] {
				errs = append(errs, fmt.Sprintf("%s: target %q is not a regress bug", s.ID, t))
			}
		}
		if s.Sweep == "" && s.FineSweep == "" && s.Speed != "fast" && s.Speed != "slow" && s.Speed != "nightly" {
			errs = append(errs, s.ID+": speed must be fast, slow or nightly")
		}
	}
	sort.Strings(errs)
	if len(errs) > 0 {
		return fmt.Errorf("catalogue: %s", strings.Join(errs, "; "))
	}
	return nil
}

// FaultKinds are the fault kinds a scenario may use: every kind of the
// injector's one list (injector.FaultKinds, power-cut included) but
// sigkill-hitter, which a scenario asks for as "sigkill-direct" (SIGKILL of
// a vmctl process the harness started itself: the runner vouches for it);
// plus "failpoint" (a VMCHAOS_FAILPOINTS action is the fault) and "none"
// (the scenario only checks a path, e.g. a clean wake).
var FaultKinds = scenarioFaultKinds()

func scenarioFaultKinds() map[string]bool {
	kinds := map[string]bool{"failpoint": true, FaultSigkillDirect: true, "none": true}
	for _, k := range injector.FaultKinds {
		if k.Name() != injector.FaultSigkillHitter {
			kinds[k.Name()] = true
		}
	}
	return kinds
}

// FaultSigkillDirect is the scenario's name of injector.FaultSigkillHitter.
const FaultSigkillDirect = "sigkill-direct"

// StepKinds are the step kinds the runner implements.
var StepKinds = map[string]bool{StepCreate: true, StepHibernate: true, StepWake: true, StepDelete: true,
	StepLedgerWrite: true, StepDirectClone: true, StepReconcile: true, StepKillVMM: true,
	StepWipeStatus: true, StepCounterClaim: true, StepDirectSave: true, StepHoldLease: true, StepOrphanPause: true, StepDirectVmctl: true,
	StepRestartAgent: true}

// StartupPoints are the agent's startup points: an agent armed with a rule
// there hits it as it starts, before the case's operation; a case with a
// StepRestartAgent arms them in that restart only.
var StartupPoints = map[string]bool{"agent.started": true, "agent.startup.reconciled": true}

// RestartsAgent reports a scenario whose act restarts the agent.
func RestartsAgent(s *Scenario) bool {
	for _, st := range s.Act {
		if st.Kind == StepRestartAgent {
			return true
		}
	}
	return false
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// ExpandedCase is the case with that id among Expand(backend)'s.
func ExpandedCase(backend, id string) (Case, error) {
	all, err := Expand(backend)
	if err != nil {
		return Case{}, err
	}
	for _, c := range all {
		if c.ID == id {
			return c, nil
		}
	}
	return Case{}, fmt.Errorf("no case %s in the %s catalogue", id, backend)
}
