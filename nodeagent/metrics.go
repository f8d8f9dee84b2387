package nodeagent

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/regress"
)

// Metric names (ARCHITECTURE §6).
const (
	mStaleCreate  = "nodeagent_stale_create_reconcile_total"
	mStartup      = "nodeagent_startup_resume_total"
	mHibernate    = "nodeagent_hibernate_total"
	mWake         = "nodeagent_wake_total"
	mSave         = "nodeagent_snapshot_save_total"
	mOrphan       = "nodeagent_orphan_vm_total"
	mEvidence     = "nodeagent_hibernate_evidence_total"
	mFailed       = "nodeagent_lifecycle_failed_total"
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
	{mWake, "Wake attempts by result.", []string{"result"}},
	{mSave, "snapshot save attempts by result (name-held recovery included).", []string{"result"}},
	{mOrphan, "VMs found at startup that no intent owns (counted once per VM id).", nil},
	{mEvidence, "Hibernate-evidence lookups before a fresh create, by verdict.", []string{"verdict"}},
	{mFailed, "lifecycle failed writes, by reason.", []string{"reason"}},
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

// metrics is the agent's own metric state, exposed through a Collector and
// persisted to <state>/metrics.json after every change, so the counters
// survive the very restart they describe (seed 001, observability).
type metrics struct {
	path string
	mu   sync.Mutex
	st   metricsState
	err  error // last persist error, reported once
}

func newMetrics(stateDir string) (*metrics, error) {
	m := &metrics{path: filepath.Join(stateDir, metricsFile)}
	m.st = metricsState{Format: metricsFormat, Counters: map[string]map[string]float64{},
		Histograms: map[string]map[string]*histState{}, Orphans: map[string]bool{}}
	// metrics-process-local: the historical bug kept counters in process
	// memory only, so every restart reset them.
	if regress.On("metrics-process-local") {
		return m, nil
	}
	b, err := os.ReadFile(m.path)
	if os.IsNotExist(err) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	var st metricsState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("metrics: %s is corrupt: %w", m.path, err)
	}
	if st.Counters != nil {
		m.st.Counters = st.Counters
	}
	if st.Histograms != nil {
		m.st.Histograms = st.Histograms
	}
	if st.Orphans != nil {
		m.st.Orphans = st.Orphans
	}
	return m, nil
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
	c := m.st.Counters[name]
	if c == nil {
		c = map[string]float64{}
		m.st.Counters[name] = c
	}
	c[labelKey(values)]++
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
	c := m.st.Counters[mOrphan]
	if c == nil {
		c = map[string]float64{}
		m.st.Counters[mOrphan] = c
	}
	c[""]++
	m.persistLocked()
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
	if s == nil || len(s.Buckets) != len(durationBuckets) {
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

// WriteText writes every metric in the Prometheus text exposition format
// (version 0.0.4). The client_golang registry is not used: this state is the
// agent's own (restored from disk), and the text format is small and stable.
func (m *metrics) WriteText(w io.Writer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	for _, d := range counterDefs {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n", d.name, d.help, d.name)
		vals := m.st.Counters[d.name]
		if len(d.labels) == 0 {
			fmt.Fprintf(&b, "%s %s\n", d.name, formatFloat(vals[""]))
			continue
		}
		for _, k := range sortedKeys(vals) {
			fmt.Fprintf(&b, "%s{%s} %s\n", d.name, formatLabels(d.labels, labelValues(k)), formatFloat(vals[k]))
		}
	}
	d := histDef
	fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s histogram\n", d.name, d.help, d.name)
	hs := m.st.Histograms[d.name]
	for _, k := range sortedKeys(hs) {
		s := hs[k]
		lbl := formatLabels(d.labels, labelValues(k))
		for i, ub := range durationBuckets {
			var c uint64
			if i < len(s.Buckets) {
				c = s.Buckets[i]
			}
			fmt.Fprintf(&b, "%s_bucket{%s,le=\"%s\"} %d\n", d.name, lbl, formatFloat(ub), c)
		}
		fmt.Fprintf(&b, "%s_bucket{%s,le=\"+Inf\"} %d\n", d.name, lbl, s.Count)
		fmt.Fprintf(&b, "%s_sum{%s} %s\n", d.name, lbl, formatFloat(s.Sum))
		fmt.Fprintf(&b, "%s_count{%s} %d\n", d.name, lbl, s.Count)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func formatFloat(v float64) string {
	return strconv.FormatFloat(v, 'g', -1, 64)
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

func formatLabels(names, values []string) string {
	parts := make([]string, 0, len(names))
	for i, n := range names {
		v := ""
		if i < len(values) {
			v = values[i]
		}
		parts = append(parts, n+`="`+labelEscaper.Replace(v)+`"`)
	}
	return strings.Join(parts, ",")
}

// ServeHTTP serves /metrics.
func (m *metrics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_ = m.WriteText(w)
}
