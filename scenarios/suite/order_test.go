package suite

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/scenarios/runner"
)

// TestByTimesShortestFirstLongAfterTheLane: the shared cases start
// shortest first; those over longFactor × the median go after the lane,
// longest first; a case without a recorded time counts as the median;
// alone cases are not in the order.
func TestByTimesShortestFirstLongAfterTheLane(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e", "f", "g"}
	cl := []Class{Shared, Shared, Alone, Shared, Shared, Shared, Shared}
	ms := time.Millisecond
	times := map[string]time.Duration{"a": 900 * ms, "b": 3000 * ms, "c": 100 * ms, "d": 800 * ms, "e": 11000 * ms, "f": 1000 * ms}
	// shared known: 800 900 1000 3000 11000: median 1000, long over 1500
	o := ByTimes(ids, cl, times, "x")
	if want := []int{3, 0, 5, 6}; !reflect.DeepEqual(o.Shared, want) { // g unknown: the median, after f (stable)
		t.Errorf("Shared = %v, want %v", o.Shared, want)
	}
	if want := []int{4, 1}; !reflect.DeepEqual(o.AfterLane, want) {
		t.Errorf("AfterLane = %v, want %v", o.AfterLane, want)
	}
	if o.Source != "x" {
		t.Errorf("Source = %q", o.Source)
	}
	// nothing recorded for a shared case: catalogue order, no source
	o = ByTimes(ids, cl, map[string]time.Duration{"c": time.Second}, "x")
	if want := []int{0, 1, 3, 4, 5, 6}; !reflect.DeepEqual(o.Shared, want) || o.AfterLane != nil || o.Source != "" {
		t.Errorf("without times: %+v, want catalogue order %v", o, want)
	}
}

// TestScheduleStartsAfterLaneCasesOnceTheLaneIsDone: a case of
// Order.AfterLane starts only once the last alone case left its timed
// part, however many places are free before (5); with one shared place
// beside the lane (2) the shared cases start in the order's order.
func TestScheduleStartsAfterLaneCasesOnceTheLaneIsDone(t *testing.T) {
	for _, n := range []int{2, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			cl := []Class{Shared, Alone, Shared, Alone, Shared}
			order := Order{Shared: []int{4, 0}, AfterLane: []int{2}}
			var mu sync.Mutex
			var started []int
			lastLeft, early := false, false
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			slots := schedule(ctx, cl, order, n, false, func(ctx context.Context, i int) {
				mu.Lock()
				started = append(started, i)
				early = early || (i == 2 && !lastLeft)
				mu.Unlock()
				g := runner.ClockGateOf(ctx)
				if g == nil {
					time.Sleep(time.Millisecond)
					return
				}
				time.Sleep(5 * time.Millisecond) // its stack start: places are free meanwhile
				if g.Enter(ctx) != nil {
					return
				}
				time.Sleep(time.Millisecond)
				if i == 3 {
					mu.Lock()
					lastLeft = true
					mu.Unlock()
				}
				g.Leave()
			})
			if ctx.Err() != nil {
				t.Fatal("the run did not finish within 20 s")
			}
			for i, s := range slots {
				if !s.Ran {
					t.Errorf("case %d never ran", i)
				}
			}
			if early {
				t.Errorf("the after-lane case started while the lane still ran (started: %v)", started)
			}
			if n > 2 {
				return
			}
			var shared []int
			for _, i := range started {
				if cl[i] == Shared {
					shared = append(shared, i)
				}
			}
			if want := []int{4, 0, 2}; !reflect.DeepEqual(shared, want) {
				t.Errorf("shared cases started %v, want %v", shared, want)
			}
		})
	}
}

// TestScheduleWithTheZeroOrderRunsEverySharedCase: a caller that gives no
// order gets catalogue order, not a run without its shared cases.
func TestScheduleWithTheZeroOrderRunsEverySharedCase(t *testing.T) {
	cl := []Class{Shared, Alone, Shared}
	slots := schedule(context.Background(), cl, Order{}, 3, false, func(ctx context.Context, i int) {
		if g := runner.ClockGateOf(ctx); g != nil && g.Enter(ctx) == nil {
			g.Leave()
		}
	})
	for i, s := range slots {
		if !s.Ran {
			t.Errorf("case %d (%s) never ran", i, cl[i])
		}
	}
	if got := StartOrder(cl, 3, Order{}); !reflect.DeepEqual(got, []int{1, 0, 2}) {
		t.Errorf("StartOrder with the zero Order = %v, want catalogue order [1 0 2]", got)
	}
}
