package reports

import (
	"fmt"
	"sort"
	"strings"
)

// CoverageVersion is the shape of results.json's `phase_coverage`. Version
// 1 (key `coverage`, pairs point × kind folded across operations) is not
// comparable: readers refuse it rather than show its figure as this one.
const CoverageVersion = 2

// Coverage is the phase-coverage map of a run (issue #31): every cell
// (operation context × failpoint × fault kind that applies there) of the
// denominator, with the cases whose fault landed in it. Cells this host
// cannot run stay in the denominator, marked with the preflight's reason.
type Coverage struct {
	Version     int      `json:"version"`
	Applicable  int      `json:"applicable"`             // cells of the denominator, not-runnable ones included
	Covered     int      `json:"covered"`                // cells some case's landed fault credits
	NotRunnable int      `json:"not_runnable,omitempty"` // cells this host cannot run (uncovered, still counted)
	Percent     float64  `json:"percent"`                // 100 × covered / applicable
	Kinds       []string `json:"kinds"`                  // columns, in table order
	Ops         []string `json:"ops"`                    // operation contexts, in table order
	// FallbackOps: a landing whose case's operation has no such cell is
	// credited to the first of FallbackOps[op], then of FallbackOps[""],
	// that has it (a hibernate's save, a harness-run verb, the agent's
	// restart); never to an unrelated agent operation.
	FallbackOps map[string][]string `json:"fallback_ops,omitempty"`
	// VictimProcs: the process each kind hits (its last phase before the
	// fault is where a timed fault landed); "" = the stack's last phase
	// (power cut) or the action's own point (failpoint actions).
	VictimProcs map[string]string `json:"victim_procs"`
	Cells       []CoverageCell    `json:"cells"`
	// Outside lists landings no cell holds ("case: op point × kind"): a
	// kind at a point the applies rule says it does not apply to.
	Outside []string       `json:"outside,omitempty"`
	Folded  []CoverageFold `json:"folded,omitempty"` // matrix cases not generated: a catalogue case reaches the same (phase, kind, goal)
}

// CoverageCell is one cell and the cases that landed in it.
type CoverageCell struct {
	Op          string   `json:"op"`
	Point       string   `json:"point"`
	Proc        string   `json:"proc"`
	Kind        string   `json:"kind"`
	CoveredBy   []string `json:"covered_by,omitempty"`
	NotRunnable string   `json:"not_runnable,omitempty"` // why this host cannot run it ("" = it can)
}

// CoverageFold says a matrix case was folded into a catalogue case.
type CoverageFold struct {
	Case string `json:"case"`
	Into string `json:"into"`
	Key  string `json:"key"` // phase × kind → goal
}

type cellKey struct{ Op, Point, Kind string }

// ComputeCoverage fills the map spec describes (its cells, columns,
// contexts, fallbacks and victims; CoveredBy ignored) from the run's cases.
func ComputeCoverage(spec *Coverage, cases []Case) *Coverage {
	cov := *spec
	cov.Version = CoverageVersion
	cov.Cells, cov.Outside = nil, nil
	cov.Covered, cov.NotRunnable = 0, 0
	idx := map[cellKey]int{}
	for _, c := range spec.Cells {
		c.CoveredBy = nil
		idx[cellKey{c.Op, c.Point, c.Kind}] = len(cov.Cells)
		cov.Cells = append(cov.Cells, c)
	}
	for _, c := range cases {
		point, ok := CreditedPoint(c, spec.VictimProcs)
		if !ok {
			continue
		}
		i, found := cov.lookup(idx, c.Operation, point, c.CoverageKind)
		if !found {
			cov.Outside = append(cov.Outside, fmt.Sprintf("%s: %s %s × %s", c.ID, c.Operation, point, c.CoverageKind))
			continue
		}
		cov.Cells[i].CoveredBy = append(cov.Cells[i].CoveredBy, c.ID)
	}
	for i := range cov.Cells {
		switch {
		case len(cov.Cells[i].CoveredBy) > 0:
			sort.Strings(cov.Cells[i].CoveredBy)
			cov.Covered++
		case cov.Cells[i].NotRunnable != "":
			cov.NotRunnable++
		}
	}
	cov.Applicable = len(cov.Cells)
	cov.Percent = 0
	if cov.Applicable > 0 {
		cov.Percent = 100 * float64(cov.Covered) / float64(cov.Applicable)
	}
	return &cov
}

