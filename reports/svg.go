package reports

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Geometry for the inline SVG figures of report.html. Everything here is
// plain numbers and strings; html/template escapes them when rendering.

type svgLane struct {
	Y     float64
	Label string
}

type svgRect struct {
	X, Y, W, H float64
	Class      string
	Title      string
	Label      string // text drawn inside, if any
}

type svgMark struct {
	X, Y   float64
	Class  string
	Title  string
	Anchor string // the case it links to, if any
}

type svgVLine struct {
	X, Y1, Y2 float64
	Class     string
	Label     string
	LabelX    float64
	LabelY    float64
	Anchor    string // text-anchor of the label
	Title     string
}

type svgTick struct {
	X     float64
	Label string
}

type svgNote struct {
	X, Y   float64
	Anchor string
	Class  string
	Text   string
}

type svgTimeline struct {
	Notes  []svgNote
	W, H   float64
	AxisY  float64
	Lanes  []svgLane
	Bands  []svgRect
	Marks  []svgMark
	VLines []svgVLine
	Ticks  []svgTick
	Window *svgRect
}

type timelineRow struct {
	Rel   string // time relative to the fault (or the first event)
	Kind  string
	Proc  string
	Point string
	VM    string
	Note  string
}

const (
	tlWidth  = 960.0
	tlLeft   = 96.0
	tlRight  = 24.0
	tlTop    = 26.0
	tlLaneH  = 26.0
	tlBottom = 30.0
)

// buildTimeline lays out a case's timeline: one lane per process with its
// phases as dots and bands (a phase lasts until the next phase of that
// process), the fault and restarts as vertical lines, and the convergence
// point with the fault → converged window shaded. It also returns the
// events as table rows with times relative to the fault.
func buildTimeline(c Case) (*svgTimeline, []timelineRow) {
	evs := append([]TimelineEvent(nil), c.Timeline...)
	if len(evs) == 0 {
		return nil, nil
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].TsNs < evs[j].TsNs })
	ax := newTimelineAxis(c, evs)
	lanes := newTimelineLanes(ax, evs)
	rows := lanes.drawEvents(evs)
	tl := lanes.tl
	drawFaultLines(tl, ax, c, evs)
	drawConvergence(tl, ax)
	drawTimeTicks(tl, ax)
	if !ax.haveConv && ax.haveFault {
		tl.Notes = append(tl.Notes, svgNote{X: tlWidth - tlRight, Y: 21, Anchor: "end", Class: "lbl-never", Text: "never converged"})
	}
	return tl, rows
}

// timelineAxis maps a case's timestamps to x positions and to labels
// relative to the fault (or to the first event when no fault is known).
type timelineAxis struct {
	t0, t1              int64
	span, plotW         float64
	ref                 int64
	faultNs, convNs     int64
	haveFault, haveConv bool
}

// newTimelineAxis finds the fault and convergence instants (from the events,
// else from the injections and the measured convergence time) and spans the
// axis over the events and both instants. evs is sorted by time.
func newTimelineAxis(c Case, evs []TimelineEvent) *timelineAxis {
	ax := &timelineAxis{}
	for _, e := range evs {
		if e.Kind == "fault" && !ax.haveFault {
			ax.faultNs, ax.haveFault = e.TsNs, true
		}
		if e.Kind == "converged" && !ax.haveConv {
			ax.convNs, ax.haveConv = e.TsNs, true
		}
	}
	if !ax.haveFault {
		for _, inj := range c.Injections {
			if inj.ActualNs != 0 {
				ax.faultNs, ax.haveFault = inj.ActualNs, true
				break
			}
		}
	}
	if !ax.haveConv && ax.haveFault && c.ConvergeMs >= 0 && !math.IsNaN(c.ConvergeMs) && c.ConvergeMs < 1e12 {
		ax.convNs, ax.haveConv = ax.faultNs+int64(c.ConvergeMs*1e6), true
	}
	ax.t0, ax.t1 = evs[0].TsNs, evs[len(evs)-1].TsNs
	for _, ts := range []struct {
		ok bool
		ns int64
	}{{ax.haveFault, ax.faultNs}, {ax.haveConv, ax.convNs}} {
		if ts.ok {
			ax.t0, ax.t1 = min(ax.t0, ts.ns), max(ax.t1, ts.ns)
		}
	}
	ax.span = float64(ax.t1) - float64(ax.t0)
	if ax.span < 1e6 {
		ax.span = 1e6 // at least 1 ms, so a single event does not divide by zero
	}
	ax.plotW = tlWidth - tlLeft - tlRight
	ax.ref = ax.t0
	if ax.haveFault {
		ax.ref = ax.faultNs
	}
	return ax
}

