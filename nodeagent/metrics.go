package nodeagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/regress"
)

// Metric names (docs/architecture.md §6).
const (
	mStaleCreate  = "nodeagent_stale_create_reconcile_total"
	mStartup      = "nodeagent_startup_resume_total"
	mHibernate    = "nodeagent_hibernate_total"
	mWake         = "nodeagent_wake_total"
	mSave         = "nodeagent_snapshot_save_total"
	mOrphan       = "nodeagent_orphan_vm_total"
	mEvidence     = "nodeagent_hibernate_evidence_total"
	mFailed       = "nodeagent_lifecycle_failed_total"
	mWedged       = "nodeagent_wedged_total"
	mOpDuration   = "nodeagent_operation_duration_seconds"
	metricsFile   = "metrics.json"
	metricsFormat = 1
)

type metricDef struct {
	name, help string
	labels     []string
}

var counterDefs = []metricDef{
	{mStaleCreate, "Outcomes of vm reconcile-stale-create invocations (startup and busy-create watch).", []string{"outcome"}},
	{mStartup, "Operations resumed at startup from durable markers.", []string{"op"}},
	{mHibernate, "Hibernate phases by result.", []string{"phase", "result"}},
	{mWake, "Wake operations by outcome: ok once it is ready, failed once it gave up (retries exhausted); its failed retries count in nodeagent_lifecycle_failed_total.", []string{"result"}},
	{mSave, "snapshot save attempts by result (name-held recovery included).", []string{"result"}},
	{mOrphan, "VMs found at startup that no intent owns (counted once per VM id).", nil},
	{mEvidence, "Hibernate-evidence lookups before a fresh create (resumed ones included), by verdict.", []string{"verdict"}},
	{mFailed, "lifecycle failed writes, by reason.", []string{"reason"}},
	{mWedged, "Intents found stuck past their operation's budget (one per episode), by operation and reason; each is also an event on GET /v1/events naming the VM.", []string{"op", "reason"}},
}

// knownLabels are the label values of a counter exported at 0 from the
// start: a check that a counter did not move needs the series to exist, and
// a series that appears only on its first increment cannot tell "0" from
// "not exported".
var knownLabels = map[string][][]string{
	mStartup:  {{opCreate}, {opWake}, {opHibernate}, {opDelete}, {"post_clone"}, {"ready_wait"}},
	mWake:     {{"ok"}, {"failed"}},
	mEvidence: {{"registry"}, {"local"}, {"none"}, {"error"}},
}

var histDef = metricDef{mOpDuration, "Duration of one pass of an operation, by op and result.", []string{"op", "result"}}

// Buckets of the duration histogram, in seconds (scale 1 values; a fast
// suite lands in the low buckets).
var durationBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

type histState struct {
	Buckets []uint64 `json:"buckets"` // cumulative counts, one per durationBuckets entry
	Count   uint64   `json:"count"`
	Sum     float64  `json:"sum"`
}

type metricsState struct {
	Format     int                              `json:"format"`
	Counters   map[string]map[string]float64    `json:"counters"`   // name → label key → value
	Histograms map[string]map[string]*histState `json:"histograms"` // name → label key → state
	Orphans    map[string]bool                  `json:"orphans"`    // VM ids already counted
}

// metrics is the agent's own metric state. The counters are client_golang
// CounterVecs in a private registry, served with promhttp; st mirrors them
// and is persisted to <state>/metrics.json after every change, so the
// counters survive the very restart they describe (seed 001, observability):
// at start each persisted value is Added to its counter. client_golang has no
// way to seed a Histogram's buckets, so the duration histogram is a
// Collector of ours that emits const histograms from st.
type metrics struct {
	path     string
	reg      *prometheus.Registry
	counters map[string]*prometheus.CounterVec
	handler  http.Handler

	mu  sync.Mutex // guards st, err and keeps each counter in step with its mirror
	st  metricsState
	err error // last persist error, reported once
}

func newMetrics(stateDir string) (*metrics, error) {
	m := &metrics{path: filepath.Join(stateDir, metricsFile), reg: prometheus.NewRegistry(),
		counters: map[string]*prometheus.CounterVec{}}
	m.st = metricsState{Format: metricsFormat, Counters: map[string]map[string]float64{},
		Histograms: map[string]map[string]*histState{}, Orphans: map[string]bool{}}
	for _, d := range counterDefs {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: d.name, Help: d.help}, d.labels)
		if len(d.labels) == 0 {
			v.WithLabelValues() // a label-less counter is exposed from the start, at 0
		}
		for _, lv := range knownLabels[d.name] {
			v.WithLabelValues(lv...)
		}
		m.counters[d.name] = v
		m.reg.MustRegister(v)
	}
	m.reg.MustRegister(durationCollector{m: m, desc: prometheus.NewDesc(histDef.name, histDef.help, histDef.labels, nil)})
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError})

	// metrics-process-local: the historical bug kept counters in process
	// memory only, so every restart reset them.
	if regress.On("metrics-process-local") {
		return m, nil
	}
	b, err := os.ReadFile(m.path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	var st metricsState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("metrics: %s is corrupt: %w", m.path, err)
	}
	if err := m.restore(st); err != nil {
		return nil, fmt.Errorf("metrics: %s is corrupt: %w", m.path, err)
	}
	return m, nil
}

