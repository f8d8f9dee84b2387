package checker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one scrape: series key → value, keyed `name{a="x",b="y"}` with
// labels sorted by name. StartNs is when the request was sent, TsNs when the
// answer was read: a sample started after a restart was served by the new
// process, one read before it by the old one.
type Sample struct {
	StartNs int64
	TsNs    int64
	Values  map[string]float64
	Types   map[string]string // metric family → counter|gauge|histogram|summary|untyped
}

// ParseText parses a scrape of the agent's metrics endpoint with expfmt's
// text parser: values keyed by canonical series key (a histogram flattened
// into its _bucket/_sum/_count series, a summary into its quantiles, _sum and
// _count), and each family's type.
func ParseText(r io.Reader) (Sample, error) {
	s := Sample{Values: map[string]float64{}, Types: map[string]string{}}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return s, fmt.Errorf("metrics: %w", err)
	}
	for name, mf := range mfs {
		s.Types[name] = strings.ToLower(mf.GetType().String())
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				if _, dup := labels[lp.GetName()]; dup {
					return s, fmt.Errorf("metrics: %s: duplicate label %q", name, lp.GetName())
				}
				labels[lp.GetName()] = lp.GetValue()
			}
			put := func(series string, extra []string, v float64) error {
				l := labels
				if len(extra) == 2 {
					if _, dup := labels[extra[0]]; dup {
						return fmt.Errorf("metrics: %s: label %q clashes", name, extra[0])
					}
					l = map[string]string{extra[0]: extra[1]}
					for k, v := range labels {
						l[k] = v
					}
				}
				s.Values[Key(series, l)] = v
				return nil
			}
			var errs []error
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				errs = append(errs, put(name, nil, m.GetCounter().GetValue()))
			case dto.MetricType_GAUGE:
				errs = append(errs, put(name, nil, m.GetGauge().GetValue()))
			case dto.MetricType_UNTYPED:
				errs = append(errs, put(name, nil, m.GetUntyped().GetValue()))
			case dto.MetricType_SUMMARY:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					errs = append(errs, put(name, []string{model.QuantileLabel, fmtFloat(q.GetQuantile())}, q.GetValue()))
				}
				errs = append(errs, put(name+"_sum", nil, sm.GetSampleSum()), put(name+"_count", nil, float64(sm.GetSampleCount())))
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					errs = append(errs, put(name+"_bucket", []string{model.BucketLabel, fmtFloat(b.GetUpperBound())}, float64(b.GetCumulativeCount())))
				}
				errs = append(errs, put(name+"_sum", nil, h.GetSampleSum()), put(name+"_count", nil, float64(h.GetSampleCount())))
			default:
				return s, fmt.Errorf("metrics: %s: unsupported type %v", name, mf.GetType())
			}
			for _, err := range errs {
				if err != nil {
					return s, err
				}
			}
		}
	}
	return s, nil
}

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

