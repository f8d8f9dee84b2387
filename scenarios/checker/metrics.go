package checker

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Sample is one scrape: series key → value, keyed `name{a="x",b="y"}` with
// labels sorted by name.
type Sample struct {
	TsNs   int64
	Values map[string]float64
	Types  map[string]string // metric family → counter|gauge|histogram|summary|untyped
}

// ParseText parses the Prometheus text exposition format (the subset
// client_golang writes: HELP/TYPE comments, name{labels} value [timestamp]).
// expfmt would do it, but its dependencies are not in this module's go.sum;
// the format is small and stable.
func ParseText(r io.Reader) (Sample, error) {
	s := Sample{Values: map[string]float64{}, Types: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	ln := 0
	for sc.Scan() {
		ln++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "#") {
			f := strings.Fields(line)
			if len(f) >= 4 && f[1] == "TYPE" {
				s.Types[f[2]] = f[3]
			}
			continue
		}
		key, rest, err := splitSeries(line)
		if err != nil {
			return s, fmt.Errorf("metrics line %d: %w", ln, err)
		}
		f := strings.Fields(rest)
		if len(f) < 1 || len(f) > 2 {
			return s, fmt.Errorf("metrics line %d: want value [timestamp]", ln)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return s, fmt.Errorf("metrics line %d: value: %w", ln, err)
		}
		s.Values[key] = v
	}
	return s, sc.Err()
}

// splitSeries returns the canonical series key and the text after it.
func splitSeries(line string) (string, string, error) {
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return "", "", fmt.Errorf("no metric name")
	}
	name := line[:i]
	if !validName(name) {
		return "", "", fmt.Errorf("bad metric name %q", name)
	}
	if line[i] != '{' {
		return name, line[i:], nil
	}
	labels, rest, err := parseLabels(line[i+1:])
	if err != nil {
		return "", "", err
	}
	return Key(name, labels), rest, nil
}

func validName(s string) bool {
	for i, r := range s {
		if !(r == '_' || r == ':' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || (i > 0 && r >= '0' && r <= '9')) {
			return false
		}
	}
	return s != ""
}

// parseLabels parses `a="x",b="y"}` and returns the labels and the rest.
func parseLabels(s string) (map[string]string, string, error) {
	out := map[string]string{}
	for {
		s = strings.TrimLeft(s, " \t,")
		if strings.HasPrefix(s, "}") {
			return out, s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return nil, "", fmt.Errorf("label: want name=\"value\"")
		}
		name := strings.TrimSpace(s[:eq])
		if !validName(name) {
			return nil, "", fmt.Errorf("bad label name %q", name)
		}
		s = strings.TrimLeft(s[eq+1:], " \t")
		if !strings.HasPrefix(s, `"`) {
			return nil, "", fmt.Errorf("label %s: value not quoted", name)
		}
		var b strings.Builder
		j := 1
		for ; j < len(s); j++ {
			c := s[j]
			if c == '\\' && j+1 < len(s) {
				j++
				switch s[j] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[j])
				}
				continue
			}
			if c == '"' {
				break
			}
			b.WriteByte(c)
		}
		if j >= len(s) {
			return nil, "", fmt.Errorf("label %s: unterminated value", name)
		}
		out[name] = b.String()
		s = s[j+1:]
	}
}

// Key is the canonical series key.
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
		parts[i] = k + "=" + strconv.Quote(labels[k])
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}

// Canonical re-keys a series written by hand (`name{b="y",a="x"}`).
func Canonical(series string) string {
	k, _, err := splitSeries(series + " 0")
	if err != nil {
		return series
	}
	return k
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
