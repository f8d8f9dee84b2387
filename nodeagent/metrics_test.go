package nodeagent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/regress"
)

// serveMetrics serves m on a real loopback HTTP listener, as the agent does.
func serveMetrics(t *testing.T, m *metrics) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return "http://" + ln.Addr().String() + "/metrics"
}

// scrapeURL GETs the endpoint and returns series key → value and the
// Content-Type it was served with.
func scrapeURL(t *testing.T, url string) (map[string]float64, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %d %v\n%s", resp.StatusCode, err, b)
	}
	samples, err := ParseMetricsText(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("scrape does not parse: %v\n%s", err, b)
	}
	got := map[string]float64{}
	for _, s := range samples {
		got[s.Key()] = s.Value
	}
	return got, resp.Header.Get("Content-Type")
}

func wantSeries(t *testing.T, got map[string]float64, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}

// TestMetricsPromhttpAcrossRestart: the client_golang registry served by
// promhttp carries the persisted values of the previous process and keeps
// counting from them; the duration histogram keeps its buckets.
func TestMetricsPromhttpAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	m, err := newMetrics(dir)
	if err != nil {
		t.Fatal(err)
	}
	url := serveMetrics(t, m)
	got, ctype := scrapeURL(t, url)
	if !strings.HasPrefix(ctype, "text/plain; version=0.0.4") {
		t.Fatalf("Content-Type %q", ctype)
	}
	// The label-less counter is exposed before anything happened.
	wantSeries(t, got, map[string]float64{mOrphan: 0})
	m.inc(mStaleCreate, "busy")
	m.inc(mStaleCreate, "busy")
	m.inc(mWake, "ok")
	m.orphan("ID1")
	m.observe("create", "ok", 30*time.Millisecond)
	m.observe("create", "ok", 1500*time.Millisecond)
	got, _ = scrapeURL(t, url)
	wantSeries(t, got, map[string]float64{
		`nodeagent_stale_create_reconcile_total{outcome="busy"}`: 2,
		`nodeagent_wake_total{result="ok"}`:                      1,
		mOrphan:                                                  1,
		`nodeagent_operation_duration_seconds_count{op="create",result="ok"}`:            2,
		`nodeagent_operation_duration_seconds_bucket{le="0.05",op="create",result="ok"}`: 1,
		`nodeagent_operation_duration_seconds_bucket{le="2.5",op="create",result="ok"}`:  2,
		`nodeagent_operation_duration_seconds_bucket{le="+Inf",op="create",result="ok"}`: 2,
	})

	// The next process: restored, then counting on from the restored values.
	m2, err := newMetrics(dir)
	if err != nil {
		t.Fatal(err)
	}
	url2 := serveMetrics(t, m2)
	m2.inc(mStaleCreate, "busy")
	m2.orphan("ID1") // already counted by the previous process
	m2.orphan("ID2")
	m2.observe("create", "ok", 400*time.Second) // past the last bound
	got2, _ := scrapeURL(t, url2)
	wantSeries(t, got2, map[string]float64{
		`nodeagent_stale_create_reconcile_total{outcome="busy"}`: 3,
		`nodeagent_wake_total{result="ok"}`:                      1,
		mOrphan:                                                  2,
		`nodeagent_operation_duration_seconds_count{op="create",result="ok"}`:            3,
		`nodeagent_operation_duration_seconds_bucket{le="0.05",op="create",result="ok"}`: 1,
		`nodeagent_operation_duration_seconds_bucket{le="300",op="create",result="ok"}`:  2,
		`nodeagent_operation_duration_seconds_bucket{le="+Inf",op="create",result="ok"}`: 3,
	})
	if s := got2[`nodeagent_operation_duration_seconds_sum{op="create",result="ok"}`]; s < 401.5 || s > 401.6 {
		t.Errorf("histogram sum %v, want 401.53", s)
	}
	for k, v := range got {
		if got2[k] < v {
			t.Errorf("%s went backwards across the restart: %v → %v", k, v, got2[k])
		}
	}
	// WriteText is what the endpoint serves.
	var b bytes.Buffer
	if err := m2.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"# TYPE nodeagent_stale_create_reconcile_total counter",
		"# TYPE nodeagent_operation_duration_seconds histogram",
	} {
		if !strings.Contains(b.String(), line+"\n") {
			t.Errorf("WriteText lacks %q:\n%s", line, b.String())
		}
	}
	// A labelled counter has no series until something is counted.
	if strings.Contains(b.String(), "nodeagent_hibernate_total{") {
		t.Errorf("uncounted series exposed:\n%s", b.String())
	}
}

