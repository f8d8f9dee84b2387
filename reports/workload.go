package reports

import (
	"fmt"
	"html/template"
	"sort"
	"strings"
)

// Workload is what the guest writer of a case did and how its markers were
// judged (issue #13): one consistent-cut verdict per snapshot restored or
// cloned, one per hibernate → wake, and the acks for the timeline.
type Workload struct {
	Rate     float64            `json:"rate"` // asked markers/s per guest
	Sessions []WorkloadSession  `json:"sessions,omitempty"`
	Cuts     []WorkloadCut      `json:"cuts,omitempty"`
	Acks     []WorkloadAckPoint `json:"acks,omitempty"`  // downsampled for the timeline
	Marks    []WorkloadMark     `json:"marks,omitempty"` // pause, resume, NIC drop, fault
	Note     string             `json:"note,omitempty"`  // why the workload did not run, when it did not
}

// WorkloadSession is one writer session in one guest.
type WorkloadSession struct {
	Guest      string  `json:"guest"`
	First      int     `json:"first"`
	Last       int     `json:"last"`
	Acks       int     `json:"acks"`
	AckedPerS  float64 `json:"acked_per_s"`
	End        string  `json:"end"`
	DurationMs float64 `json:"duration_ms"`
}

// WorkloadCut is one consistent-cut verdict (the fields of ledger.CutVerdict
// a reader needs).
type WorkloadCut struct {
	Kind             string   `json:"kind"` // "snapshot" | "wake"
	Snapshot         string   `json:"snapshot,omitempty"`
	Source           string   `json:"source"`
	Target           string   `json:"target"`
	First            int      `json:"first"`
	Cut              int      `json:"cut"`
	Present          int      `json:"present"`
	AckedBeforePause int      `json:"acked_before_pause"`
	Judged           int      `json:"judged"`
	Lost             []string `json:"lost,omitempty"` // "seq N (times)"
	Phantom          []string `json:"phantom,omitempty"`
	Hole             []string `json:"hole,omitempty"`
	OK               bool     `json:"ok"`
	Message          string   `json:"message"`
	PauseNs          int64    `json:"pause_ns,omitempty"`
	ResumeNs         int64    `json:"resume_ns,omitempty"`
}

// WorkloadAckPoint is one ack on the trace clock.
type WorkloadAckPoint struct {
	Guest string `json:"guest"`
	Seq   int    `json:"seq"`
	AckNs int64  `json:"ack_ns"`
}

// WorkloadMark is an event the acks are drawn against.
type WorkloadMark struct {
	TsNs  int64  `json:"ts_ns"`
	Kind  string `json:"kind"` // pause | resume | nic-drop | fault
	Label string `json:"label"`
}

// JudgedMarkers is the number of markers the case's cut verdicts judged.
func (w *Workload) JudgedMarkers() int {
	if w == nil {
		return 0
	}
	n := 0
	for _, c := range w.Cuts {
		n += c.Judged
	}
	return n
}

