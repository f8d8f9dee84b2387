package suite

import (
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/scenarios"
)

// catalogueCase is the case with this id in the fake backend's catalogue
// (nightly cases included).
func catalogueCase(t *testing.T, id string) scenarios.Case {
	t.Helper()
	c, err := scenarios.ExpandedCase("fake", id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClassifyRealCatalogueCases(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want Class
		why  string // a word of the reason
	}{
		{"s001-1-busy-create-orphan", Shared, "park"},                                // park vm.clone.reserved
		{"s002-verb-spares-live-clone", Shared, "park"},                              // park, ReleaseAfter
		{"s001-h-ten-vms-adopted", Shared, "steady"},                                 // now, setup waited
		{"gap-wake-restores-snapshot", Shared, "steady"},                             // no fault
		{"powercut-create-agent-create-begin", Shared, "park"},                       // power cut at a park
		{"s001-5-transient-failed", Shared, "failpoint action"},                      // a failpoint action: the product places it
		{"s001-h-delete-restart-144ms@144ms", Alone, "offset"},                       // at + fixed offset
		{"s000-vmm-kill-event@500ms", Alone, "offset"},                               // now + offset
		{"s001-3-sigkill-after-save-exit@20%", Alone, "calibrated"},                  // sweep fraction: calibration
		{"sweep-clone-sigkill@30%", Alone, "calibrated"},                             // coarse sweep point
		{"s001-h-double-restart", Alone, "at agent.startup.reconciled"},              // park first, at second
		{"mx-create-agent-create-cloned-vmm-kill-while-stopped", Shared, "park"},     // down until the harness starts it
		{"mx-create-agent-create-cloned-vmm-kill-while-dead", Alone, "while-down"},   // down for RestartSec
		{"mx-create-agent-create-cloned-vmm-kill-while-frozen", Alone, "while-down"}, // frozen for StopFor
		{"powercut-hibernate-after-save-exit", Alone, "after-exit"},                  // power cut by after-exit
	} {
		c := catalogueCase(t, tc.id)
		got, why := Classify(c)
		if got != tc.want || !strings.Contains(why, tc.why) {
			t.Errorf("%s: Classify = %s (%s), want %s (%q)", tc.id, got, why, tc.want, tc.why)
		}
	}
}

// Every case the runner calibrates a window for runs alone, and so does
// every case whose faults name an at or after-exit trigger: over the whole
// catalogue, not a sample.
func TestClassifyEveryTimedCaseIsAlone(t *testing.T) {
	all, err := scenarios.Expand("fake")
	if err != nil {
		t.Fatal(err)
	}
	calibrated, shared := 0, 0
	for _, c := range all {
		cl, why := Classify(c)
		if NeedsCalibration(c) {
			calibrated++
			if cl != Alone {
				t.Errorf("%s calibrates a window but is %s (%s)", c.ID, cl, why)
			}
		}
		for _, f := range c.Scenario.Faults {
			// a while-down fault after a stop waits for no clock
			// (downUntilStarted); a failpoint action is placed by the
			// product itself
			timed := (strings.HasPrefix(f.Trigger, "at ") || strings.HasPrefix(f.Trigger, "after-exit ")) && f.Kind != failpointAction ||
				f.Trigger == scenarios.TriggerWhileDown && c.Scenario.Faults[0].Kind != "stop"
			if timed && cl != Alone {
				t.Errorf("%s: fault %s %q is timed but the case is %s", c.ID, f.Kind, f.Trigger, cl)
			}
		}
		if cl == Shared {
			shared++
		}
	}
	// the test must have looked at both kinds, or it proved nothing
	if calibrated == 0 || shared == 0 {
		t.Fatalf("catalogue: %d calibrated, %d shared case(s): want some of each", calibrated, shared)
	}
}

func TestClassifyNowDuringAnActInFlightIsAlone(t *testing.T) {
	s := &scenarios.Scenario{ID: "t", Act: []scenarios.Step{{Kind: scenarios.StepCreate, VM: "vm-a"}},
		Faults: []scenarios.Fault{{Kind: "restart", Trigger: "now"}}}
	if cl, why := Classify(scenarios.Case{ID: "t", Scenario: s}); cl != Alone {
		t.Errorf("now after an act step without Wait: %s (%s), want alone", cl, why)
	}
	s.Act[0].Wait = true
	if cl, why := Classify(scenarios.Case{ID: "t", Scenario: s}); cl != Shared {
		t.Errorf("now after an act step that waited: %s (%s), want shared", cl, why)
	}
	s.WhileStopped = []scenarios.Step{{Kind: scenarios.StepWipeStatus, VM: "vm-a"}}
	if cl, why := Classify(scenarios.Case{ID: "t", Scenario: s}); cl != Alone {
		t.Errorf("while-stopped steps after a restart: %s (%s), want alone (they race RestartSec)", cl, why)
	}
}

// TestAutoWorkers: the measured rule (issue #37): 5 places on an idle
// 2-CPU host (stacks on tmpfs: 2–2.5 cores of cases' demand), one fewer
// per busy CPU, never more than 2.5 per CPU nor MaxAuto, at least 1.
func TestAutoWorkers(t *testing.T) {
	for _, tc := range []struct {
		cpus int
		busy float64
		want int
	}{
		{2, 0, 5}, {2, 0.4, 5}, {2, 1.4, 4}, {2, 1.6, 3}, {2, 2.4, 3}, {2, 3.6, 1}, {2, 16, 1},
		{16, 0, MaxAuto}, {8, 17, 3}, {4, 0, MaxAuto}, {3, 0, MaxAuto}, {3, 3.6, 3},
		{1, 0, 2}, {1, 1, 1}, {2, -1, 5}, {0, 0, 1},
	} {
		if got := AutoWorkers(tc.cpus, tc.busy); got != tc.want {
			t.Errorf("AutoWorkers(%d, %v) = %d, want %d", tc.cpus, tc.busy, got, tc.want)
		}
	}
}

func TestBusyCoresFromTwoCPUStatSamples(t *testing.T) {
	a, err := parseCPUStat("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
	if err != nil {
		t.Fatal(err)
	}
	// 200 ticks more, of them 50 idle and 0 iowait: 150 busy of 200 on 2 CPUs
	b, err := parseCPUStat("cpu  200 0 100 850 50 0 0 0 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := busyCores(a, b, 2); !ok || got != 1.5 {
		t.Errorf("busyCores = %v, %v; want 1.5", got, ok)
	}
	if _, ok := busyCores(a, a, 2); ok {
		t.Error("no time between the samples read as a figure")
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 3", "cpu 1 2 x 4 5 6 7 8"} {
		if _, err := parseCPUStat(bad); err == nil {
			t.Errorf("parseCPUStat(%q): no error", bad)
		}
	}
}

func TestParseParallel(t *testing.T) {
	if n, how, err := ParseParallel("3"); err != nil || n != 3 || how != "3" {
		t.Errorf(`ParseParallel("3") = %d, %q, %v`, n, how, err)
	}
	n, how, err := ParseParallel("auto")
	if err != nil || n < 1 || n > MaxAuto || !strings.HasPrefix(how, "auto=") {
		t.Errorf(`ParseParallel("auto") = %d, %q, %v`, n, how, err)
	}
	for _, bad := range []string{"0", "-2", "x", ""} {
		if _, _, err := ParseParallel(bad); err == nil {
			t.Errorf("ParseParallel(%q): no error", bad)
		}
	}
}