func (ax *timelineAxis) x(ns int64) float64 {
	return tlLeft + (float64(ns)-float64(ax.t0))/ax.span*ax.plotW
}

func (ax *timelineAxis) rel(ns int64) string {
	d := (float64(ns) - float64(ax.ref)) / 1e6
	if d == 0 {
		return "0"
	}
	if d < 0 {
		return "-" + FormatMs(-d)
	}
	return "+" + FormatMs(d)
}

// timelineLanes draws the per-process lanes: each phase is a band that lasts
// until the process's next phase, restart or fault.
type timelineLanes struct {
	ax        *timelineAxis
	tl        *svgTimeline
	laneOf    map[string]int
	names     []string
	lastPhase map[string]TimelineEvent
	bandIdx   map[string]int
}

// newTimelineLanes opens one lane per process, in order of the first
// appearance of a phase or restart of that process, and sizes the figure.
func newTimelineLanes(ax *timelineAxis, evs []TimelineEvent) *timelineLanes {
	l := &timelineLanes{ax: ax, laneOf: map[string]int{}, lastPhase: map[string]TimelineEvent{}, bandIdx: map[string]int{}}
	for _, e := range evs {
		if e.Kind == "phase" || e.Kind == "restart" {
			p := orDefault(e.Proc, "?")
			if _, ok := l.laneOf[p]; !ok {
				l.laneOf[p] = len(l.names)
				l.names = append(l.names, p)
			}
		}
	}
	if len(l.names) == 0 {
		l.names = []string{"events"}
		l.laneOf["events"] = 0
	}
	l.tl = &svgTimeline{W: tlWidth}
	l.tl.H = tlTop + float64(len(l.names))*tlLaneH + tlBottom
	l.tl.AxisY = tlTop + float64(len(l.names))*tlLaneH
	for i, n := range l.names {
		l.tl.Lanes = append(l.tl.Lanes, svgLane{Y: l.y(i), Label: n})
	}
	return l
}

func (l *timelineLanes) y(i int) float64 { return tlTop + float64(i)*tlLaneH + tlLaneH/2 }

// closeBand ends process p's current phase at end and draws its band.
func (l *timelineLanes) closeBand(p string, end int64) {
	prev, ok := l.lastPhase[p]
	if !ok {
		return
	}
	ax := l.ax
	i := l.laneOf[p]
	w := math.Max(ax.x(end)-ax.x(prev.TsNs), 0.5)
	cls := fmt.Sprintf("band band%d", l.bandIdx[p]%2)
	l.bandIdx[p]++
	band := svgRect{X: ax.x(prev.TsNs), Y: l.y(i) - 7, W: w, H: 14, Class: cls,
		Title: fmt.Sprintf("%s %s %s, lasted %s", ax.rel(prev.TsNs), p, prev.Point, FormatMs(float64(end-prev.TsNs)/1e6))}
	if prev.Note != "" {
		band.Title += ": " + truncate(prev.Note, 100)
	}
	// Name the phase inside its band when it fits (~5.6 px a glyph at
	// the label's size); otherwise the tooltip and the table carry it.
	if fit := int((w - 8) / 5.6); fit >= 6 {
		band.Label = prev.Point
		if len(band.Label) > fit {
			band.Label = truncate(band.Label, fit-1)
		}
	}
	l.tl.Bands = append(l.tl.Bands, band)
}

// drawEvents draws the phases and restarts in their lanes and returns every
// event as a table row.
func (l *timelineLanes) drawEvents(evs []TimelineEvent) []timelineRow {
	ax, tl := l.ax, l.tl
	var rows []timelineRow
	for _, e := range evs {
		rows = append(rows, timelineRow{Rel: ax.rel(e.TsNs), Kind: e.Kind, Proc: e.Proc, Point: e.Point, VM: e.VM, Note: e.Note})
		p := orDefault(e.Proc, "?")
		title := strings.TrimSpace(fmt.Sprintf("%s %s %s %s", ax.rel(e.TsNs), p, e.Point, truncate(e.Note, 100)))
		switch e.Kind {
		case "phase":
			l.closeBand(p, e.TsNs)
			l.lastPhase[p] = e
			// The phase's band carries its tooltip (point, time, duration).
			tl.Marks = append(tl.Marks, svgMark{X: ax.x(e.TsNs), Y: l.y(l.laneOf[p]), Class: "phase"})
		case "fault":
			// A fault that names its victim process ends that process's
			// phase there: a SIGKILLed process is in no phase afterwards.
			if _, ok := l.lastPhase[e.Proc]; ok && e.Proc != "" {
				l.closeBand(e.Proc, e.TsNs)
				delete(l.lastPhase, e.Proc)
			}
		case "restart":
			l.closeBand(p, e.TsNs)
			delete(l.lastPhase, p)
			tl.Marks = append(tl.Marks, svgMark{X: ax.x(e.TsNs), Y: l.y(l.laneOf[p]), Class: "restart", Title: "restart: " + title})
			tl.VLines = append(tl.VLines, svgVLine{X: ax.x(e.TsNs), Y1: tlTop, Y2: tl.AxisY, Class: "vrestart", Title: "restart: " + title})
		}
	}
	// A process's last phase lasts until its last sign of life on the
	// timeline; draw it as a short stub so it is visible.
	for _, p := range l.names {
		if e, ok := l.lastPhase[p]; ok {
			l.closeBand(p, e.TsNs+int64(ax.span/100))
		}
	}
	return rows
}