// Key is the canonical series key: labels sorted by name, values escaped as
// the text format escapes them.
func Key(name string, labels map[string]string) string {
	if len(labels) == 0 {
		return name
	}
	ks := make([]string, 0, len(labels))
	for k := range labels {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = k + `="` + labelEscaper.Replace(labels[k]) + `"`
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}

// Canonical re-keys a series written by hand (`name{b="y",a="x"}`) so it
// compares equal to the keys ParseText returns; a series that does not parse
// is returned unchanged (and then matches nothing).
func Canonical(series string) string {
	smp, err := ParseText(strings.NewReader(series + " 0\n"))
	if err != nil || len(smp.Values) != 1 {
		return series
	}
	for k := range smp.Values {
		return k
	}
	return series
}

// family returns the metric family of a series key (histogram suffixes removed).
func family(key string, types map[string]string) (string, string) {
	name := key
	if i := strings.IndexByte(key, '{'); i >= 0 {
		name = key[:i]
	}
	if t, ok := types[name]; ok {
		return name, t
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if b := strings.TrimSuffix(name, suf); b != name {
			if t, ok := types[b]; ok {
				return b, t
			}
		}
	}
	return name, ""
}

// Scraper samples the agent's metrics endpoint in the background, so a
// counter that went backwards across a restart is seen even though no single
// scrape shows both sides.
type Scraper struct {
	addr    func() string // current address (the agent rebinds :0 on restart)
	client  *http.Client
	mu      sync.Mutex
	samples []Sample
	// failures: scrapes that returned no sample, kept so that a check
	// never reads "no sample" as "nothing happened"
	failures []ScrapeFailure
	since    int64
	cancel   context.CancelFunc
	done     chan struct{}
	// one scrape at a time (the background one and ScrapeNow): samples
	// are then in the order the agent answered them, and a counter read
	// earlier but appended later can never look like one going backwards
	scrapeMu sync.Mutex
}

// NewScraper starts sampling every interval; addr returns "" while unknown.
func NewScraper(addr func() string, every time.Duration, now func() int64) *Scraper {
	return NewScraperDial(addr, nil, every, now)
}

// NewScraperDial is NewScraper over dial (nil: a plain dial): an agent in
// a network namespace of the case listens where only a dial from inside
// reaches it.
func NewScraperDial(addr func() string, dial func(ctx context.Context, network, addr string) (net.Conn, error), every time.Duration, now func() int64) *Scraper {
	ctx, cancel := context.WithCancel(context.Background())
	cl := &http.Client{Timeout: 2 * time.Second}
	if dial != nil {
		cl.Transport = &http.Transport{DialContext: dial, DisableKeepAlives: true}
	}
	s := &Scraper{addr: addr, client: cl, cancel: cancel, done: make(chan struct{}), since: now()}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.scrapeOnce(ctx, cl, now)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// ScrapeNow takes one sample synchronously (before the fault, at the end).
func (s *Scraper) ScrapeNow(ctx context.Context, now func() int64) bool {
	cl := s.client
	if cl == nil { // a Scraper not made by NewScraper: plain dials
		cl = &http.Client{Timeout: 2 * time.Second}
	}
	return s.scrapeOnce(ctx, cl, now)
}

func (s *Scraper) scrapeOnce(ctx context.Context, cl *http.Client, now func() int64) bool {
	s.scrapeMu.Lock()
	defer s.scrapeMu.Unlock()
	a := s.addr()
	if a == "" {
		return false // the agent has not published its address (yet): no scrape was made
	}
	start := now()
	smp, down, err := scrape(ctx, cl, a)
	if err != nil {
		if ctx.Err() != nil {
			return false // the scraper was stopped mid-request: not the agent's doing
		}
		s.mu.Lock()
		s.failures = append(s.failures, ScrapeFailure{TsNs: now(), Err: err.Error(), Down: down})
		s.mu.Unlock()
		return false
	}
	smp.StartNs, smp.TsNs = start, now()
	s.mu.Lock()
	s.samples = append(s.samples, smp)
	s.mu.Unlock()
	return true
}

// scrape GETs /metrics; down reports that no answer came (the agent between
// two lives), as opposed to an answer that was wrong.
func scrape(ctx context.Context, cl *http.Client, addr string) (Sample, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return Sample{}, false, err
	}
	resp, err := cl.Do(req)
	if err != nil {
		// no answer (refused, reset, timed out): the agent is down or
		// dying, a gap rather than a wrong answer
		return Sample{}, true, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Sample{}, false, fmt.Errorf("scrape %s: HTTP %d", addr, resp.StatusCode)
	}
	// A body cut off by the agent's death is a gap, not a wrong answer:
	// read it whole before judging what it says.
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return Sample{}, true, fmt.Errorf("scrape %s: read: %w", addr, err)
	}
	smp, err := ParseText(bytes.NewReader(body))
	if err != nil {
		return Sample{}, false, fmt.Errorf("scrape %s: %w", addr, err)
	}
	return smp, false, nil
}

// Failures returns every scrape that returned no sample.
func (s *Scraper) Failures() []ScrapeFailure {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ScrapeFailure(nil), s.failures...)
}

// Stop ends sampling.
func (s *Scraper) Stop() {
	s.cancel()
	<-s.done
}

// Samples returns every sample so far.
func (s *Scraper) Samples() []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sample(nil), s.samples...)
}

// Backwards returns, for each counter or histogram series that went down
// from one sample to a later one, one line of evidence. Later means in real
// time: b follows a only when a's answer was read before b's request was
// sent. Two scrapes in flight at once (the background sampler's and a
// ScrapeNow's) can be answered in one order and read in the other, and
// completion order then shows a counter going down that never did — a false
// `metrics-monotonic` fail seen on loaded machines. Samples without times
// (built by hand) are ordered as given.
func Backwards(samples []Sample) []string {
	n := len(samples)
	start, end := make([]int64, n), make([]int64, n)
	for i, s := range samples {
		start[i], end[i] = s.StartNs, s.TsNs
		if s.StartNs == 0 && s.TsNs == 0 {
			start[i], end[i] = int64(i), int64(i)
		}
	}
	byStart, byEnd := make([]int, n), make([]int, n)
	for i := range samples {
		byStart[i], byEnd[i] = i, i
	}
	sort.SliceStable(byStart, func(a, b int) bool { return start[byStart[a]] < start[byStart[b]] })
	sort.SliceStable(byEnd, func(a, b int) bool { return end[byEnd[a]] < end[byEnd[b]] })
	// peak: per monotonic series, the highest value among the samples read
	// before the current one was requested, and which sample showed it.
	type peak struct {
		v  float64
		at int
	}
	peaks := map[string]peak{}
	var out []string
	seen := map[string]bool{}
	next := 0
	for _, b := range byStart {
		for ; next < n && end[byEnd[next]] < start[b]; next++ {
			a := byEnd[next]
			for k, v := range samples[a].Values {
				if _, typ := family(k, samples[a].Types); typ != "counter" && typ != "histogram" && typ != "summary" {
					continue
				}
				if p, ok := peaks[k]; !ok || v > p.v {
					peaks[k] = peak{v, a}
				}
			}
		}
		for k, p := range peaks {
			cv, ok := samples[b].Values[k]
			if !ok {
				cv = 0 // a series that vanished was reset
			}
			if cv < p.v && !seen[k] {
				seen[k] = true
				out = append(out, fmt.Sprintf("%s went %g → %g between samples %d and %d", k, p.v, cv, p.at, b))
			}
		}
	}
	sort.Strings(out)
	return out
}

// Since is when sampling began: every agent restart after it must have
// samples on both sides.
func (s *Scraper) Since() int64 { return s.since }
