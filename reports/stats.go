package reports

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/vmchaos/vmchaos/offset"
)

// VerdictCounts counts the cases of a run by verdict. Flaky counts the cases
// that needed more than one attempt, whatever their final verdict.
type VerdictCounts struct {
	Total, Pass, Fail, Inconclusive, Error, Unknown, Flaky int
}

// CountVerdicts tallies cases by verdict.
func CountVerdicts(cases []Case) VerdictCounts {
	var c VerdictCounts
	for _, cs := range cases {
		c.Total++
		switch cs.Verdict {
		case Pass:
			c.Pass++
		case Fail:
			c.Fail++
		case Inconclusive:
			c.Inconclusive++
		case Error:
			c.Error++
		default:
			c.Unknown++
		}
		if cs.Attempts > 1 {
			c.Flaky++
		}
	}
	return c
}

// String is the one-line tally used in summaries and report headers.
func (c VerdictCounts) String() string {
	noun := "cases"
	if c.Total == 1 {
		noun = "case"
	}
	s := fmt.Sprintf("%d %s: %d pass, %d fail, %d inconclusive, %d error", c.Total, noun, c.Pass, c.Fail, c.Inconclusive, c.Error)
	if c.Unknown > 0 {
		s += fmt.Sprintf(", %d unknown verdict", c.Unknown)
	}
	if c.Flaky > 0 {
		s += fmt.Sprintf(" (%d retried)", c.Flaky)
	}
	return s
}

// ConvergeStats summarises time to converge. Only cases whose fault landed
// (verdict pass or fail) count: an inconclusive case's convergence measures a
// fault that did not happen where intended, so it would skew the figures.
type ConvergeStats struct {
	N     int     // cases that converged (converge_ms >= 0)
	Never int     // cases that never converged (converge_ms < 0)
	P50   float64 // ms, nearest rank
	P95   float64
	Max   float64
}

// Convergence computes ConvergeStats over the pass and fail cases.
func Convergence(cases []Case) ConvergeStats {
	var ms []float64
	var st ConvergeStats
	for _, c := range cases {
		if c.Verdict != Pass && c.Verdict != Fail {
			continue
		}
		if c.ConvergeMs < 0 || math.IsNaN(c.ConvergeMs) {
			st.Never++
			continue
		}
		ms = append(ms, c.ConvergeMs)
	}
	sort.Float64s(ms)
	st.N = len(ms)
	st.P50 = Percentile(ms, 0.50)
	st.P95 = Percentile(ms, 0.95)
	if len(ms) > 0 {
		st.Max = ms[len(ms)-1]
	}
	return st
}

// String is the one-line convergence figure used in summaries.
func (s ConvergeStats) String() string {
	if s.N == 0 && s.Never == 0 {
		return "convergence: no measured cases"
	}
	out := fmt.Sprintf("convergence: p50 %s, p95 %s, max %s over %d cases", FormatMs(s.P50), FormatMs(s.P95), FormatMs(s.Max), s.N)
	if s.Never > 0 {
		out += fmt.Sprintf("; %d never converged", s.Never)
	}
	return out
}

// Percentile returns the nearest-rank p-quantile of an ascending slice (0 if
// empty). Nearest rank keeps every reported figure a value that was measured.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// FormatMs renders a millisecond duration for people; negative means never.
func FormatMs(ms float64) string {
	switch {
	case math.IsNaN(ms) || ms < 0:
		return "never"
	case ms == 0:
		return "0 ms"
	case ms < 10:
		return fmt.Sprintf("%.1f ms", ms)
	case ms < 1000:
		return fmt.Sprintf("%.0f ms", ms)
	case ms < 60_000:
		return fmt.Sprintf("%.2f s", ms/1000)
	default:
		return fmt.Sprintf("%.1f min", ms/60_000)
	}
}

// FailedInvariants lists the names of the invariants a case violated.
func (c *Case) FailedInvariants() []string {
	var out []string
	for _, inv := range c.Invariants {
		if !inv.OK {
			out = append(out, inv.Name)
		}
	}
	return out
}

// OffsetLabel is how a case's position in the operation is shown: "park" for
// the exact phase triggers, else the offset in ms.
func (c *Case) OffsetLabel() string {
	if strings.HasPrefix(strings.TrimSpace(c.Trigger), "park") {
		return "park"
	}
	return formatOffset(c.OffsetMs)
}

// formatOffset shows a case's offset as every other output does (offset.Format).
func formatOffset(ms float64) string { return offset.Format(offset.FromMs(ms)) }

// Problem says whether a case needs a person's attention in a report.
func (c *Case) Problem() bool { return c.Verdict != Pass }

// LandedLabel is the landed phase as reports show it: with the intended
// phase beside it when a fault missed, so a reader sees at once where it
// should have landed.
func (c *Case) LandedLabel() string {
	l := orDefault(c.LandedPhase, "-")
	for _, inj := range c.Injections {
		if !inj.Landed && inj.IntendedPhase != "" && inj.IntendedPhase != c.LandedPhase {
			return l + " (intended " + inj.IntendedPhase + ")"
		}
	}
	return l
}
