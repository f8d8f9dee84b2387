package nodeagent

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one line of a Prometheus text exposition.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

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

// ParseMetricsText parses the Prometheus text format (0.0.4) with expfmt's
// text parser and flattens the metric families back into one Sample per
// exposition line: a histogram becomes its name_bucket{le=...}, name_sum and
// name_count samples, a summary its name{quantile=...}, name_sum and
// name_count. Families come sorted by name, series in the order they were
// read. Names are held to the legacy (pre-UTF-8) rules, which every name the
// agent serves follows; a scrape is outside input, so anything else, and a
// label repeated within one series (which expfmt leaves to its caller), is
// rejected rather than guessed at.
func ParseMetricsText(r io.Reader) ([]Sample, error) {
	out, _, err := ParseMetricsFamilies(r)
	return out, err
}

// ParseMetricsFamilies is ParseMetricsText that also returns each family's
// type ("counter", "gauge", "histogram", "summary", "untyped") by family name,
// for callers that must tell counters, which never go backwards, from gauges.
func ParseMetricsFamilies(r io.Reader) ([]Sample, map[string]string, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	var out []Sample
	types := make(map[string]string, len(mfs))
	for _, name := range sortedKeys(mfs) {
		mf := mfs[name]
		if !validMetricName(name) {
			return nil, nil, fmt.Errorf("metrics: bad metric name %q", name)
		}
		types[name] = strings.ToLower(mf.GetType().String())
		for _, m := range mf.GetMetric() {
			labels := make(map[string]string, len(m.GetLabel()))
			for _, lp := range m.GetLabel() {
				k := lp.GetName()
				if !validMetricName(k) || strings.Contains(k, ":") {
					return nil, nil, fmt.Errorf("metrics: %s: bad label name %q", name, k)
				}
				if _, dup := labels[k]; dup {
					return nil, nil, fmt.Errorf("metrics: %s: duplicate label %q", name, k)
				}
				labels[k] = lp.GetValue()
			}
			s, err := flatten(name, mf.GetType(), m, labels)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, s...)
		}
	}
	return out, types, nil
}

// flatten turns one series of a family into its exposition samples.
func flatten(name string, typ dto.MetricType, m *dto.Metric, labels map[string]string) ([]Sample, error) {
	with := func(k, v string) (map[string]string, error) {
		if _, dup := labels[k]; dup {
			return nil, fmt.Errorf("metrics: %s: label %q clashes with the %s label", name, k, k)
		}
		l := make(map[string]string, len(labels)+1)
		for a, b := range labels {
			l[a] = b
		}
		l[k] = v
		return l, nil
	}
	switch typ {
	case dto.MetricType_COUNTER:
		return []Sample{{name, labels, m.GetCounter().GetValue()}}, nil
	case dto.MetricType_GAUGE:
		return []Sample{{name, labels, m.GetGauge().GetValue()}}, nil
	case dto.MetricType_UNTYPED:
		return []Sample{{name, labels, m.GetUntyped().GetValue()}}, nil
	case dto.MetricType_SUMMARY:
		sm := m.GetSummary()
		var out []Sample
		for _, q := range sm.GetQuantile() {
			l, err := with(model.QuantileLabel, formatFloat(q.GetQuantile()))
			if err != nil {
				return nil, err
			}
			out = append(out, Sample{name, l, q.GetValue()})
		}
		return append(out,
			Sample{name + "_sum", labels, sm.GetSampleSum()},
			Sample{name + "_count", labels, float64(sm.GetSampleCount())}), nil
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		h := m.GetHistogram()
		var out []Sample
		for _, b := range h.GetBucket() {
			l, err := with(model.BucketLabel, formatFloat(b.GetUpperBound()))
			if err != nil {
				return nil, err
			}
			c := float64(b.GetCumulativeCount())
			if b.CumulativeCountFloat != nil {
				c = b.GetCumulativeCountFloat()
			}
			out = append(out, Sample{name + "_bucket", l, c})
		}
		count := float64(h.GetSampleCount())
		if h.SampleCountFloat != nil {
			count = h.GetSampleCountFloat()
		}
		return append(out,
			Sample{name + "_sum", labels, h.GetSampleSum()},
			Sample{name + "_count", labels, count}), nil
	}
	return nil, fmt.Errorf("metrics: %s: unsupported type %v", name, typ)
}

// formatFloat renders a bound or quantile as the text format does (+Inf, 0.5).
func formatFloat(v float64) string {
	return strconv.FormatFloat(v, 'g', -1, 64)
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
