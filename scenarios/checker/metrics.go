package checker

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/nodeagent"
)

// Sample is one scrape: series key → value, keyed `name{a="x",b="y"}` with
// labels sorted by name.
type Sample struct {
	TsNs   int64
	Values map[string]float64
	Types  map[string]string // metric family → counter|gauge|histogram|summary|untyped
}

// ParseText parses a scrape of the agent's metrics endpoint with expfmt
// (through nodeagent.ParseMetricsFamilies): values keyed by canonical series
// key, and each family's type.
func ParseText(r io.Reader) (Sample, error) {
	s := Sample{Values: map[string]float64{}}
	samples, types, err := nodeagent.ParseMetricsFamilies(r)
	if err != nil {
		return s, err
	}
	s.Types = types
	for _, m := range samples {
		s.Values[m.Key()] = m.Value
	}
	return s, nil
}

// Key is the canonical series key: labels sorted by name, values escaped as
// the text format escapes them.
func Key(name string, labels map[string]string) string {
	return nodeagent.Sample{Name: name, Labels: labels}.Key()
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
	mu      sync.Mutex
	samples []Sample
	cancel  context.CancelFunc
	done    chan struct{}
}

// NewScraper starts sampling every interval; addr returns "" while unknown.
func NewScraper(addr func() string, every time.Duration, now func() int64) *Scraper {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Scraper{addr: addr, cancel: cancel, done: make(chan struct{})}
	cl := &http.Client{Timeout: 2 * time.Second}
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
	return s.scrapeOnce(ctx, &http.Client{Timeout: 2 * time.Second}, now)
}

func (s *Scraper) scrapeOnce(ctx context.Context, cl *http.Client, now func() int64) bool {
	a := s.addr()
	if a == "" {
		return false
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a+"/metrics", nil)
	if err != nil {
		return false
	}
	resp, err := cl.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	smp, err := ParseText(resp.Body)
	if err != nil {
		return false
	}
	smp.TsNs = now()
	s.mu.Lock()
	s.samples = append(s.samples, smp)
	s.mu.Unlock()
	return true
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

// Backwards returns, for each counter or histogram series that ever
// decreased between consecutive samples, one line of evidence.
func Backwards(samples []Sample) []string {
	var out []string
	seen := map[string]bool{}
	for i := 1; i < len(samples); i++ {
		prev, cur := samples[i-1], samples[i]
		for k, pv := range prev.Values {
			_, typ := family(k, prev.Types)
			if typ != "counter" && typ != "histogram" && typ != "summary" {
				continue
			}
			cv, ok := cur.Values[k]
			if !ok {
				cv = 0 // a series that vanished was reset
			}
			if cv < pv && !seen[k] {
				seen[k] = true
				out = append(out, fmt.Sprintf("%s went %g → %g between samples %d and %d", k, pv, cv, i-1, i))
			}
		}
	}
	sort.Strings(out)
	return out
}
