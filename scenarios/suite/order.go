package suite

import (
	"sort"
	"time"

	"github.com/vmchaos/vmchaos/reports"
)

// Order is the order a scheduled run starts its shared cases in (indices
// into its cases): Shared while the alone lane runs, AfterLane only once
// the lane is done. Alone cases always run in catalogue order.
//
// Why it matters (issue #37): an alone case's timed part waits for every
// shared case in flight to return, and no shared case starts meanwhile,
// so one long shared case in flight when an alone case asks for the
// machine holds the lane, and leaves the other places empty, for the
// whole of its remaining time (one of 11 s held the lane 10.7 s in a
// shard of make chaos). Shortest first while the lane runs keeps the
// cases between two timed parts alike in length, and the long ones go
// after the lane, longest first, where they hold up nothing.
type Order struct {
	Shared    []int
	AfterLane []int
	// Source says where the durations came from ("" for catalogue order).
	Source string
}

// longFactor: a shared case whose recorded duration is over longFactor
// times the median of the shared cases' waits for the lane to be done.
// Chosen on a simulation of the gate over a shard of make chaos (34 alone,
// 127 shared cases, durations and drains from a real run at N = 5, the
// simulation within 0.2 s of that run's 70.5 s): 1.2× 58.2 s, 1.5× 59.4 s,
// 2× 62.9 s, catalogue order 70.6 s; durations from another run's
// sequential pass as the estimate.
const longFactor = 1.5

// CatalogueOrder starts the shared cases in catalogue order, none after
// the lane: the order without recorded durations.
func CatalogueOrder(classes []Class) Order {
	var o Order
	for i, c := range classes {
		if c == Shared {
			o.Shared = append(o.Shared, i)
		}
	}
	return o
}

// or is o, or catalogue order for the zero Order (no case in either list):
// a caller that gives none starts every shared case, in catalogue order.
func (o Order) or(classes []Class) Order {
	if o.Shared == nil && o.AfterLane == nil {
		return CatalogueOrder(classes)
	}
	return o
}

// ByTimes orders the shared cases by how long they took before (times,
// by case ID; source names where from): shortest first, and those over
// longFactor × the median after the lane, longest first. A case without a
// recorded time counts as the median. Without any recorded time of a
// shared case, catalogue order.
func ByTimes(ids []string, classes []Class, times map[string]time.Duration, source string) Order {
	var shared []int
	var known []time.Duration
	for i, c := range classes {
		if c != Shared {
			continue
		}
		shared = append(shared, i)
		if d, ok := times[ids[i]]; ok {
			known = append(known, d)
		}
	}
	if len(known) == 0 {
		return CatalogueOrder(classes)
	}
	sort.Slice(known, func(a, b int) bool { return known[a] < known[b] })
	median := known[len(known)/2]
	est := func(i int) time.Duration {
		if d, ok := times[ids[i]]; ok {
			return d
		}
		return median
	}
	long := time.Duration(longFactor * float64(median))
	o := Order{Source: source}
	for _, i := range shared {
		if est(i) > long {
			o.AfterLane = append(o.AfterLane, i)
		} else {
			o.Shared = append(o.Shared, i)
		}
	}
	sort.SliceStable(o.Shared, func(a, b int) bool { return est(o.Shared[a]) < est(o.Shared[b]) })
	sort.SliceStable(o.AfterLane, func(a, b int) bool { return est(o.AfterLane[a]) > est(o.AfterLane[b]) })
	return o
}

// OrderOf is the order a recorded schedule ran its shared cases in (its
// cases are the run's, in the schedule's order: CasesOf), so a replay
// starts them exactly so.
func OrderOf(s *reports.Schedule) Order {
	o := Order{Source: "the recorded schedule"}
	idx := make([]int, 0, len(s.Cases))
	for i, c := range s.Cases {
		if c.Class == string(Shared) {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return s.Cases[idx[a]].Start < s.Cases[idx[b]].Start })
	for _, i := range idx {
		if s.Cases[i].AfterLane {
			o.AfterLane = append(o.AfterLane, i)
		} else {
			o.Shared = append(o.Shared, i)
		}
	}
	return o
}
