package reports

import (
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"
)

// ScheduleVersion is the version of the schedule written to results.json.
const ScheduleVersion = 1

// Schedule is a run's plan as results.json records it (issue #36 item 3,
// docs/architecture.md §12):
// every case in the order the run selected it, when each started relative
// to the others, its offset and park points, the seeds and the fault plan
// as the runner arms it. `vmchaos run --replay results.json` runs exactly
// this again; --check-determinism compares two of them.
type Schedule struct {
	Version   int      `json:"version"`
	Backend   string   `json:"backend"`
	TimeScale float64  `json:"time_scale"`
	Seed      int64    `json:"seed"`
	Regress   []string `json:"regress,omitempty"`
	Filter    string   `json:"label_filter,omitempty"`
	Shard     string   `json:"shard,omitempty"`
	// Workers is the number of shared cases run at once (1: sequential,
	// in catalogue order, through Ginkgo).
	Workers int            `json:"workers"`
	Repeat  int            `json:"repeat,omitempty"`
	Lazyfs  bool           `json:"lazyfs,omitempty"`
	Cases   []ScheduleCase `json:"cases"`
}

// ScheduleCase is one case of a schedule.
type ScheduleCase struct {
	ID       string `json:"id"`
	Scenario string `json:"scenario"`
	// Start is the case's place in the run's start order (0 first): the
	// catalogue order for a sequential run; the scheduler's (every alone
	// case in catalogue order, then the shared ones in the run's order,
	// suite.Order) otherwise. AfterLane: a shared case held until the
	// last alone case's timed part was over (a long one, suite.ByTimes).
	Start     int     `json:"start"`
	AfterLane bool    `json:"after_lane,omitempty"`
	Class     string  `json:"class"`
	OffsetNs  int64   `json:"offset_ns,omitempty"` // real-time offset (the runner scales it)
	HasOff    bool    `json:"has_offset,omitempty"`
	Frac      float64 `json:"frac,omitempty"` // a fraction of the window measured on the case's stack
	HasFrac   bool    `json:"has_frac,omitempty"`
	// Seed is what the case's stack is seeded with (fakech's timing
	// jitter).
	Seed int64 `json:"seed"`
	// Failpoints is the scenario's own VMCHAOS_FAILPOINTS actions.
	Failpoints string         `json:"failpoints,omitempty"`
	Faults     []PlannedFault `json:"faults"`
}

// PlannedFault is one fault of a case as the runner arms it.
type PlannedFault struct {
	Kind string `json:"kind"`
	Unit string `json:"unit,omitempty"`
	// Trigger is the trigger as armed: with the case's scaled offset.
	Trigger string `json:"trigger"`
	// Park is the point the process is held at, for a park trigger.
	Park              string    `json:"park,omitempty"`
	VM                string    `json:"vm,omitempty"`
	Child             string    `json:"child,omitempty"`
	Window            [2]string `json:"window,omitempty"`
	ReleaseAfter      string    `json:"release_after,omitempty"`
	ReleaseAfterChild string    `json:"release_after_child,omitempty"`
	StopForNs         int64     `json:"stop_for_ns,omitempty"`
}

// DiffSchedules lists every difference between two schedules, one line
// each (none: equal). a is the recorded one, b the one compared to it.
func DiffSchedules(a, b *Schedule) []string {
	if a == nil || b == nil {
		if a == b {
			return nil
		}
		return []string{fmt.Sprintf("schedule: one side has none (%v vs %v)", a != nil, b != nil)}
	}
	var out []string
	head := func(name string, x, y any) {
		if !reflect.DeepEqual(x, y) {
			out = append(out, fmt.Sprintf("%s: %v → %v", name, x, y))
		}
	}
	head("version", a.Version, b.Version)
	head("backend", a.Backend, b.Backend)
	head("time_scale", a.TimeScale, b.TimeScale)
	head("seed", a.Seed, b.Seed)
	head("regress", strings.Join(a.Regress, ","), strings.Join(b.Regress, ","))
	head("workers", a.Workers, b.Workers)
	head("repeat", a.Repeat, b.Repeat)
	head("lazyfs", a.Lazyfs, b.Lazyfs)
	if len(a.Cases) != len(b.Cases) {
		out = append(out, fmt.Sprintf("cases: %d → %d", len(a.Cases), len(b.Cases)))
	}
	for i := 0; i < min(len(a.Cases), len(b.Cases)); i++ {
		out = append(out, diffScheduleCase(i, a.Cases[i], b.Cases[i])...)
	}
	return out
}

// diffScheduleCase compares the i-th case of two schedules field by field.
func diffScheduleCase(i int, x, y ScheduleCase) []string {
	var out []string
	f := func(name string, p, q any) {
		if !reflect.DeepEqual(p, q) {
			out = append(out, fmt.Sprintf("case %d (%s) %s: %v → %v", i, x.ID, name, p, q))
		}
	}
	f("id", x.ID, y.ID)
	f("scenario", x.Scenario, y.Scenario)
	f("start", x.Start, y.Start)
	f("after_lane", x.AfterLane, y.AfterLane)
	f("class", x.Class, y.Class)
	f("offset_ns", x.OffsetNs, y.OffsetNs)
	f("has_offset", x.HasOff, y.HasOff)
	f("frac", x.Frac, y.Frac)
	f("has_frac", x.HasFrac, y.HasFrac)
	f("seed", x.Seed, y.Seed)
	f("failpoints", x.Failpoints, y.Failpoints)
	if len(x.Faults) != len(y.Faults) {
		out = append(out, fmt.Sprintf("case %d (%s) faults: %d → %d", i, x.ID, len(x.Faults), len(y.Faults)))
	}
	for k := 0; k < min(len(x.Faults), len(y.Faults)); k++ {
		p, q := reflect.ValueOf(x.Faults[k]), reflect.ValueOf(y.Faults[k])
		for n := 0; n < p.NumField(); n++ {
			if !reflect.DeepEqual(p.Field(n).Interface(), q.Field(n).Interface()) {
				out = append(out, fmt.Sprintf("case %d (%s) fault %d %s: %v → %v", i, x.ID, k,
					p.Type().Field(n).Name, p.Field(n).Interface(), q.Field(n).Interface()))
			}
		}
	}
	return out
}

