package nodeagent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/nodeagent/api"
)

// testAgent is an agent on a fresh state dir, not running: its store,
// metrics and event log, for the pieces that need no vmctl.
func testAgent(t *testing.T, cfg Config) *Agent {
	t.Helper()
	cfg.StateDir = t.TempDir()
	a, err := newAgent(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), 0)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestResumeOpPostCloneStates: the post-clone states of seed 001 "what held
// up" besides running (TestResumeOpFromMarkers has the rest).
func TestResumeOpPostCloneStates(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    record
		want string
	}{
		{"done, ready not written: ready_wait", record{Op: opCreate, Step: stepCloned, Status: Status{Lifecycle: LifecycleCreating, PostClone: PostCloneDone}}, "ready_wait"},
		{"failed: zero startup dispatch", record{Op: opCreate, Step: stepCloned, Status: Status{Lifecycle: LifecycleFailed, PostClone: PostCloneFailed}}, ""},
		{"empty lifecycle, marker running: dispatched", record{Op: opCreate, Step: stepCloned, Status: Status{PostClone: PostCloneRunning}}, "post_clone"},
		{"empty lifecycle, marker done: dispatched", record{Op: opWake, Step: stepCloned, Status: Status{PostClone: PostCloneDone}}, "ready_wait"},
	} {
		if got := resumeOp(&tc.r); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestStaleMarkerDroppedOnlyWithoutAVM(t *testing.T) {
	a := testAgent(t, DefaultConfig())
	for _, r := range []*record{
		{Name: "gone", Generation: 1, Intent: Intent{Snapshot: "base", Hibernate: true}, Status: Status{Lifecycle: LifecycleHibernated, PostClone: PostCloneDone}},
		{Name: "bound", Generation: 1, Intent: Intent{Snapshot: "base"}, Status: Status{Lifecycle: LifecycleReady, PostClone: PostCloneDone, VMID: "V1"}},
	} {
		if err := a.store.put(r); err != nil {
			t.Fatal(err)
		}
		a.dropStaleMarker(r)
	}
	if pc := a.store.get("gone").Status.PostClone; pc != "" {
		t.Errorf("a marker with no VM bound survived: %q", pc)
	}
	if pc := a.store.get("bound").Status.PostClone; pc != PostCloneDone {
		t.Errorf("the bound VM's marker was dropped: %q", pc)
	}
}

// TestWakeFailedCountsOneOutcomePerWake: a retry storm of one wake counts
// one failure, when the wake gives up; each retry counts by reason.
func TestWakeFailedCountsOneOutcomePerWake(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RetryAttempts = 2
	a := testAgent(t, cfg)
	if err := a.store.put(&record{Name: "w", Generation: 1, Intent: Intent{Snapshot: "base"}, Op: opWake,
		Status: Status{Lifecycle: LifecycleCreating}}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []float64{0, 0, 1} {
		a.fail(context.Background(), "w", opWake, opErr("pull", errors.New("registry blip")))
		if got := a.metrics.value(mWake, "failed"); got != want {
			t.Errorf("after failure %d: wake_total{failed} = %v, want %v", i+1, got, want)
		}
	}
	if got := a.metrics.value(mFailed, "pull"); got != 3 {
		t.Errorf("lifecycle_failed_total{pull} = %v, want 3 (every retry)", got)
	}
}

func TestMetricsExportCheckedLabelsAtZero(t *testing.T) {
	m, err := newMetrics(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := m.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`nodeagent_wake_total{result="failed"} 0`, `nodeagent_startup_resume_total{op="ready_wait"} 0`,
		`nodeagent_hibernate_evidence_total{verdict="none"} 0`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
}

// TestWedgeIsReportedAndPersisted: an intent parked failed past its budget
// gets one wedge event naming it and its reason, and the counter, both
// read back from disk; an intent at its goal is never reported.
func TestWedgeIsReportedAndPersisted(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ReadyBudget, cfg.RetryMax, cfg.ReadyTick = 20*time.Millisecond, 10*time.Millisecond, 5*time.Millisecond
	a := testAgent(t, cfg)
	for _, r := range []*record{
		{Name: "stuck", Generation: 1, Intent: Intent{Snapshot: "base"}, Op: opCreate, Step: stepCloned, FailedGen: 1,
			Status: Status{Lifecycle: LifecycleFailed, FailedReason: "clone", FailedAttempts: 9}},
		{Name: "fine", Generation: 1, Intent: Intent{Snapshot: "base"}, Status: Status{Lifecycle: LifecycleReady, VMID: "V1"}},
	} {
		if err := a.store.put(r); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.watchWedges(ctx, time.Now()) }()
	deadline := time.Now().Add(10 * time.Second) // a safety net, not a timing assertion
	for len(a.events.list()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	l, err := openEventLog(a.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	evs := l.list()
	if len(evs) != 1 {
		t.Fatalf("persisted events %+v, want the one wedge", evs)
	}
	if e := evs[0]; e.Kind != api.EventWedged || e.VM != "stuck" || e.Op != opCreate || e.Reason != "clone" || !strings.Contains(e.Message, "budget") {
		t.Errorf("event %+v", e)
	}
	m, err := newMetrics(a.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.value(mWedged, opCreate, "clone"); got != 1 {
		t.Errorf("persisted wedged_total{create,clone} = %v, want 1", got)
	}
}

func TestEventLogKeepsTheNewest(t *testing.T) {
	l, err := openEventLog(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < api.EventsKept+3; i++ {
		if err := l.add(api.Event{VM: "v", StuckSecs: float64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	evs := l.list()
	if len(evs) != api.EventsKept || evs[0].StuckSecs != 3 {
		t.Errorf("kept %d, first %v; want %d from 3", len(evs), evs[0].StuckSecs, api.EventsKept)
	}
}
