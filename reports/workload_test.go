package reports

import (
	"strings"
	"testing"
)

func sampleWorkloadCase(ok bool) Case {
	w := &Workload{Rate: 200,
		Sessions: []WorkloadSession{{Guest: "vm-a", First: 1, Last: 120, Acks: 120, AckedPerS: 199, End: "stopped by the harness", DurationMs: 603}},
		Marks: []WorkloadMark{{TsNs: 1_000_000_000, Kind: "pause", Label: "snapshot.save.paused"}, {TsNs: 1_050_000_000, Kind: "resume", Label: "snapshot.save.resumed"},
			{TsNs: 1_010_000_000, Kind: "fault", Label: "none <script>"}},
	}
	for s := 1; s <= 40; s++ {
		ts := int64(900_000_000 + s*5_000_000)
		if s > 20 {
			ts += 60_000_000
		}
		w.Acks = append(w.Acks, WorkloadAckPoint{Guest: "vm-a", Seq: s, AckNs: ts})
	}
	cut := WorkloadCut{Kind: "snapshot", Snapshot: "vm-a-manual", Source: "vm-a", Target: "vm-a-cut0", First: 1, Cut: 20, Present: 20,
		AckedBeforePause: 19, Judged: 40, OK: ok, Message: "vm-a → vm-a-cut0: cut seq 1..20"}
	if !ok {
		cut.Phantom = []string{"seq 21 (began pause+60ms resume+10ms)"}
	}
	w.Cuts = []WorkloadCut{cut}
	return Case{ID: "wl-save-held-paused", Verdict: Pass, Workload: w}
}

func TestWorkloadCutsInMarkdown(t *testing.T) {
	for _, ok := range []bool{true, false} {
		r := &Results{Cases: []Case{sampleWorkloadCase(ok)}}
		b, err := Markdown(r)
		if err != nil {
			t.Fatal(err)
		}
		md := string(b)
		if !strings.Contains(md, "## Workload cuts") || !strings.Contains(md, "vm-a → vm-a-cut0 | vm-a-manual | 1..20 | 19 | 40 |") {
			t.Fatalf("no cut row:\n%s", md)
		}
		if strings.Contains(md, "PHANTOM 1: seq 21") != !ok || strings.Contains(md, "NOT CONSISTENT") != !ok {
			t.Fatalf("ok=%v: findings wrong:\n%s", ok, md)
		}
		if !strings.Contains(md, "acked 120 markers") {
			t.Fatalf("no writer figure:\n%s", md)
		}
	}
	if b, _ := Markdown(&Results{Cases: []Case{{ID: "x", Verdict: Pass}}}); strings.Contains(string(b), "Workload cuts") {
		t.Fatal("a run without a workload got a cuts section")
	}
}

func TestWorkloadTimeline(t *testing.T) {
	c := sampleWorkloadCase(true)
	txt := WorkloadTimelineText(c.Workload)
	// the acks are split at the pause; 0 is the pause
	for _, want := range []string{"+0.0ms ── pause snapshot.save.paused", "+50.0ms ── resume", "vm-a acked seq 1..19", "vm-a acked seq 21..40"} {
		if !strings.Contains(txt, want) {
			t.Fatalf("timeline lacks %q:\n%s", want, txt)
		}
	}
	svg := string(WorkloadSVG(c.Workload))
	if !strings.HasPrefix(svg, "<svg") || strings.Count(svg, "<circle") != 40 || strings.Contains(svg, "<script>") {
		t.Fatalf("svg: %d circles, escaped: %v", strings.Count(svg, "<circle"), !strings.Contains(svg, "<script>"))
	}
	if WorkloadSVG(nil) != "" || WorkloadTimelineText(nil) != "" {
		t.Fatal("nil workload rendered")
	}
	b, err := HTML(&Results{Cases: []Case{c}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `<svg class="wl"`) || !strings.Contains(string(b), "Workload") {
		t.Fatal("report.html has no workload timeline")
	}
}