// timelineLabel places a vertical line's label right of the line, or left
// of it near the right edge.
func timelineLabel(xv float64) (float64, string) {
	if xv > tlWidth-tlRight-120 {
		return xv - 4, "end"
	}
	return xv + 4, "start"
}

// drawFaultLines gives every fault a red line; the first (the reference of
// the time axis) is labelled. A fault known only from the injections stands
// alone.
func drawFaultLines(tl *svgTimeline, ax *timelineAxis, c Case, evs []TimelineEvent) {
	faults := 0
	for _, e := range evs {
		if e.Kind != "fault" {
			continue
		}
		t := fmt.Sprintf("fault %s: %s (landed in %s)", ax.rel(e.TsNs), orDefault(e.Note, c.Fault), orDefault(e.Point, c.LandedPhase))
		v := svgVLine{X: ax.x(e.TsNs), Y1: 12, Y2: tl.AxisY, Class: "vfault", Title: t}
		if faults == 0 {
			v.LabelX, v.Anchor = timelineLabel(v.X)
			v.Label, v.LabelY = truncate("fault "+orDefault(c.Fault, e.Note), 48), 10
		}
		faults++
		tl.VLines = append(tl.VLines, v)
	}
	if faults == 0 && ax.haveFault {
		lx, anchor := timelineLabel(ax.x(ax.faultNs))
		tl.VLines = append(tl.VLines, svgVLine{X: ax.x(ax.faultNs), Y1: 12, Y2: tl.AxisY, Class: "vfault", Label: truncate("fault "+c.Fault, 48),
			LabelX: lx, LabelY: 10, Anchor: anchor, Title: fmt.Sprintf("fault %s (%s) landed in %s", c.Fault, c.Trigger, c.LandedPhase)})
	}
}

// drawConvergence marks the convergence point and shades the fault →
// converged window.
func drawConvergence(tl *svgTimeline, ax *timelineAxis) {
	if !ax.haveConv {
		return
	}
	lx, anchor := timelineLabel(ax.x(ax.convNs))
	tl.VLines = append(tl.VLines, svgVLine{X: ax.x(ax.convNs), Y1: 12, Y2: tl.AxisY, Class: "vconv", Label: "converged " + ax.rel(ax.convNs),
		LabelX: lx, LabelY: 21, Anchor: anchor, Title: "stable state reached " + ax.rel(ax.convNs) + " after the fault"})
	if ax.haveFault && ax.convNs > ax.faultNs {
		tl.Window = &svgRect{X: ax.x(ax.faultNs), Y: tlTop, W: ax.x(ax.convNs) - ax.x(ax.faultNs), H: tl.AxisY - tlTop, Class: "window",
			Title: "fault → converged: " + FormatMs(float64(ax.convNs-ax.faultNs)/1e6)}
	}
}

// drawTimeTicks puts at most 13 round-numbered ticks on the time axis,
// counted from the reference instant.
func drawTimeTicks(tl *svgTimeline, ax *timelineAxis) {
	step := niceStep(ax.span / 8)
	for k := math.Ceil((float64(ax.t0) - float64(ax.ref)) / step); ; k++ {
		ns := float64(ax.ref) + k*step
		if ns > float64(ax.t1)+1 || len(tl.Ticks) > 12 {
			break
		}
		tl.Ticks = append(tl.Ticks, svgTick{X: ax.x(int64(ns)), Label: ax.rel(int64(ns))})
	}
}

type svgBar struct {
	X, Y, W, H float64
	Mid        float64 // W/2, where the count label sits
	Class      string
	Title      string
	Count      int
}

type svgHistogram struct {
	W, H, AxisY, Left float64
	Bars              []svgBar
	Ticks             []svgTick
	Marks             []svgVLine
	MaxCount          int
}