// WorkloadMarkdown is the case's workload section of report.md: the writer
// sessions and the cut per snapshot.
func WorkloadMarkdown(c Case) string {
	w := c.Workload
	if w == nil {
		return ""
	}
	var b strings.Builder
	if w.Note != "" {
		fmt.Fprintf(&b, "- workload: %s\n", mdEscape(w.Note))
	}
	for _, s := range w.Sessions {
		fmt.Fprintf(&b, "- workload %s: seq %d..%d, %d acked in %s (%.0f/s), %s\n", mdEscape(s.Guest), s.First, s.Last, s.Acks,
			FormatMs(s.DurationMs), s.AckedPerS, mdEscape(s.End))
	}
	for _, k := range w.Cuts {
		status := "consistent"
		if !k.OK {
			status = "**NOT CONSISTENT**"
		}
		fmt.Fprintf(&b, "- cut %s %s → %s: %s — seq %d..%d, %d acked before the %s, %d judged", mdEscape(k.Kind), mdEscape(k.Source), mdEscape(k.Target),
			status, k.First, k.Cut, k.AckedBeforePause, map[bool]string{true: "NIC drop", false: "pause"}[k.Kind == "wake"], k.Judged)
		if k.Snapshot != "" {
			fmt.Fprintf(&b, " (snapshot %s)", mdEscape(k.Snapshot))
		}
		for _, l := range []struct {
			name string
			s    []string
		}{{"LOST", k.Lost}, {"PHANTOM", k.Phantom}, {"HOLE", k.Hole}} {
			if len(l.s) > 0 {
				fmt.Fprintf(&b, "; %s: %s", l.name, mdEscape(strings.Join(l.s, ", ")))
			}
		}
		if !k.OK {
			fmt.Fprintf(&b, "; %s", mdEscape(k.Message))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// WorkloadTimelineText is the acks against pause, resume, NIC drop and fault
// as text: runs of acks collapsed into one line each, times relative to the
// first mark.
func WorkloadTimelineText(w *Workload) string {
	if w == nil || len(w.Marks) == 0 && len(w.Acks) == 0 {
		return ""
	}
	type row struct {
		ts   int64
		text string
	}
	var rows []row
	for _, m := range w.Marks {
		rows = append(rows, row{m.TsNs, fmt.Sprintf("── %s %s", m.Kind, m.Label)})
	}
	acks := append([]WorkloadAckPoint(nil), w.Acks...)
	sort.SliceStable(acks, func(i, j int) bool { return acks[i].AckNs < acks[j].AckNs })
	marks := make([]int64, 0, len(w.Marks))
	for _, m := range w.Marks {
		marks = append(marks, m.TsNs)
	}
	sort.Slice(marks, func(i, j int) bool { return marks[i] < marks[j] })
	// a run of acks of one guest ends at a mark or a change of guest
	for i := 0; i < len(acks); {
		j := i
		for j+1 < len(acks) && acks[j+1].Guest == acks[i].Guest && !markBetween(marks, acks[j].AckNs, acks[j+1].AckNs) {
			j++
		}
		rows = append(rows, row{acks[i].AckNs, fmt.Sprintf("   %s acked seq %d..%d (%d shown) until %s", acks[i].Guest, acks[i].Seq, acks[j].Seq, j-i+1,
			relMs(acks[j].AckNs, originOf(w)))})
		i = j + 1
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].ts < rows[j].ts })
	var b strings.Builder
	o := originOf(w)
	for _, r := range rows {
		fmt.Fprintf(&b, "%12s %s\n", relMs(r.ts, o), r.text)
	}
	return b.String()
}

func markBetween(marks []int64, a, b int64) bool {
	for _, m := range marks {
		if m > a && m <= b {
			return true
		}
	}
	return false
}

// originOf is the first pause (else the first mark, else the first ack).
func originOf(w *Workload) int64 {
	var o int64
	for _, m := range w.Marks {
		if m.Kind == "pause" && (o == 0 || m.TsNs < o) {
			o = m.TsNs
		}
	}
	if o == 0 && len(w.Marks) > 0 {
		o = w.Marks[0].TsNs
	}
	if o == 0 && len(w.Acks) > 0 {
		o = w.Acks[0].AckNs
	}
	return o
}

func relMs(t, o int64) string { return fmt.Sprintf("%+.1fms", float64(t-o)/1e6) }

// WorkloadSVG draws the acks (seq over time) of a case against its marks.
func WorkloadSVG(w *Workload) template.HTML {
	if w == nil || len(w.Acks) == 0 {
		return ""
	}
	const W, H, pad = 760.0, 160.0, 30.0
	lo, hi := w.Acks[0].AckNs, w.Acks[0].AckNs
	sLo, sHi := w.Acks[0].Seq, w.Acks[0].Seq
	for _, a := range w.Acks {
		lo, hi = min(lo, a.AckNs), max(hi, a.AckNs)
		sLo, sHi = min(sLo, a.Seq), max(sHi, a.Seq)
	}
	for _, m := range w.Marks {
		lo, hi = min(lo, m.TsNs), max(hi, m.TsNs)
	}
	if hi == lo {
		hi = lo + 1
	}
	if sHi == sLo {
		sHi = sLo + 1
	}
	x := func(t int64) float64 { return pad + (W-2*pad)*float64(t-lo)/float64(hi-lo) }
	y := func(s int) float64 { return H - pad - (H-2*pad)*float64(s-sLo)/float64(sHi-sLo) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="wl" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" xmlns="http://www.w3.org/2000/svg">`, W, H, W, H)
	colors := map[string]string{"pause": "#d08000", "resume": "#208020", "nic-drop": "#2060c0", "fault": "#c02020"}
	for _, m := range w.Marks {
		c := colors[m.Kind]
		if c == "" {
			c = "#666"
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="%s"><title>%s %s</title></line>`, x(m.TsNs), pad/2, x(m.TsNs), H-pad, c,
			template.HTMLEscapeString(m.Kind), template.HTMLEscapeString(m.Label))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="9" fill="%s">%s</text>`, x(m.TsNs)+2, pad/2+8, c, template.HTMLEscapeString(m.Kind))
	}
	for _, a := range w.Acks {
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="1.5" fill="#333"><title>%s seq %d</title></circle>`, x(a.AckNs), y(a.Seq), template.HTMLEscapeString(a.Guest), a.Seq)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="9">seq %d</text><text x="%.0f" y="%.0f" font-size="9">seq %d</text>`, 2.0, H-pad, sLo, 2.0, pad, sHi)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="9">%s .. %s (0 = first pause)</text></svg>`, pad, H-8, relMs(lo, originOf(w)), relMs(hi, originOf(w)))
	return template.HTML(b.String())
}

// mdWorkloadCuts is report.md's cut per snapshot: one row per consistent-cut
// verdict of the run, then the writer rate.
func mdWorkloadCuts(b *strings.Builder, r *Results) {
	var rows []string
	acks, ms := 0, 0.0
	for _, c := range r.Cases {
		if c.Workload == nil {
			continue
		}
		for _, s := range c.Workload.Sessions {
			acks += s.Acks
			ms += s.DurationMs
		}
		for _, k := range c.Workload.Cuts {
			v := "consistent"
			if !k.OK {
				v = "**NOT CONSISTENT**"
			}
			var bad []string
			for _, l := range []struct {
				name string
				s    []string
			}{{"LOST", k.Lost}, {"PHANTOM", k.Phantom}, {"HOLE", k.Hole}} {
				if len(l.s) > 0 {
					bad = append(bad, fmt.Sprintf("%s %d: %s", l.name, len(l.s), strings.Join(firstN(l.s, 3), ", ")))
				}
			}
			rows = append(rows, fmt.Sprintf("| %s | %s | %s → %s | %s | %d..%d | %d | %d | %s | %s |\n", mdCaseLink(c), mdEscape(k.Kind),
				mdEscape(k.Source), mdEscape(k.Target), mdEscape(k.Snapshot), k.First, k.Cut, k.AckedBeforePause, k.Judged, v, mdEscape(strings.Join(bad, "; "))))
		}
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("## Workload cuts\n\n")
	if ms > 0 {
		fmt.Fprintf(b, "Guest writers acked %d markers over %s of writer time (%.0f/s per guest on average).\n\n", acks, FormatMs(ms), float64(acks)/(ms/1000))
	}
	b.WriteString("| case | kind | source → target | snapshot | cut (seq) | acked before pause / NIC drop | judged | verdict | findings |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range rows {
		b.WriteString(row)
	}
	b.WriteString("\n")
}

func firstN(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(append([]string(nil), s[:n]...), fmt.Sprintf("… %d more", len(s)-n))
}
