package runner

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/scenarios"
)

func TestSpanAfterMeasuresTheWindowFromTheTriggersHit(t *testing.T) {
	evs := []failpoint.Event{
		{TsNs: 100, Point: "agent.hibernate.saved"}, // before fromNs: ignored
		{TsNs: 1000, Pid: 7, Point: "agent.child.exec", Attrs: map[string]any{"child_pid": 9.0, "argv": []any{"vmctl", "snapshot", "save"}}},
		{TsNs: 1100, Point: "agent.hibernate.pushed"}, // a close before any open: ignored
		{TsNs: 2000, Pid: 7, Point: "agent.child.exit", Attrs: map[string]any{"child_pid": 9.0}},
		{TsNs: 2500, Point: "agent.hibernate.saved"},
		{TsNs: 9000, Point: "agent.hibernate.pushed"},
	}
	cases := []struct {
		trig       string
		w          [2]string
		start, end int64
		ok         bool
	}{
		{"at agent.hibernate.saved + 0ms", [2]string{"agent.hibernate.saved", "agent.hibernate.pushed"}, 0, 6500, true},
		{"after-exit snapshot-save + 0ms", [2]string{"agent.hibernate.saved", "agent.hibernate.pushed"}, 500, 7000, true},
		{"after-exit snapshot-save + 0ms", [2]string{"agent.child.exit", "agent.hibernate.saved"}, 0, 500, true},
		{"at agent.hibernate.saved + 0ms", [2]string{"agent.hibernate.saved", "agent.hibernate.done"}, 0, 0, false},
	}
	for _, c := range cases {
		tr, err := injector.ParseTrigger(c.trig)
		if err != nil {
			t.Fatal(err)
		}
		start, end, ok := spanAfter(evs, tr, c.w, 500)
		if start != c.start || end != c.end || ok != c.ok {
			t.Errorf("%s %v: span %d..%d %v, want %d..%d %v", c.trig, c.w, start, end, ok, c.start, c.end, c.ok)
		}
	}
}

func TestReproOfFractionCase(t *testing.T) {
	r := &Runner{opts: Options{Scale: 0.05, Seed: 1, Backend: "fake"}}
	c, err := scenarios.CaseForFrac("sweep-save-stop", 0.35, "fake")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Repro(c), "vmchaos repro --scenario sweep-save-stop --offset 35% --seed 1 --time-scale 0.05 --backend fake"; got != want {
		t.Errorf("unresolved repro = %q, want %q", got, want)
	}
	// resolved as resolveFrac does: the absolute offset, unscaled
	c.Offset, c.HasOff = 952_000_000, true
	if got, want := r.Repro(c), "vmchaos repro --scenario sweep-save-stop --offset 952ms --seed 1 --time-scale 0.05 --backend fake"; got != want {
		t.Errorf("resolved repro = %q, want %q", got, want)
	}
	if got, want := r.triggerString(c, 0), "at agent.hibernate.dhcp-released@vm=vm-a + 47.6ms"; got != want {
		t.Errorf("trigger = %q, want %q", got, want)
	}
}

func TestFixedOffsetMustLieInsideTheMeasuredWindow(t *testing.T) {
	msd := func(f float64) int64 { return int64(f * 1e6) }
	cases := []struct {
		name string
		ow   opWindow
		off  float64 // ms, scaled
		ok   bool
	}{
		// s001-h-delete-restart-144ms at 0.05: 7.2 ms into a 40 ms delete
		{"early in a window opened by the trigger", opWindow{EndNs: msd(40)}, 7.2, true},
		{"at the trigger's own hit", opWindow{EndNs: msd(40)}, 0, true},
		{"past 60% of the window", opWindow{EndNs: msd(40)}, 25, false},
		{"within minGuard of a short window's end", opWindow{EndNs: msd(3)}, 1.4, false},
		// the old s001-3-sigkill-after-save-exit: 1.4 ms after the exit,
		// but the agent records the save 3.3 ms after it
		{"before a start edge that is not the trigger", opWindow{StartNs: msd(3.3), EndNs: msd(75)}, 1.4, false},
		{"just after the start edge, within its spread", opWindow{StartNs: msd(3.3), StartSpreadNs: msd(3), EndNs: msd(75)}, 5, false},
		{"clear of the start edge", opWindow{StartNs: msd(3.3), StartSpreadNs: msd(1), EndNs: msd(75)}, 6, true},
	}
	for _, c := range cases {
		lo, hi := c.ow.fixedRange(maxPlace)
		off := time.Duration(c.off * 1e6)
		if got := off >= lo && off <= hi; got != c.ok {
			t.Errorf("%s: %v in %v..%v = %v, want %v", c.name, off, lo, hi, got, c.ok)
		}
	}
}