// Decision is one of the harness's own decisions in a case, as its
// injection records show it: what it armed (fault, trigger, the phase it
// meant to hit) and, for a fault that fired off a trigger hit, when it was
// set to fire relative to that hit (RequestedNs − TriggerNs: the offset
// the harness chose). Where the fault landed is the product's doing and
// not part of it.
type Decision struct {
	Fault    string `json:"fault"`
	Trigger  string `json:"trigger"`
	Intended string `json:"intended_phase"`
	DelayNs  *int64 `json:"delay_ns,omitempty"`
}

func (d Decision) String() string {
	s := fmt.Sprintf("%s on %q (intended %q)", d.Fault, d.Trigger, orDefault(d.Intended, "-"))
	if d.DelayNs != nil {
		s += fmt.Sprintf(" set to fire %dns after its trigger hit", *d.DelayNs)
	}
	return s
}

// productIDs matches the ids the product makes up per run (a VM id in a
// sigkill-vmm fault's text): they differ between runs of one schedule
// without the harness deciding anything differently.
var productIDs = regexp.MustCompile(`\bvm=[A-Za-z0-9]{16,}\b`)

// Decisions lists the harness's decisions in c in a stable order. frac
// cases resolve their offset from the window measured on each run's own
// stack, so their delay and the offset in their trigger are measurements,
// not decisions: they are left out.
func Decisions(c Case, frac bool) []Decision {
	var out []Decision
	for _, in := range c.Injections {
		d := Decision{Fault: productIDs.ReplaceAllString(in.Fault, "vm=<id>"), Trigger: in.Trigger, Intended: in.IntendedPhase}
		if frac {
			d.Trigger = offsetPart.ReplaceAllString(d.Trigger, " + <measured>")
		} else if in.TriggerNs > 0 && in.RequestedNs > 0 && !in.InVictim {
			delay := in.RequestedNs - in.TriggerNs
			d.DelayNs = &delay
		}
		out = append(out, d)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

var offsetPart = regexp.MustCompile(`\s*\+\s*[-0-9.]+[a-zµ]+$`)

// DiffDecisions lists how the decisions of two runs of one case differ.
func DiffDecisions(a, b []Decision) []string {
	var out []string
	if len(a) != len(b) {
		out = append(out, fmt.Sprintf("armed %d fault(s) in run 1, %d in run 2", len(a), len(b)))
	}
	for i := 0; i < min(len(a), len(b)); i++ {
		if a[i].String() != b[i].String() {
			out = append(out, fmt.Sprintf("run 1: %s; run 2: %s", a[i], b[i]))
		}
	}
	return out
}

// Determinism is what `vmchaos run --check-determinism` found: every case
// run twice, the two schedules and each case's decisions compared. Any
// difference is a harness defect (gate exit 3). Outcomes that differed
// (verdict, failed invariants) are listed too, as the product's or the
// timing's doing: they are not harness defects.
type Determinism struct {
	Cases     int      `json:"cases"`
	Schedule  []string `json:"schedule_differences,omitempty"`
	Decisions []string `json:"decision_differences,omitempty"`
	Outcomes  []string `json:"outcome_differences,omitempty"`
	SecondRun string   `json:"second_run"` // the run dir of the second pass
}

// Defects counts the harness defects found.
func (d *Determinism) Defects() int { return len(d.Schedule) + len(d.Decisions) }

// CompareRuns compares the two passes of a --check-determinism run: their
// schedules, then each case's decisions and outcome (cases matched by id;
// frac says which cases resolve their offset from a measured window).
func CompareRuns(s1, s2 *Schedule, run1, run2 []Case, frac map[string]bool) *Determinism {
	d := &Determinism{Cases: len(run1), Schedule: DiffSchedules(s1, s2)}
	byID := make(map[string]Case, len(run2))
	for _, c := range run2 {
		byID[c.ID] = c
	}
	for _, c := range run1 {
		c2, ok := byID[c.ID]
		if !ok {
			d.Decisions = append(d.Decisions, fmt.Sprintf("%s: ran in pass 1 only", c.ID))
			continue
		}
		for _, l := range DiffDecisions(Decisions(c, frac[c.ID]), Decisions(c2, frac[c.ID])) {
			d.Decisions = append(d.Decisions, c.ID+": "+l)
		}
		if o1, o2 := Outcome(c), Outcome(c2); o1 != o2 {
			d.Outcomes = append(d.Outcomes, fmt.Sprintf("%s: %s in pass 1, %s in pass 2", c.ID, o1, o2))
		}
	}
	return d
}

// String is the determinism report, one line per difference.
func (d *Determinism) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "determinism: %d case(s) run twice: %d schedule difference(s), %d decision difference(s) (harness defects), %d outcome difference(s)\n",
		d.Cases, len(d.Schedule), len(d.Decisions), len(d.Outcomes))
	for _, l := range d.Schedule {
		fmt.Fprintln(&b, "  HARNESS DEFECT schedule", l)
	}
	for _, l := range d.Decisions {
		fmt.Fprintln(&b, "  HARNESS DEFECT decision", l)
	}
	for _, l := range d.Outcomes {
		fmt.Fprintln(&b, "  outcome (not a harness defect)", l)
	}
	return b.String()
}
