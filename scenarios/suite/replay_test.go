package suite

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// TestStartOrder: sequential runs start in catalogue order; the scheduler
// starts every alone case first, then the shared ones, each in catalogue
// order (Schedule's dispatch order).
func TestStartOrder(t *testing.T) {
	cl := []Class{Shared, Alone, Shared, Alone}
	if got := StartOrder(cl, 1, Order{}); !reflect.DeepEqual(got, []int{0, 1, 2, 3}) {
		t.Fatalf("sequential: %v", got)
	}
	if got := StartOrder(cl, 2, Order{}); !reflect.DeepEqual(got, []int{2, 0, 3, 1}) {
		t.Fatalf("scheduled: %v", got)
	}
	// shared cases in the run's order: case 2 first, case 0 after the lane
	if got := StartOrder(cl, 2, Order{Shared: []int{2}, AfterLane: []int{0}}); !reflect.DeepEqual(got, []int{3, 0, 2, 1}) {
		t.Fatalf("scheduled by times: %v", got)
	}
}

// TestOrderOfReadsBackTheRecordedOrder: a schedule built with an order
// gives that order back (what --replay and --check-determinism start the
// shared cases in), and the long cases stay after the lane.
func TestOrderOfReadsBackTheRecordedOrder(t *testing.T) {
	cl := []Class{Shared, Alone, Shared, Shared, Alone, Shared}
	o := Order{Shared: []int{5, 2}, AfterLane: []int{3, 0}}
	start := StartOrder(cl, 3, o)
	s := &reports.Schedule{}
	after := map[int]bool{3: true, 0: true}
	for i, c := range cl {
		s.Cases = append(s.Cases, reports.ScheduleCase{ID: fmt.Sprint(i), Class: string(c), Start: start[i], AfterLane: after[i]})
	}
	got := OrderOf(s)
	if !reflect.DeepEqual(got.Shared, o.Shared) || !reflect.DeepEqual(got.AfterLane, o.AfterLane) {
		t.Fatalf("OrderOf = %v after the lane %v, want %v and %v", got.Shared, got.AfterLane, o.Shared, o.AfterLane)
	}
}

// TestCasesOfRebuildsInOrder: a schedule's cases come back from the
// catalogue in the schedule's order (not the catalogue's), and a case the
// catalogue lacks is an error naming it.
func TestCasesOfRebuildsInOrder(t *testing.T) {
	all, err := scenarios.Expand("fake")
	if err != nil {
		t.Fatal(err)
	}
	fast, err := scenarios.Filter(all, "speed:fast")
	if err != nil || len(fast) < 3 {
		t.Fatalf("fast subset: %d cases, %v", len(fast), err)
	}
	pick := []scenarios.Case{fast[2], fast[0], fast[1]}
	s := &reports.Schedule{Version: reports.ScheduleVersion, Backend: "fake"}
	for _, c := range pick {
		s.Cases = append(s.Cases, reports.ScheduleCase{ID: c.ID, Scenario: c.Scenario.ID})
	}
	got, err := CasesOf(s)
	if err != nil {
		t.Fatal(err)
	}
	for i := range pick {
		if got[i].ID != pick[i].ID || got[i].Offset != pick[i].Offset || got[i].HasFrac != pick[i].HasFrac || got[i].Scenario != pick[i].Scenario {
			t.Fatalf("case %d: got %s, want %s", i, got[i].ID, pick[i].ID)
		}
	}
	s.Cases = append(s.Cases, reports.ScheduleCase{ID: "no-such-case@1ms"})
	if _, err := CasesOf(s); err == nil || !strings.Contains(err.Error(), "no-such-case@1ms") {
		t.Fatalf("a case the catalogue lacks must be named: %v", err)
	}
}
