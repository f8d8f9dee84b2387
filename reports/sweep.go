package reports

import (
	"fmt"
	"math"
	"sort"
)

// svgSweep is one offset sweep drawn as time to converge against the fault's
// offset, with the phase each offset's fault landed in as a strip below: it
// shows which window of an operation is slow to recover or broken.
type svgSweep struct {
	Scenario string
	W, H     float64
	PlotTop  float64
	AxisY    float64 // bottom of the convergence plot
	StripY   float64 // top of the landed-phase strip
	Left     float64
	Right    float64
	Points   []svgMark
	Phases   []svgRect
	XTicks   []svgTick
	YTicks   []svgYTick
}

type svgYTick struct {
	Y     float64
	Label string
}

const (
	swWidth  = 960.0
	swLeft   = 64.0
	swRight  = 16.0
	swTop    = 14.0
	swPlotH  = 120.0
	swStripH = 18.0
)

// buildSweeps draws every scenario that ran at three or more distinct
// numeric offsets, in run order.
func buildSweeps(cases []Case, anchorOf map[string]string) []svgSweep {
	var order []string
	by := map[string][]Case{}
	for _, c := range cases {
		if c.OffsetLabel() == "park" || math.IsNaN(c.OffsetMs) || math.IsInf(c.OffsetMs, 0) {
			continue
		}
		if _, ok := by[c.Scenario]; !ok {
			order = append(order, c.Scenario)
		}
		by[c.Scenario] = append(by[c.Scenario], c)
	}
	var out []svgSweep
	for _, sc := range order {
		cs := by[sc]
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].OffsetMs < cs[j].OffsetMs })
		distinct := 1
		for i := 1; i < len(cs); i++ {
			if cs[i].OffsetMs != cs[i-1].OffsetMs {
				distinct++
			}
		}
		if distinct < 3 {
			continue
		}
		out = append(out, buildSweep(sc, cs, anchorOf))
	}
	return out
}

func buildSweep(scenario string, cs []Case, anchorOf map[string]string) svgSweep {
	s := svgSweep{Scenario: scenario, W: swWidth, Left: swLeft, Right: swWidth - swRight, PlotTop: swTop}
	s.AxisY = swTop + swPlotH
	s.StripY = s.AxisY + 22
	s.H = s.StripY + swStripH + 18
	lo, hi := cs[0].OffsetMs, cs[len(cs)-1].OffsetMs
	span := math.Max(hi-lo, 1e-9)
	plotW := s.Right - s.Left
	x := func(off float64) float64 { return s.Left + (off-lo)/span*plotW }
	maxConv := 1.0
	for _, c := range cs {
		if c.ConvergeMs >= 0 && !math.IsInf(c.ConvergeMs, 0) {
			maxConv = math.Max(maxConv, c.ConvergeMs)
		}
	}
	step := niceStep(maxConv / 4)
	top := math.Ceil(maxConv/step) * step
	y := func(ms float64) float64 { return s.AxisY - ms/top*(swPlotH-10) }
	for v := 0.0; v <= top+step/2 && len(s.YTicks) < 8; v += step {
		s.YTicks = append(s.YTicks, svgYTick{Y: y(v), Label: FormatMs(v)})
	}
	for _, c := range cs {
		yv := swTop // never converged: pinned to the top, with a red ring
		if c.ConvergeMs >= 0 {
			yv = y(c.ConvergeMs)
		}
		cls := "pt v-" + verdictClass(c.Verdict)
		if c.ConvergeMs < 0 {
			cls += " never"
		}
		s.Points = append(s.Points, svgMark{X: x(c.OffsetMs), Y: yv, Class: cls, Anchor: anchorOf[c.ID],
			Title: fmt.Sprintf("%s: offset %s, landed in %s, %s, converge %s", c.ID, formatOffset(c.OffsetMs), orDefault(c.LandedPhase, "?"), c.Verdict, FormatMs(c.ConvergeMs))})
	}
	// Landed-phase strip: consecutive offsets that hit the same phase form
	// one segment reaching halfway to the neighbouring offsets.
	mid := func(i int) float64 { // boundary between cs[i-1] and cs[i]
		if i <= 0 {
			return x(lo)
		}
		if i >= len(cs) {
			return x(hi)
		}
		return (x(cs[i-1].OffsetMs) + x(cs[i].OffsetMs)) / 2
	}
	for i := 0; i < len(cs); {
		j := i
		for j+1 < len(cs) && cs[j+1].LandedPhase == cs[i].LandedPhase {
			j++
		}
		x0, x1 := mid(i), mid(j+1)
		r := svgRect{X: x0, Y: s.StripY, W: math.Max(x1-x0, 1), H: swStripH, Class: fmt.Sprintf("band band%d", len(s.Phases)%2),
			Title: fmt.Sprintf("offsets %s – %s landed in %s", formatOffset(cs[i].OffsetMs), formatOffset(cs[j].OffsetMs), orDefault(cs[i].LandedPhase, "?"))}
		if fit := int((r.W - 8) / 5.6); fit >= 6 {
			r.Label = truncate(orDefault(cs[i].LandedPhase, "?"), fit)
		}
		s.Phases = append(s.Phases, r)
		i = j + 1
	}
	tstep := niceStep(span / 8)
	for v := math.Ceil(lo/tstep) * tstep; v <= hi+tstep/1e6 && len(s.XTicks) < 12; v += tstep {
		s.XTicks = append(s.XTicks, svgTick{X: x(v), Label: formatOffset(v)})
	}
	return s
}
