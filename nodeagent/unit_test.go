package nodeagent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func FuzzDecodeIntent(f *testing.F) {
	f.Add([]byte(`{"snapshot":"base","hibernate":true}`))
	f.Add([]byte(`{"snapshot":""}`))
	f.Add([]byte(`{"snapshot":"a"} {}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := DecodeIntent(b)
		if err == nil && in.Snapshot == "" {
			t.Fatalf("accepted an intent without a snapshot: %q", b)
		}
	})
}

func FuzzParseMetricsText(f *testing.F) {
	f.Add("# HELP x y\n# TYPE x counter\nx 1\n")
	f.Add(`a_total{outcome="busy"} 2` + "\n" + `h_bucket{op="create",le="+Inf"} 3 1700000000`)
	f.Add(`m{a="b\"c\\d\n"} 1e3`)
	f.Fuzz(func(t *testing.T, s string) {
		samples, err := ParseMetricsText(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, sm := range samples {
			if !validMetricName(sm.Name) {
				t.Fatalf("accepted bad name %q", sm.Name)
			}
			// A parsed sample re-renders and re-parses to itself.
			again, err := ParseMetricsText(strings.NewReader(sm.Key() + " 1\n"))
			if err != nil || len(again) != 1 || again[0].Key() != sm.Key() {
				t.Fatalf("round trip of %q: %v %+v", sm.Key(), err, again)
			}
		}
	})
}

// TestMetricsPersistAndRestore: every change is on disk, a new process
// (newMetrics on the same dir) starts from it, and the text exposition
// parses back to the same values.
func TestMetricsPersistAndRestore(t *testing.T) {
	dir := t.TempDir()
	m, err := newMetrics(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.inc(mStaleCreate, "busy")
	m.inc(mStaleCreate, "busy")
	m.inc(mStaleCreate, "collected")
	m.inc(mHibernate, "snapshot", "ok")
	m.orphan("ID1")
	m.orphan("ID1") // counted once per id
	m.observe("create", "ok", 1500*time.Millisecond)

	m2, err := newMetrics(dir)
	if err != nil {
		t.Fatal(err)
	}
	if v := m2.value(mStaleCreate, "busy"); v != 2 {
		t.Fatalf("busy restored as %v", v)
	}
	m2.orphan("ID1")
	if v := m2.value(mOrphan); v != 1 {
		t.Fatalf("orphan counted %v times", v)
	}
	var b bytes.Buffer
	if err := m2.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	samples, err := ParseMetricsText(&b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	got := map[string]float64{}
	for _, s := range samples {
		got[s.Key()] = s.Value
	}
	for k, want := range map[string]float64{
		`nodeagent_stale_create_reconcile_total{outcome="busy"}`:                        2,
		`nodeagent_stale_create_reconcile_total{outcome="collected"}`:                   1,
		`nodeagent_hibernate_total{phase="snapshot",result="ok"}`:                       1,
		`nodeagent_orphan_vm_total`:                                                     1,
		`nodeagent_operation_duration_seconds_count{op="create",result="ok"}`:           1,
		`nodeagent_operation_duration_seconds_bucket{le="2.5",op="create",result="ok"}`: 1,
		`nodeagent_operation_duration_seconds_bucket{le="1",op="create",result="ok"}`:   0,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v\n%s", k, got[k], want, b.String())
		}
	}
}

func TestMetricsCorruptFileIsAnError(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, metricsFile), []byte("{torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := newMetrics(dir); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("want a corrupt error, got %v", err)
	}
}

// TestStoreDurableRoundTrip: records survive a reopen; a corrupt record is an
// error, never silently dropped; temp files of an interrupted write are
// ignored; forget removes the file.
func TestStoreDurableRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s, err := openStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := &record{Name: "web", Intent: Intent{Snapshot: "base"}, Generation: 1, Op: opHibernate, Step: stepNICDropped}
	if err := s.put(r); err != nil {
		t.Fatal(err)
	}
	if _, err := s.update("web", func(r *record) error { r.Generation = 2; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vms", ".web.json.tmp-123"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	s2, err := openStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := s2.get("web")
	if got == nil || got.Generation != 2 || got.Step != stepNICDropped {
		t.Fatalf("reopened: %+v", got)
	}
	if err := s2.forget("web"); err != nil {
		t.Fatal(err)
	}
	if s3, _ := openStore(dir); s3.get("web") != nil {
		t.Fatal("forgotten record came back")
	}
	if err := os.WriteFile(filepath.Join(dir, "vms", "db.json"), []byte(`{"name":"db"`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := openStore(dir); err == nil {
		t.Fatal("a corrupt record was accepted")
	}
}

// TestResumeOpFromMarkers: owed work is derived from durable markers only,
// with the labels of startup_resume_total (seed 001 "what held up").
func TestResumeOpFromMarkers(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    record
		want string
	}{
		{"accepted, not started", record{}, opCreate},
		{"clone in flight", record{Op: opCreate, Status: Status{Lifecycle: LifecycleCreating}}, opCreate},
		{"post_clone running", record{Op: opCreate, Step: stepCloned, Status: Status{PostClone: PostCloneRunning}}, "post_clone"},
		{"post_clone done", record{Op: opWake, Step: stepCloned, Status: Status{PostClone: PostCloneDone}}, "ready_wait"},
		{"hibernate owed", record{Op: opHibernate, Step: stepDHCPReleased}, opHibernate},
		{"hibernate accepted, not begun", record{Intent: Intent{Hibernate: true}, Status: Status{Lifecycle: LifecycleReady}}, opHibernate},
		{"wake accepted, not begun", record{Status: Status{Lifecycle: LifecycleHibernated}}, opWake},
		{"delete accepted", record{Deleted: true, Status: Status{Lifecycle: LifecycleReady}}, opDelete},
		{"failed: retried by the failed path", record{Op: opCreate, Status: Status{Lifecycle: LifecycleFailed, PostClone: PostCloneFailed}}, ""},
		{"ready", record{Status: Status{Lifecycle: LifecycleReady}}, ""},
		{"hibernated", record{Intent: Intent{Hibernate: true}, Status: Status{Lifecycle: LifecycleHibernated}}, ""},
	} {
		if got := resumeOp(&tc.r); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestBackoffDoublesToCap(t *testing.T) {
	a := &Agent{cfg: Config{RetryBase: time.Second, RetryMax: 5 * time.Second}}
	for i, want := range []time.Duration{time.Second, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
		if got := a.backoff(i); got != want {
			t.Errorf("backoff(%d) = %v, want %v", i, got, want)
		}
	}
}
