package nodeagent

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// Sample is one line of a Prometheus text exposition.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Key renders the sample as name{k="v",...} with sorted labels.
func (s Sample) Key() string {
	if len(s.Labels) == 0 {
		return s.Name
	}
	ks := make([]string, 0, len(s.Labels))
	for k := range s.Labels {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = k + `="` + labelEscaper.Replace(s.Labels[k]) + `"`
	}
	return s.Name + "{" + strings.Join(parts, ",") + "}"
}

// ParseMetricsText parses the Prometheus text format (0.0.4) the agent
// serves: comments skipped, one sample per line, optional timestamp. It is a
// parser of outside input (a scrape), so it rejects rather than guesses.
func ParseMetricsText(r io.Reader) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseSampleLine(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w", n, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseSampleLine(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return s, fmt.Errorf("no value in %q", line)
	}
	s.Name = line[:i]
	if !validMetricName(s.Name) {
		return s, fmt.Errorf("bad metric name %q", s.Name)
	}
	rest := line[i:]
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, " ,")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.IndexByte(rest, '=')
			if eq <= 0 || len(rest) < eq+2 || rest[eq+1] != '"' {
				return s, fmt.Errorf("bad label in %q", line)
			}
			key := strings.TrimSpace(rest[:eq])
			if !validMetricName(key) {
				return s, fmt.Errorf("bad label name %q", key)
			}
			rest = rest[eq+2:]
			var val strings.Builder
			closed := false
			for j := 0; j < len(rest); j++ {
				c := rest[j]
				if c == '\\' && j+1 < len(rest) {
					j++
					switch rest[j] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(rest[j])
					}
					continue
				}
				if c == '"' {
					rest = rest[j+1:]
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return s, fmt.Errorf("unterminated label value in %q", line)
			}
			if _, dup := s.Labels[key]; dup {
				return s, fmt.Errorf("duplicate label %q", key)
			}
			s.Labels[key] = val.String()
		}
	}
	f := strings.Fields(rest)
	if len(f) < 1 || len(f) > 2 {
		return s, fmt.Errorf("want value [timestamp] in %q", line)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return s, fmt.Errorf("bad value in %q", line)
	}
	s.Value = v
	return s, nil
}

func validMetricName(n string) bool {
	if n == "" {
		return false
	}
	for i, c := range n {
		ok := c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9')
		if !ok {
			return false
		}
	}
	return true
}