// lookup finds the cell of (op, point, kind), falling back to FallbackOps.
func (c *Coverage) lookup(idx map[cellKey]int, op, point, kind string) (int, bool) {
	if i, ok := idx[cellKey{op, point, kind}]; ok {
		return i, true
	}
	for _, fb := range append(append([]string(nil), c.FallbackOps[op]...), c.FallbackOps[""]...) {
		if i, ok := idx[cellKey{fb, point, kind}]; ok {
			return i, true
		}
	}
	return 0, false
}

// CreditedPoint is the crediting rule: the point a case's fault landed at,
// for the process it hit. Nothing unless the case has a coverage kind and
// every injection landed. Then, by its first fault: a park credits the
// parked point; a failpoint action credits its own point (CoverageAt); a
// power cut credits the stack's last phase (every process was hit, that
// phase's among them); any other timed fault credits the last phase the
// victim process (victimPhase) reached at or before the fault. Never
// another process's phase.
func CreditedPoint(c Case, victims map[string]string) (string, bool) {
	if c.CoverageKind == "" || !allLanded(c) {
		return "", false
	}
	first := c.Injections[0]
	for _, in := range c.Injections[1:] {
		if in.ActualNs > 0 && (first.ActualNs == 0 || in.ActualNs < first.ActualNs) {
			first = in
		}
	}
	switch proc := victims[c.CoverageKind]; {
	case strings.HasPrefix(first.Trigger, "park "):
		return parkPoint(first.Trigger), true
	case strings.HasPrefix(c.CoverageKind, "failpoint-"):
		return c.CoverageAt, c.CoverageAt != ""
	case proc == "":
		return first.LastPhase, first.LastPhase != ""
	default:
		p := victimPhase(c.Timeline, first, proc, c.CoverageKind)
		return p, p != ""
	}
}

// parkPoint is the point of a "park POINT[#N][@vm=ID]" trigger.
func parkPoint(trigger string) string {
	p := strings.TrimPrefix(trigger, "park ")
	p, _, _ = strings.Cut(p, "@")
	p, _, _ = strings.Cut(p, "#")
	return strings.TrimSpace(p)
}

// victimPhase is the last phase the fault's victim reached at or before
// the fault. The victim is found, in order, by its host pid on the
// timeline (no pid namespace), by the trigger's hitter when that is the
// victim's process (its pid as emitted: the trigger point's last hit
// before the fault), else by the victim's process name (the vmctl
// daemon's phase is its pass: only the daemon's kind reads it, and only it).
func victimPhase(tl []TimelineEvent, in Injection, proc, kind string) string {
	match := func(e TimelineEvent) bool {
		return e.Proc == proc && (e.Point == "daemon.pass") == (kind == "sigkill-daemon")
	}
	if pid := victimPid(tl, in, proc); pid > 0 {
		match = func(e TimelineEvent) bool { return e.Pid == pid }
	}
	last := ""
	for _, e := range tl {
		if e.TsNs > in.ActualNs {
			continue
		}
		if (e.Kind != "phase" && e.Kind != "restart") || bookkeepingPoint(e.Point) {
			continue
		}
		if match(e) {
			last = e.Point
		}
	}
	return last
}

// victimPid is the victim's pid as the timeline has it (0: unknown).
func victimPid(tl []TimelineEvent, in Injection, proc string) int {
	if in.VictimPID > 0 {
		for _, e := range tl {
			if e.Pid == in.VictimPID && e.Point != "" {
				return e.Pid
			}
		}
	}
	at, ok := strings.CutPrefix(in.Trigger, "at ")
	if !ok {
		return 0
	}
	at, _, _ = strings.Cut(at, " ")
	at, _, _ = strings.Cut(at, "@")
	at, _, _ = strings.Cut(at, "#")
	pid := 0
	for _, e := range tl {
		if e.TsNs <= in.ActualNs && e.Point == at && e.Proc == proc && e.Pid > 0 {
			pid = e.Pid
		}
	}
	return pid
}

