package suite

import (
	"fmt"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
)

// ScheduleMeta is what a schedule records besides its cases: how the run
// was selected and run.
type ScheduleMeta struct {
	Filter, Shard string
	Workers       int
	Repeat        int
	Lazyfs        bool
	// Order is the order the shared cases start in (RunScheduled's);
	// nil Shared and AfterLane: catalogue order.
	Order Order
}

// StartOrder is the place in which each case starts under RunScheduled
// with n workers and the shared cases in o: with one worker the catalogue
// order; otherwise every alone case in catalogue order, then the shared
// ones in o's order (o.Shared, then o.AfterLane). The two run side by
// side (the alone lane beside the shared places), so the place is each
// class's own start order, not a global one.
func StartOrder(classes []Class, n int, o Order) []int {
	order := make([]int, len(classes))
	if n <= 1 {
		for i := range classes {
			order[i] = i
		}
		return order
	}
	o = o.or(classes)
	k := 0
	for i, c := range classes {
		if c != Shared {
			order[i] = k
			k++
		}
	}
	for _, i := range append(append([]int(nil), o.Shared...), o.AfterLane...) {
		order[i] = k
		k++
	}
	return order
}

// BuildSchedule is the schedule of running cases (in this order) on r: the
// run's seed, scale, backend and planted bugs, and each case's class,
// start place, offset and fault plan as r arms it (issue #36 item 3).
func BuildSchedule(r *runner.Runner, cases []scenarios.Case, m ScheduleMeta) *reports.Schedule {
	res := r.Results()
	s := &reports.Schedule{Version: reports.ScheduleVersion, Backend: res.Backend, TimeScale: res.TimeScale, Seed: r.Seed(),
		Regress: append([]string(nil), res.Regress...), Filter: m.Filter, Shard: m.Shard, Workers: max(m.Workers, 1),
		Lazyfs: m.Lazyfs}
	if m.Repeat > 1 {
		s.Repeat = m.Repeat
	}
	classes := make([]Class, len(cases))
	for i, c := range cases {
		classes[i], _ = Classify(c)
	}
	order := StartOrder(classes, s.Workers, m.Order)
	afterLane := map[int]bool{}
	if s.Workers > 1 {
		for _, i := range m.Order.AfterLane {
			afterLane[i] = true
		}
	}
	for i, c := range cases {
		s.Cases = append(s.Cases, reports.ScheduleCase{ID: c.ID, Scenario: c.Scenario.ID, Start: order[i], AfterLane: afterLane[i], Class: string(classes[i]),
			OffsetNs: int64(c.Offset), HasOff: c.HasOff, Frac: c.Frac, HasFrac: c.HasFrac, Seed: r.Seed(),
			Failpoints: c.Scenario.Env.Failpoints, Faults: r.PlanFaults(c)})
	}
	return s
}

// CasesOf rebuilds a schedule's cases, in its order, from this build's
// catalogue. A case the catalogue no longer has is an error; whether the
// rebuilt cases are exactly the recorded ones is for DiffSchedules to say
// (BuildSchedule of the result against the recorded schedule).
func CasesOf(s *reports.Schedule) ([]scenarios.Case, error) {
	all, err := scenarios.Expand(s.Backend)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]scenarios.Case, len(all))
	for _, c := range all {
		byID[c.ID] = c
	}
	out := make([]scenarios.Case, 0, len(s.Cases))
	for _, sc := range s.Cases {
		c, ok := byID[sc.ID]
		if !ok {
			return nil, fmt.Errorf("schedule case %s: not in this build's %s catalogue", sc.ID, s.Backend)
		}
		out = append(out, c)
	}
	return out, nil
}

// FracCases names the cases whose offset is a fraction of a window
// measured on their own stack (reports.Decisions leaves their offset out).
func FracCases(cases []scenarios.Case) map[string]bool {
	out := map[string]bool{}
	for _, c := range cases {
		if c.HasFrac {
			out[c.ID] = true
		}
	}
	return out
}
