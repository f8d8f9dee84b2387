package runner

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// recordingGate is a ClockGate that records when the case took and gave
// back the machine (failpoint.Now, the injections' clock).
type recordingGate struct {
	mu              sync.Mutex
	enters, leaves  int
	enterNs, leftNs int64
}

func (g *recordingGate) Enter(context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.enters++
	g.enterNs = failpoint.Now()
	return nil
}

func (g *recordingGate) Leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.leaves++
	g.leftNs = failpoint.Now()
}

func fakeCase(t *testing.T, id string) scenarios.Case {
	t.Helper()
	c, err := scenarios.ExpandedCase("fake", id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A timed case holds the machine once, and every one of its faults lands
// while it holds it: the scheduler runs nothing beside that part (issue
// #37). One case per way the timed part starts: a window calibration's
// measured runs (a sweep point), the re-arm restart (an at trigger on the
// agent's restart), a while-down second fault.
func TestTimedCaseLandsItsFaultsWhileHoldingTheMachine(t *testing.T) {
	for _, id := range []string{"sweep-save-sigkill@50%", "s001-h-double-restart",
		"mx-delete-agent-delete-begin-vmm-kill-while-dead"} {
		t.Run(id, func(t *testing.T) {
			ctx, r := newTestRunner(t, 5*time.Minute)
			g := &recordingGate{}
			rc := r.RunCase(WithClockGate(ctx, g), fakeCase(t, id))
			if rc.Verdict != reports.Pass {
				t.Fatalf("verdict %s: %s", rc.Verdict, rc.Reason)
			}
			if g.enters != 1 || g.leaves != 1 {
				t.Fatalf("entered %d, left %d times, want once each", g.enters, g.leaves)
			}
			if len(rc.Injections) == 0 {
				t.Fatal("no injection recorded")
			}
			for _, in := range rc.Injections {
				if in.ActualNs < g.enterNs || in.ActualNs > g.leftNs {
					t.Errorf("%s (%s) landed at %d, outside the held part %d..%d", in.Fault, in.Trigger, in.ActualNs, g.enterNs, g.leftNs)
				}
			}
		})
	}
}

// A swept case's window is measured while it holds the machine (every hit
// of its trigger point, the calibration's measured runs included, comes
// after the Enter), and its setup and the calibration VMs' preparation
// ran before, sharing the machine.
func TestSweptCaseMeasuresItsWindowWhileHoldingTheMachine(t *testing.T) {
	c := fakeCase(t, "sweep-save-sigkill@50%")
	point := strings.TrimPrefix(c.Scenario.Faults[0].Trigger, "at ")
	ctx, r := newTestRunner(t, 5*time.Minute)
	g := &recordingGate{}
	rc := r.RunCase(WithClockGate(ctx, g), c)
	if rc.Verdict != reports.Pass || rc.Window == nil {
		t.Fatalf("verdict %s (window %v): %s", rc.Verdict, rc.Window, rc.Reason)
	}
	hits, before := 0, 0
	for _, e := range rc.Timeline {
		if e.Kind != "phase" {
			continue
		}
		if e.TsNs < g.enterNs {
			before++
		}
		if e.Point == point {
			hits++
			if e.TsNs < g.enterNs {
				t.Errorf("%s hit at %d, before the case held the machine (%d)", point, e.TsNs, g.enterNs)
			}
		}
	}
	// calibRuns measured runs and the faulted operation
	if hits < calibRuns+1 {
		t.Errorf("%d hit(s) of %s, want at least %d", hits, point, calibRuns+1)
	}
	if before == 0 {
		t.Error("nothing of the case ran before it held the machine: the setup did not share it")
	}
}
