package suite

import (
	"testing"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// Annotate puts results appended in completion order back in catalogue
// order and records each case's class and concurrency.
func TestAnnotateSortsAndRecordsClassAndConcurrency(t *testing.T) {
	cases := []scenarios.Case{catalogueCase(t, "s001-1-busy-create-orphan"), catalogueCase(t, "s001-h-double-restart"),
		catalogueCase(t, "s001-h-ten-vms-adopted")}
	res := &reports.Results{Cases: []reports.Case{{ID: cases[2].ID}, {ID: cases[0].ID}, {ID: cases[1].ID}}}
	slots := []Slot{{Class: Shared, Concurrency: 3, Ran: true}, {Class: Alone, Concurrency: 1, Ran: true},
		{Class: Shared, Concurrency: 2, Ran: true}}
	Annotate(res, cases, slots)
	want := []struct {
		id    string
		class Class
		conc  int
	}{{cases[0].ID, Shared, 3}, {cases[1].ID, Alone, 1}, {cases[2].ID, Shared, 2}}
	for k, w := range want {
		c := res.Cases[k]
		if c.ID != w.id || c.Class != string(w.class) || c.Concurrency != w.conc {
			t.Errorf("case %d: %s %s ×%d, want %s %s ×%d", k, c.ID, c.Class, c.Concurrency, w.id, w.class, w.conc)
		}
	}
	// a sequential run: concurrency 1, order kept
	Annotate(res, cases, nil)
	for k, c := range res.Cases {
		if c.Concurrency != 1 || c.ID != want[k].id {
			t.Errorf("sequential: case %d: %s ×%d", k, c.ID, c.Concurrency)
		}
	}
}