func TestMarginOfAFaultToItsWindowEdges(t *testing.T) {
	ow := opWindow{W: [2]string{"agent.hibernate.saved", "agent.hibernate.pushed"}, StartNs: 0, EndNs: 50}
	evs := []failpoint.Event{{TsNs: 1000, Point: "agent.hibernate.saved"}, {TsNs: 1009, Point: "agent.hibernate.pushed"}}
	// the trigger's own hit at exactly trigNs opens the window; an end
	// reached only after the fault (a resumed operation's) is not this
	// run's edge: the measured end counts
	if s, e, obs := marginOf(evs, ow, 1000, 1005); s != 5 || e != 45 || obs {
		t.Errorf("inside: margins %d/%d observed %v, want 5/45", s, e, obs)
	}
	if s, _, _ := marginOf(evs, ow, 1001, 1005); s != 4 {
		t.Errorf("a trigger time after its own hit: start margin %d, want 4 from the measured start", s)
	}
	if s, e, obs := marginOf(evs, ow, 1000, 1025); s != 25 || e != -16 || !obs {
		t.Errorf("after the run's end: margins %d/%d observed %v, want 25/-16 observed", s, e, obs)
	}
	// a run that never reached the end (killed): the measured end
	if s, e, obs := marginOf(evs[:1], ow, 1000, 1020); s != 20 || e != 30 || obs {
		t.Errorf("killed before the end: margins %d/%d observed %v, want 20/30", s, e, obs)
	}
}

func TestFractionsArePlacedInTheRunsNarrowestSpan(t *testing.T) {
	r := &Runner{}
	sc, _ := scenarios.Lookup("sweep-save-stop")
	w := [2]string{"agent.hibernate.dhcp-released", "agent.hibernate.saved"}
	if span, note := r.narrowestSpan(sc, opWindow{W: w, EndNs: 100}); span != 100 || note != "" {
		t.Errorf("first case: span %d (%q), want its own 100", span, note)
	}
	// a later case whose calibrations both came out stretched
	if span, note := r.narrowestSpan(sc, opWindow{W: w, EndNs: 300}); span != 100 || note == "" {
		t.Errorf("stretched case: span %d (%q), want the run's narrowest 100, said so", span, note)
	}
	if span, _ := r.narrowestSpan(sc, opWindow{W: w, EndNs: 60}); span != 60 {
		t.Errorf("a narrower case: span %d, want its own 60", span)
	}
	other, _ := scenarios.Lookup("sweep-hibernate-stop")
	if span, _ := r.narrowestSpan(other, opWindow{W: [2]string{"agent.hibernate.begin", "agent.hibernate.done"}, EndNs: 500}); span != 500 {
		t.Errorf("another operation window shares no floor: span %d", span)
	}
}