// bookkeepingPoint: emitted by the agent's other goroutines and the store
// whatever the operation does (runner/landing.go's bookkeeping): no phase a
// timed fault is credited to.
func bookkeepingPoint(p string) bool {
	return strings.HasPrefix(p, "agent.child.") || strings.HasPrefix(p, "store.commit.") || p == "failpoint.signal"
}

// allLanded: the case injected at least one fault and every one landed.
func allLanded(c Case) bool {
	if len(c.Injections) == 0 {
		return false
	}
	for _, in := range c.Injections {
		if !in.Landed {
			return false
		}
	}
	return true
}

// Recompute is the map over other cases (report merge: the shards' cells,
// the merged cases).
func (c *Coverage) Recompute(cases []Case) *Coverage {
	if c == nil {
		return nil
	}
	return ComputeCoverage(c, cases)
}

// String is the gate summary's line.
func (c *Coverage) String() string {
	s := fmt.Sprintf("phase coverage %.1f%% (%d of %d applicable operation × point × fault-kind cells landed", c.Percent, c.Covered, c.Applicable)
	if c.NotRunnable > 0 {
		s += fmt.Sprintf("; %d not runnable here", c.NotRunnable)
	}
	return s + ")"
}

// Missing lists the cells no case landed in (not-runnable ones included).
func (c *Coverage) Missing() []CoverageCell {
	var out []CoverageCell
	for _, p := range c.Cells {
		if len(p.CoveredBy) == 0 {
			out = append(out, p)
		}
	}
	return out
}

// MissingBy counts the uncovered cells by kind and by operation context.
func (c *Coverage) MissingBy() (byKind, byOp map[string]int) {
	byKind, byOp = map[string]int{}, map[string]int{}
	for _, p := range c.Missing() {
		byKind[p.Kind]++
		byOp[p.Op]++
	}
	return byKind, byOp
}

// NotRunnableReasons counts the not-runnable cells by reason.
func (c *Coverage) NotRunnableReasons() map[string]int {
	out := map[string]int{}
	for _, p := range c.Cells {
		if len(p.CoveredBy) == 0 && p.NotRunnable != "" {
			out[p.NotRunnable]++
		}
	}
	return out
}

// CoverageMap is the run's map, or why there is none: no map at all, or a
// version-1 map (point × kind folded across operations), whose figure is
// not this one's and is never shown as if it were.
func (r *Results) CoverageMap() (*Coverage, error) {
	switch {
	case r.Coverage != nil:
		return r.Coverage, nil
	case len(r.LegacyCoverage) > 0:
		return nil, fmt.Errorf("its coverage map is version 1 ((point × kind) pairs folded across operations), not comparable with version %d's cells: re-run, or re-render the cases with this vmchaos", CoverageVersion)
	}
	return nil, fmt.Errorf("it has no coverage map (a run written before the coverage map, or not an agent-layer run)")
}

// UnionCoverage is the map over several runs' cases together (a nightly
// selection run apart from `make chaos`'s, when the label filters differ
// and merge refuses them): the first run's map is the spec, every run's
// landed cases credit it. Runs whose denominators differ (another
// vmchaos's cells) are refused, not mixed.
func UnionCoverage(runs []*Results) (*Coverage, error) {
	if len(runs) == 0 {
		return nil, fmt.Errorf("no runs")
	}
	spec, err := runs[0].CoverageMap()
	if err != nil {
		return nil, err
	}
	want := cellSet(spec)
	var cases []Case
	for i, r := range runs {
		m, err := r.CoverageMap()
		if err != nil {
			return nil, fmt.Errorf("run %d: %w", i+1, err)
		}
		if got := cellSet(m); got != want {
			return nil, fmt.Errorf("run %d (%s): its denominator differs from run 1's (%d cells, want %d of the same): runs of different vmchaos builds are not comparable", i+1, r.RunID, len(m.Cells), len(spec.Cells))
		}
		cases = append(cases, r.Cases...)
	}
	return ComputeCoverage(spec, cases), nil
}

// cellSet is a map's cells as one comparable string.
func cellSet(c *Coverage) string {
	keys := make([]string, 0, len(c.Cells))
	for _, p := range c.Cells {
		keys = append(keys, p.Op+"\x00"+p.Point+"\x00"+p.Kind)
	}
	sort.Strings(keys)
	return strings.Join(keys, "\x01")
}