// buildHistogram bins the convergence times of the pass and fail cases;
// cases that never converged get their own red bar at the right.
func buildHistogram(cases []Case) *svgHistogram {
	var ms []float64
	never := 0
	for _, c := range cases {
		if c.Verdict != Pass && c.Verdict != Fail {
			continue
		}
		if c.ConvergeMs < 0 || math.IsNaN(c.ConvergeMs) || math.IsInf(c.ConvergeMs, 0) {
			never++
			continue
		}
		ms = append(ms, c.ConvergeMs)
	}
	if len(ms) == 0 && never == 0 {
		return nil
	}
	sort.Float64s(ms)
	// About √n bins (5..24), narrowed to a round width so edges read well
	// (at most twice as many bins).
	want := min(max(int(math.Ceil(math.Sqrt(float64(len(ms))))), 5), 24)
	hi := 1.0
	if len(ms) > 0 {
		hi = math.Max(ms[len(ms)-1], 1)
	}
	width := niceStepDown(hi / float64(want))
	nb := max(1, int(math.Ceil(hi/width)))
	if float64(nb)*width <= hi {
		nb++ // the maximum sits on an edge: give it its own bin
	}
	counts := make([]int, nb)
	for _, v := range ms {
		i := min(int(v/width), nb-1)
		counts[i]++
	}
	h := &svgHistogram{W: 720, H: 220, AxisY: 180, Left: 40}
	for _, c := range counts {
		h.MaxCount = max(h.MaxCount, c)
	}
	h.MaxCount = max(h.MaxCount, never, 1)
	slots := nb
	if never > 0 {
		slots += 2 // a gap, then the "never" bar
	}
	plotW := h.W - h.Left - 10
	bw := plotW / float64(slots)
	// Bars stay below y=34 so the p50/p95 labels above them stay legible.
	barH := func(n int) float64 { return float64(n) / float64(h.MaxCount) * (h.AxisY - 34) }
	for i, n := range counts {
		lo := width * float64(i)
		h.Bars = append(h.Bars, svgBar{X: h.Left + float64(i)*bw + 1, Y: h.AxisY - barH(n), W: bw - 2, H: barH(n), Class: "bar", Count: n, Mid: (bw - 2) / 2,
			Title: fmt.Sprintf("%d case(s) converged in %s – %s", n, FormatMs(lo), FormatMs(lo+width))})
	}
	if never > 0 {
		h.Bars = append(h.Bars, svgBar{X: h.Left + float64(nb+1)*bw + 1, Y: h.AxisY - barH(never), W: bw - 2, H: barH(never), Class: "bar never", Count: never, Mid: (bw - 2) / 2,
			Title: fmt.Sprintf("%d case(s) never converged", never)})
		h.Ticks = append(h.Ticks, svgTick{X: h.Left + float64(nb+1)*bw + bw/2, Label: "never"})
	}
	for i := 0; i <= nb; i += max(1, nb/4) {
		label := FormatMs(width * float64(i))
		if i == 0 {
			label = "0"
		}
		h.Ticks = append(h.Ticks, svgTick{X: h.Left + float64(i)*bw, Label: label})
	}
	xOf := func(v float64) float64 { return h.Left + v/width*bw }
	if len(ms) > 0 {
		st := Convergence(cases)
		h.Marks = append(h.Marks,
			svgVLine{X: xOf(st.P50), Y1: 8, Y2: h.AxisY, Class: "vp50", Label: "p50 " + FormatMs(st.P50), LabelX: xOf(st.P50) + 3, LabelY: 10, Anchor: "start"},
			svgVLine{X: xOf(st.P95), Y1: 8, Y2: h.AxisY, Class: "vp95", Label: "p95 " + FormatMs(st.P95), LabelX: xOf(st.P95) + 3, LabelY: 10, Anchor: "start"})
		if h.Marks[1].X-h.Marks[0].X < 70 {
			h.Marks[1].LabelY = 22 // keep the two labels apart
		}
	}
	return h
}

// niceStep rounds a raw step up to 1, 2 or 5 × 10^k (in whatever unit it is
// given) so that axis labels read as round numbers.
func niceStep(raw float64) float64 {
	if raw <= 0 || math.IsNaN(raw) || math.IsInf(raw, 0) {
		return 1e6
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// niceStepDown rounds a raw step down to 1, 2 or 5 × 10^k.
func niceStepDown(raw float64) float64 {
	if raw <= 0 || math.IsNaN(raw) || math.IsInf(raw, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{5, 2, 1} {
		if m*p <= raw {
			return m * p
		}
	}
	return p
}