// TestMetricsRestoreRejectsWhatACounterCannotTake: a persisted value the
// registry could not take is an error at start, never silently dropped
// (dropping it would make the counter go backwards).
func TestMetricsRestoreRejectsWhatACounterCannotTake(t *testing.T) {
	okHist := &histState{Buckets: make([]uint64, len(durationBuckets))}
	for name, st := range map[string]metricsState{
		"negative":    {Counters: map[string]map[string]float64{mWake: {"ok": -1}}},
		"arity":       {Counters: map[string]map[string]float64{mHibernate: {"snapshot": 1}}},
		"buckets":     {Histograms: map[string]map[string]*histState{mOpDuration: {labelKey([]string{"create", "ok"}): {Buckets: []uint64{1}}}}},
		"hist-labels": {Histograms: map[string]map[string]*histState{mOpDuration: {"create": okHist}}},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			b, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, metricsFile), b, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := newMetrics(dir); err == nil || !strings.Contains(err.Error(), "corrupt") {
				t.Fatalf("want a corrupt error, got %v", err)
			}
		})
	}
}

// TestMetricsConcurrentUpdatesAndScrapes (for -race): workers count while
// scrapes gather; the final scrape holds every increment.
func TestMetricsConcurrentUpdatesAndScrapes(t *testing.T) {
	m, err := newMetrics(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	url := serveMetrics(t, m)
	const workers, each = 4, 25
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				m.inc(mSave, "ok")
				m.observe("save", "ok", time.Millisecond)
				m.orphan(fmt.Sprintf("ID%d", i))
			}
		}()
	}
	ctx, cancel := context.WithCancel(context.Background())
	scraped := make(chan struct{})
	go func() {
		defer close(scraped)
		for ctx.Err() == nil {
			var b bytes.Buffer
			if err := m.WriteText(&b); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	cancel()
	<-scraped
	got, _ := scrapeURL(t, url)
	wantSeries(t, got, map[string]float64{
		`nodeagent_snapshot_save_total{result="ok"}`:                                   workers * each,
		`nodeagent_operation_duration_seconds_count{op="save",result="ok"}`:            workers * each,
		`nodeagent_operation_duration_seconds_bucket{le="0.01",op="save",result="ok"}`: workers * each,
		mOrphan: each,
	})
}

// TestMetricsProcessLocalSwitch: with the metrics-process-local regression
// switch on, a new process starts from zero although the state dir holds
// the previous values (and still writes them). regress reads its switches
// once per process, so the switched run is a child process of this binary.
func TestMetricsProcessLocalSwitch(t *testing.T) {
	if dir := os.Getenv("NODEAGENT_TEST_METRICS_DIR"); dir != "" {
		m, err := newMetrics(dir)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		before := m.value(mWake, "ok")
		m.inc(mWake, "ok")
		fmt.Printf("switch=%v before=%v\n", regress.On("metrics-process-local"), before)
		return
	}
	dir := t.TempDir()
	m, err := newMetrics(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.inc(mWake, "ok")
	m.inc(mWake, "ok")
	run := func(env ...string) string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMetricsProcessLocalSwitch$", "-test.count=1")
		cmd.Env = append(os.Environ(), append(env, "NODEAGENT_TEST_METRICS_DIR="+dir)...)
		out, err := cmd.CombinedOutput() // waits for and reaps the child
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := run(regress.Env + "=metrics-process-local"); !strings.Contains(out, "switch=true before=0\n") {
		t.Fatalf("with the switch on the child restored something:\n%s", out)
	}
	// The switched child still persisted its count (1): restore is what the
	// switch removes, not the writes.
	if out := run(regress.Env + "="); !strings.Contains(out, "switch=false before=1\n") {
		t.Fatalf("without the switch the child did not restore the persisted value:\n%s", out)
	}
}

func TestParseMetricsTextFlattensFamilies(t *testing.T) {
	in := `# HELP c_total A counter.
# TYPE c_total counter
c_total{b="2",a="x\"y\\z\n"} 3
# TYPE h histogram
h_bucket{op="x",le="0.5"} 1
h_bucket{op="x",le="+Inf"} 2
h_sum{op="x"} 1.25
h_count{op="x"} 2
# TYPE s summary
s{quantile="0.9"} 7
s_sum 8
s_count 9
u 4 1700000000000
`
	samples, err := ParseMetricsText(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	got := map[string]float64{}
	for _, s := range samples {
		keys = append(keys, s.Key())
		got[s.Key()] = s.Value
	}
	want := map[string]float64{
		`c_total{a="x\"y\\z\n",b="2"}`: 3,
		`h_bucket{le="0.5",op="x"}`:    1,
		`h_bucket{le="+Inf",op="x"}`:   2,
		`h_sum{op="x"}`:                1.25,
		`h_count{op="x"}`:              2,
		`s{quantile="0.9"}`:            7,
		`s_sum`:                        8,
		`s_count`:                      9,
		`u`:                            4,
	}
	if len(samples) != len(want) {
		t.Fatalf("got %d samples %v, want %d", len(samples), keys, len(want))
	}
	wantSeries(t, got, want)
	for name, bad := range map[string]string{
		"duplicate label":   "m{a=\"1\",a=\"2\"} 1\n",
		"le not a float":    "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_count 1\nh{le=\"x\"} 1\n",
		"no value":          "m{a=\"1\"}\n",
		"bad value":         "m one\n",
		"second TYPE":       "# TYPE m counter\n# TYPE m gauge\nm 1\n",
		"utf-8 name":        "{\"a.b\"} 1\n",
		"unknown escape":    "m{a=\"\\q\"} 1\n",
		"unterminated":      "m{a=\"1} 1\n",
		"bad label name":    "m{1a=\"1\"} 1\n",
		"negative bucket":   "# TYPE h histogram\nh_bucket{le=\"1\"} -1.5\n",
		"no newline at end": "m 1",
	} {
		s, err := ParseMetricsText(strings.NewReader(bad))
		if err == nil {
			t.Errorf("%s: accepted %q as %+v", name, bad, s)
		}
		t.Logf("%s: %v", name, err)
	}
}

// BenchmarkMetricsInc: one counted event, durable write of metrics.json included.
func BenchmarkMetricsInc(b *testing.B) {
	m, err := newMetrics(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		m.inc(mHibernate, "snapshot", "ok")
	}
}

// BenchmarkParseMetricsText: one scrape of an agent with every series present.
func BenchmarkParseMetricsText(b *testing.B) {
	m, err := newMetrics(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range []string{"begin", "start", "dhcp_release", "netresize", "snapshot", "push", "remove"} {
		m.inc(mHibernate, p, "ok")
		m.observe(p, "ok", time.Second)
	}
	var text bytes.Buffer
	if err := m.WriteText(&text); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(text.Len()))
	for b.Loop() {
		if _, err := ParseMetricsText(bytes.NewReader(text.Bytes())); err != nil {
			b.Fatal(err)
		}
	}
}
