package checker

import (
	"strings"
	"testing"
)

const expo = `# HELP nodeagent_wake_total wakes
# TYPE nodeagent_wake_total counter
nodeagent_wake_total{result="ok"} 3
nodeagent_wake_total{result="failed"} 0
# TYPE nodeagent_orphan_vm_total counter
nodeagent_orphan_vm_total 0
# TYPE nodeagent_op_seconds histogram
nodeagent_op_seconds_bucket{op="create",le="0.1"} 2
nodeagent_op_seconds_sum{op="create"} 0.15
nodeagent_op_seconds_count{op="create"} 2
`

func TestParseTextKeysAreCanonical(t *testing.T) {
	s, err := ParseText(strings.NewReader(expo))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Values[Canonical(`nodeagent_wake_total{result="ok"}`)]; got != 3 {
		t.Fatalf("wake ok = %v", got)
	}
	if got := s.Values[Canonical(`nodeagent_op_seconds_bucket{le="0.1",op="create"}`)]; got != 2 {
		t.Fatalf("bucket = %v (keys %v)", got, s.Values)
	}
	if s.Types["nodeagent_op_seconds"] != "histogram" {
		t.Fatal("type not recorded")
	}
}

func TestBackwardsFindsAResetCounter(t *testing.T) {
	a, _ := ParseText(strings.NewReader(expo))
	b, _ := ParseText(strings.NewReader(strings.Replace(expo, `{result="ok"} 3`, `{result="ok"} 1`, 1)))
	got := Backwards([]Sample{a, a, b})
	if len(got) != 1 || !strings.Contains(got[0], `result="ok"`) {
		t.Fatalf("Backwards = %v", got)
	}
	if got := Backwards([]Sample{a, a}); len(got) != 0 {
		t.Fatalf("steady counters reported: %v", got)
	}
}

// TestBackwardsOrdersByRealTime: the background sampler's scrape and a
// ScrapeNow overlap; the one sent first was answered first (3) but read last,
// after the other had already seen 4. That is no decrease. The same values
// from scrapes that did not overlap are one.
func TestBackwardsOrdersByRealTime(t *testing.T) {
	at := func(start, end int64, v float64) Sample {
		return Sample{StartNs: start, TsNs: end, Values: map[string]float64{`c_total`: v}, Types: map[string]string{"c_total": "counter"}}
	}
	overlapping := []Sample{at(100, 150, 4), at(90, 300, 3), at(400, 420, 4)}
	if got := Backwards(overlapping); len(got) != 0 {
		t.Fatalf("overlapping scrapes read out of order reported as a decrease: %v", got)
	}
	ordered := []Sample{at(100, 150, 4), at(160, 300, 3)}
	if got := Backwards(ordered); len(got) != 1 || !strings.Contains(got[0], "went 4 → 3 between samples 0 and 1") {
		t.Fatalf("a decrease between scrapes that did not overlap: Backwards = %v", got)
	}
	// A later sample that is lower than an earlier peak, not just its
	// neighbour, is caught too.
	if got := Backwards([]Sample{at(1, 2, 5), at(90, 300, 5), at(100, 150, 5), at(400, 420, 4)}); len(got) != 1 {
		t.Fatalf("Backwards = %v", got)
	}
}

func FuzzParseText(f *testing.F) {
	f.Add(expo)
	f.Add(`a{b="\"x\\",c="y"} 1 123`)
	f.Fuzz(func(t *testing.T, s string) {
		smp, err := ParseText(strings.NewReader(s))
		if err != nil {
			return
		}
		for k := range smp.Values {
			if Canonical(k) != k {
				t.Fatalf("key %q not canonical (%q)", k, Canonical(k))
			}
		}
	})
}