// TestSpanMissingNamesThePhaseTheCalibrationLacks: a calibration without a
// window names the point that never came (issue #31), so a stall there is
// reported with its missing phase.
func TestSpanMissingNamesThePhaseTheCalibrationLacks(t *testing.T) {
	evs := []failpoint.Event{
		{TsNs: 1000, Point: "agent.hibernate.begin"},
		{TsNs: 2500, Point: "agent.hibernate.saved"},
	}
	for _, c := range []struct {
		trig string
		w    [2]string
		want string
	}{
		{"at agent.hibernate.nic-dropped + 0ms", [2]string{"agent.hibernate.saved", "agent.hibernate.pushed"}, "the trigger at agent.hibernate.nic-dropped"},
		{"at agent.hibernate.begin + 0ms", [2]string{"agent.hibernate.dhcp-released", "agent.hibernate.saved"}, "agent.hibernate.dhcp-released"},
		{"at agent.hibernate.begin + 0ms", [2]string{"agent.hibernate.saved", "agent.hibernate.pushed"}, "agent.hibernate.pushed"},
	} {
		tr, err := injector.ParseTrigger(c.trig)
		if err != nil {
			t.Fatal(err)
		}
		if got := spanMissing(evs, tr, c.w, 500); !strings.HasPrefix(got, c.want) {
			t.Errorf("%s %v: missing %q, want %q", c.trig, c.w, got, c.want)
		}
	}
}

// TestFixedOffsetShortReadingIsMeasuredAgain: a fixed offset whose one
// reading leaves it outside where it may lie is measured once more on a
// fresh calibration VM and the wider reading counts (one short delete made
// s001-h-delete-restart-144ms inconclusive); a reading that already fits
// costs no second run, and a second run no wider keeps the first.
func TestFixedOffsetShortReadingIsMeasuredAgain(t *testing.T) {
	msd := func(f float64) int64 { return int64(f * 1e6) }
	newCase := func(readings ...float64) (*caseRun, *[]string) {
		var asked []string
		cr := &caseRun{r: &Runner{opts: Options{Scale: 0.05}},
			s: &scenarios.Scenario{Offsets: []time.Duration{144 * time.Millisecond}},
			c: scenarios.Case{Offset: 144 * time.Millisecond, HasOff: true}}
		cr.measure = func(_ context.Context, _ time.Duration, vms []string, _ bool) (opWindow, error) {
			asked = append(asked, vms...)
			end := readings[0]
			readings = readings[1:]
			return opWindow{EndNs: msd(end), Source: "1 calibration run(s)"}, nil
		}
		return cr, &asked
	}
	// 7.2 ms must lie in the first 60 %: a window of at least 12 ms
	cr, asked := newCase(11.9, 12.5)
	ow, err := cr.measureWindow(context.Background(), time.Second)
	if err == nil {
		ow, err = cr.confirmShort(context.Background(), time.Second, ow)
	}
	if err != nil || ow.EndNs != msd(12.5) || len(*asked) != 2 || (*asked)[1] != "calib-1" {
		t.Errorf("short then wide: window ends %v, runs on %v, err %v; want the 12.5 ms reading from calib-1", ow.EndNs, *asked, err)
	}
	if lo, hi := cr.fixedBounds(ow); 7200*time.Microsecond < lo || 7200*time.Microsecond > hi {
		t.Errorf("7.2 ms not in %v..%v of the wider reading", lo, hi)
	}
	// a scenario's own MaxPlace: 7.2 ms of 11.5 ms is 63 %, in its first 70 %
	cr.s.MaxPlace = 0.7
	if lo, hi := cr.fixedBounds(opWindow{EndNs: msd(11.5)}); 7200*time.Microsecond < lo || 7200*time.Microsecond > hi {
		t.Errorf("MaxPlace 0.7: 7.2 ms not in %v..%v of an 11.5 ms window", lo, hi)
	}
	cr, asked = newCase(11.9, 11.7)
	ow, _ = cr.measureWindow(context.Background(), time.Second)
	if ow, _ = cr.confirmShort(context.Background(), time.Second, ow); ow.EndNs != msd(11.9) || len(*asked) != 2 {
		t.Errorf("short then shorter: window ends %v after runs on %v, want the first 11.9 ms reading", ow.EndNs, *asked)
	}
	cr, asked = newCase(12.4)
	ow, _ = cr.measureWindow(context.Background(), time.Second)
	if ow, _ = cr.confirmShort(context.Background(), time.Second, ow); ow.EndNs != msd(12.4) || len(*asked) != 1 {
		t.Errorf("a reading that fits: window ends %v after runs on %v, want one run", ow.EndNs, *asked)
	}
}