// restore adds the persisted values to the fresh counters and takes the
// persisted histograms as they are. A value a counter cannot take (negative,
// NaN, wrong label count) is an error: silently dropping it would make the
// counter go backwards.
func (m *metrics) restore(st metricsState) error {
	for name, vals := range st.Counters {
		vec := m.counters[name]
		for k, v := range vals {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return fmt.Errorf("counter %s{%s} has value %v", name, k, v)
			}
			if vec == nil {
				continue // a counter this build no longer has: kept on disk, not served
			}
			c, err := vec.GetMetricWithLabelValues(labelValues(k)...)
			if err != nil {
				return fmt.Errorf("counter %s: %w", name, err)
			}
			c.Add(v)
		}
		m.st.Counters[name] = vals
	}
	for name, hs := range st.Histograms {
		for k, h := range hs {
			if h == nil || len(h.Buckets) != len(durationBuckets) {
				return fmt.Errorf("histogram %s{%s}: want %d buckets", name, k, len(durationBuckets))
			}
			if name == histDef.name && len(labelValues(k)) != len(histDef.labels) {
				return fmt.Errorf("histogram %s: label key %q: want %d labels", name, k, len(histDef.labels))
			}
		}
		m.st.Histograms[name] = hs
	}
	for id, ok := range st.Orphans {
		m.st.Orphans[id] = ok
	}
	return nil
}

func labelKey(kv []string) string {
	return strings.Join(kv, "\x1f")
}

func labelValues(key string) []string {
	if key == "" {
		return nil
	}
	return strings.Split(key, "\x1f")
}

// inc adds 1 to a counter; values are given in the order of the definition's labels.
func (m *metrics) inc(name string, values ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.addLocked(name, values)
}

func (m *metrics) addLocked(name string, values []string) {
	vec := m.counters[name]
	if vec == nil {
		fmt.Fprintf(os.Stderr, "nodeagent: metrics: no counter %s\n", name)
		return
	}
	c, err := vec.GetMetricWithLabelValues(values...)
	if err != nil {
		// A caller's bug; the agent keeps running and says so.
		fmt.Fprintf(os.Stderr, "nodeagent: metrics: %s%q: %v\n", name, values, err)
		return
	}
	c.Inc()
	vals := m.st.Counters[name]
	if vals == nil {
		vals = map[string]float64{}
		m.st.Counters[name] = vals
	}
	vals[labelKey(values)]++
	m.persistLocked()
}

// orphan counts a VM id once across restarts.
func (m *metrics) orphan(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.st.Orphans[id] {
		return
	}
	m.st.Orphans[id] = true
	m.addLocked(mOrphan, nil)
}

func (m *metrics) observe(op, result string, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.st.Histograms[mOpDuration]
	if h == nil {
		h = map[string]*histState{}
		m.st.Histograms[mOpDuration] = h
	}
	k := labelKey([]string{op, result})
	s := h[k]
	if s == nil {
		s = &histState{Buckets: make([]uint64, len(durationBuckets))}
		h[k] = s
	}
	v := d.Seconds()
	for i, ub := range durationBuckets {
		if v <= ub {
			s.Buckets[i]++
		}
	}
	s.Count++
	s.Sum += v
	m.persistLocked()
}

// value returns one counter's value (tests and logs).
func (m *metrics) value(name string, values ...string) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Counters[name][labelKey(values)]
}

func (m *metrics) persistLocked() {
	b, err := json.Marshal(m.st)
	if err == nil {
		err = durable.WriteFile(m.path, b, 0o644)
	}
	if err != nil && m.err == nil {
		fmt.Fprintln(os.Stderr, "nodeagent: persist metrics:", err)
	}
	m.err = err
}

// durationCollector emits the duration histogram from the persisted state,
// one const histogram per (op, result).
type durationCollector struct {
	m    *metrics
	desc *prometheus.Desc
}

func (c durationCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c durationCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	hs := c.m.st.Histograms[histDef.name]
	out := make([]prometheus.Metric, 0, len(hs))
	for _, k := range sortedKeys(hs) {
		s := hs[k]
		buckets := make(map[float64]uint64, len(durationBuckets))
		for i, ub := range durationBuckets {
			buckets[ub] = s.Buckets[i]
		}
		h, err := prometheus.NewConstHistogram(c.desc, s.Count, s.Sum, buckets, labelValues(k)...)
		if err != nil {
			h = prometheus.NewInvalidMetric(c.desc, err)
		}
		out = append(out, h)
	}
	c.m.mu.Unlock()
	for _, h := range out {
		ch <- h
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// WriteText writes every metric in the Prometheus text exposition format
// (version 0.0.4), as the /metrics endpoint serves it.
func (m *metrics) WriteText(w io.Writer) error {
	mfs, gerr := m.reg.Gather()
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return fmt.Errorf("metrics: encode %s: %w", mf.GetName(), err)
		}
	}
	if gerr != nil {
		return fmt.Errorf("metrics: gather: %w", gerr)
	}
	return nil
}

// ServeHTTP serves /metrics through promhttp (content negotiation, gzip).
func (m *metrics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.handler.ServeHTTP(w, r)
}
