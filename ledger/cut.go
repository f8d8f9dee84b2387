package ledger

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/ledger/writerproto"
)

// The consistent-cut verdict (issue #13). A guest writer appends markers
// seq-1, seq-2, … through every operation window; each ack carries the
// guest's clock. A VM restored or cloned from a snapshot must hold a prefix
// First..Cut of the sequence such that:
//
//   - every marker acked before the capture's pause is present (else LOST);
//   - no marker whose write began after the resume is present (else PHANTOM);
//   - nothing is missing below the highest marker present (else HOLE).
//
// The same rules hold for the RAM markers when the memory was restored. After
// a hibernate → wake, every marker acked before the NIC drop must be present
// and the boot id unchanged (ClassifyWake).
//
// Ordering against the trace: a guest that acked at guest time t was running
// at t, so if t is before the trace's "paused" event (stamped after the
// pause completed) the write finished before the pause itself. A write that
// began after the "resumed" event began after the resume. Both need the
// guest clock to be the trace clock (the fake guest's is: CLOCK_MONOTONIC).
// Without it (GuestClock false) the host's receipt time of the ack stands in
// for "acked before" (it is never earlier than the ack) and no PHANTOM is
// judged by time.

// WorkloadAck is one marker the guest writer acknowledged.
type WorkloadAck struct {
	Seq     int   `json:"seq"`
	BeginNs int64 `json:"begin_ns"` // guest clock: the write began
	AckNs   int64 `json:"ack_ns"`   // guest clock: durable on disk and present in RAM
	HostNs  int64 `json:"host_ns"`  // harness CLOCK_MONOTONIC when the ack line arrived
}

// CutWindow is the capture (or hibernate) a listing is judged against, on
// the trace clock.
type CutWindow struct {
	Snapshot string
	PauseNs  int64 // the capture's pause confirmed (snapshot.save.paused); for a wake: the NIC drop
	ResumeNs int64 // the resume confirmed (snapshot.save.resumed); 0: none (hibernate: the VM never resumed)
	FaultNs  int64 // the injected fault, 0 if none (only for the relative times)
	// GuestClock: ack and begin times are on the trace clock.
	GuestClock bool
}

// CutInput is everything ClassifyCut judges: the source guest's journaled
// acks, the window and the target guest's listings.
type CutInput struct {
	Source string // the guest whose writer made the markers
	Target string // the guest listed (a clone, the woken guest, …)
	Acks   []WorkloadAck
	First  int // first seq of the source's writer (its first session's start); 0: the lowest acked
	Window CutWindow
	Disk   []string // names in the target's disk marker dir
	RAM    []string // names in its RAM marker dir (with CheckRAM)
	// CheckRAM: the target's memory came from the capture, so its RAM
	// markers obey the same rules.
	CheckRAM bool
}

// SeqAt is one judged marker with its times relative to the window.
type SeqAt struct {
	Seq  int    `json:"seq"`
	When string `json:"when,omitempty"`
}

// CutVerdict is the consistent-cut verdict of one listing.
type CutVerdict struct {
	Snapshot string `json:"snapshot,omitempty"`
	Source   string `json:"source"`
	Target   string `json:"target"`
	First    int    `json:"first"`
	// Cut is the highest seq of the prefix First..Cut present on disk
	// (First-1 when even First is missing).
	Cut              int     `json:"cut"`
	Present          int     `json:"present"`
	AckedBeforePause int     `json:"acked_before_pause"`
	BeganAfterResume int     `json:"began_after_resume"`
	Judged           int     `json:"judged"` // distinct seqs judged: journaled acks and present markers
	Lost             []SeqAt `json:"lost,omitempty"`
	Phantom          []SeqAt `json:"phantom,omitempty"`
	Hole             []SeqAt `json:"hole,omitempty"`
	RAMCut           int     `json:"ram_cut,omitempty"`
	RAMLost          []SeqAt `json:"ram_lost,omitempty"`
	RAMPhantom       []SeqAt `json:"ram_phantom,omitempty"`
	RAMHole          []SeqAt `json:"ram_hole,omitempty"`
	BootIDBefore     string  `json:"boot_id_before,omitempty"`
	BootIDAfter      string  `json:"boot_id_after,omitempty"`
	BootIDChanged    bool    `json:"boot_id_changed,omitempty"`
	// ColdBoot: why the boot id change was accepted (WakeInput.ColdBootAllowed).
	ColdBoot string `json:"cold_boot,omitempty"`
	// NoData says why nothing could be judged (no marker acked before the
	// pause): the verdict then fails, it never passes on missing data.
	NoData  string `json:"no_data,omitempty"`
	OK      bool   `json:"ok"`
	Message string `json:"message"`
}

// SeqFromName is the seq of a writer marker file name ("seq-12" → 12), 0
// for any other name.
func SeqFromName(name string) int { return writerproto.Seq(name) }

// ackIndex keeps the earliest record of every seq (a seq rewritten by a
// later writer session after a loss keeps its first history).
func ackIndex(acks []WorkloadAck) map[int]WorkloadAck {
	idx := make(map[int]WorkloadAck, len(acks))
	for _, a := range acks {
		if a.Seq < 1 {
			continue
		}
		if old, ok := idx[a.Seq]; !ok || a.HostNs < old.HostNs {
			idx[a.Seq] = a
		}
	}
	return idx
}

type cutSide struct {
	cut                   int
	lost, phantom, hole   []SeqAt
	present               int
	ackedBefore, afterRes int
	judged                int
}

// judgeSide applies the cut rules to one listing (disk or RAM).
func judgeSide(in CutInput, idx map[int]WorkloadAck, first int, names []string) cutSide {
	w := in.Window
	present := map[int]bool{}
	for _, n := range names {
		if s := SeqFromName(n); s > 0 {
			present[s] = true
		}
	}
	out := cutSide{present: len(present)}
	sp := spanOf(idx, w)
	out.countAcked(idx, sp, present, w)
	maxPresent := out.findPhantoms(idx, sp, present, first, w)
	out.findHoles(idx, present, first, maxPresent, w)
	judged := map[int]bool{}
	for s := range idx {
		judged[s] = true
	}
	for s := range present {
		judged[s] = true
	}
	out.judged = len(judged)
	sort.Slice(out.phantom, func(i, j int) bool { return out.phantom[i].Seq < out.phantom[j].Seq })
	return out
}

// journalSpan is what the journaled acks say about the save's window.
type journalSpan struct {
	seqs []int // journaled seqs, ascending
	// firstAfter: the lowest seq whose write began after the resume; the
	// writer is sequential, so every higher seq began later still.
	firstAfter   int
	maxJournaled int
	// writerPastResume: the last journaled write began after the resume,
	// so a marker beyond the journal's end began after it too
	writerPastResume bool
}

func spanOf(idx map[int]WorkloadAck, w CutWindow) journalSpan {
	var sp journalSpan
	var maxJournaledAck WorkloadAck
	sp.seqs = make([]int, 0, len(idx))
	for s, a := range idx {
		sp.seqs = append(sp.seqs, s)
		if s > sp.maxJournaled {
			sp.maxJournaled, maxJournaledAck = s, a
		}
		if w.GuestClock && w.ResumeNs > 0 && a.BeginNs > w.ResumeNs && (sp.firstAfter == 0 || s < sp.firstAfter) {
			sp.firstAfter = s
		}
	}
	sp.writerPastResume = w.GuestClock && w.ResumeNs > 0 && sp.maxJournaled > 0 && maxJournaledAck.BeginNs > w.ResumeNs
	sort.Ints(sp.seqs)
	return sp
}

// countAcked counts the acks before the pause (lost when absent) and the
// writes begun after the resume.
func (out *cutSide) countAcked(idx map[int]WorkloadAck, sp journalSpan, present map[int]bool, w CutWindow) {
	for _, s := range sp.seqs {
		a := idx[s]
		t := a.HostNs
		if w.GuestClock {
			t = a.AckNs
		}
		if t > 0 && t < w.PauseNs {
			out.ackedBefore++
			if !present[s] {
				out.lost = append(out.lost, SeqAt{s, relTimes(w, a)})
			}
		}
		if sp.firstAfter > 0 && s >= sp.firstAfter {
			out.afterRes++
		}
	}
}

// findPhantoms finds the present markers the snapshot cannot hold (below
// the writer's first seq, or begun after the resume) and returns the
// highest present seq that is not one: holes are judged below it.
func (out *cutSide) findPhantoms(idx map[int]WorkloadAck, sp journalSpan, present map[int]bool, first int, w CutWindow) int {
	maxPresent := 0
	for s := range present {
		n := len(out.phantom)
		switch {
		case s < first:
			out.phantom = append(out.phantom, SeqAt{s, "below the writer's first seq " + strconv.Itoa(first) + ": never written by this run"})
		case sp.firstAfter > 0 && s >= sp.firstAfter:
			if a, ok := idx[s]; ok {
				out.phantom = append(out.phantom, SeqAt{s, relTimes(w, a)})
			} else {
				out.phantom = append(out.phantom, SeqAt{s, "not journaled; after seq " + strconv.Itoa(sp.firstAfter) + ", which began after the resume"})
			}
		case s > sp.maxJournaled && sp.writerPastResume:
			out.phantom = append(out.phantom, SeqAt{s, "not journaled; after seq " + strconv.Itoa(sp.maxJournaled) + ", which began after the resume"})
		}
		if len(out.phantom) == n {
			maxPresent = max(maxPresent, s)
		}
	}
	return maxPresent
}

// findHoles sets the cut (the last seq of the unbroken run from first) and
// lists the absent, not lost, seqs between it and maxPresent.
func (out *cutSide) findHoles(idx map[int]WorkloadAck, present map[int]bool, first, maxPresent int, w CutWindow) {
	lost := map[int]bool{}
	for _, l := range out.lost {
		lost[l.Seq] = true
	}
	out.cut = first - 1
	for present[out.cut+1] {
		out.cut++
	}
	for s := out.cut + 1; s < maxPresent; s++ {
		if !present[s] && !lost[s] {
			when := "never acked"
			if a, ok := idx[s]; ok {
				when = relTimes(w, a)
			}
			out.hole = append(out.hole, SeqAt{s, when})
		}
	}
}

// ClassifyCut judges one listing against the capture window.
func ClassifyCut(in CutInput) CutVerdict {
	idx := ackIndex(in.Acks)
	first := in.First
	if first <= 0 {
		first = 0
		for s := range idx {
			if first == 0 || s < first {
				first = s
			}
		}
		if first == 0 {
			first = 1
		}
	}
	d := judgeSide(in, idx, first, in.Disk)
	v := CutVerdict{Snapshot: in.Window.Snapshot, Source: in.Source, Target: in.Target, First: first, Cut: d.cut,
		Present: d.present, AckedBeforePause: d.ackedBefore, BeganAfterResume: d.afterRes, Judged: d.judged,
		Lost: d.lost, Phantom: d.phantom, Hole: d.hole}
	if in.CheckRAM {
		r := judgeSide(in, idx, first, in.RAM)
		v.RAMCut, v.RAMLost, v.RAMPhantom, v.RAMHole = r.cut, r.lost, r.phantom, r.hole
	}
	if in.Window.PauseNs <= 0 {
		v.NoData = "no pause time for the capture: the cut cannot be judged"
	} else if d.ackedBefore == 0 {
		v.NoData = "no marker was acked before the pause: the workload did not run into the capture"
	}
	v.OK = v.NoData == "" && len(v.Lost)+len(v.Phantom)+len(v.Hole)+len(v.RAMLost)+len(v.RAMPhantom)+len(v.RAMHole) == 0
	v.Message = v.message()
	return v
}

// WakeInput is a hibernate → wake: the listing of the woken guest, judged
// against the NIC drop that cut the writer off.
type WakeInput struct {
	Guest      string
	Acks       []WorkloadAck
	First      int
	DropNs     int64 // the NIC drop (agent.hibernate.nic-dropped) on the trace clock
	FaultNs    int64
	GuestClock bool
	Disk, RAM  []string
	BootBefore string // the writer's boot id before the hibernate
	BootAfter  string // the woken guest's
	// ColdBootAllowed, when not empty, says why the guest may have booted
	// fresh (a power cut killed its VMM before the hibernate was durable): a
	// changed boot id then takes the RAM markers with it legitimately; every
	// disk marker acked before the NIC drop is still required.
	ColdBootAllowed string
}

// ClassifyWake: every marker acked before the NIC drop is present after the
// wake, on disk and in RAM, with no holes, and the boot id is unchanged. No
// PHANTOM by time: the VM never resumed between the drop and the capture.
func ClassifyWake(in WakeInput) CutVerdict {
	cold := in.ColdBootAllowed != "" && in.BootBefore != "" && in.BootAfter != in.BootBefore
	v := ClassifyCut(CutInput{Source: in.Guest, Target: in.Guest, Acks: in.Acks, First: in.First,
		Window: CutWindow{Snapshot: "hibernate", PauseNs: in.DropNs, FaultNs: in.FaultNs, GuestClock: in.GuestClock},
		Disk:   in.Disk, RAM: in.RAM, CheckRAM: !cold})
	v.BootIDBefore, v.BootIDAfter = in.BootBefore, in.BootAfter
	v.BootIDChanged = in.BootBefore == "" || in.BootAfter != in.BootBefore
	if v.NoData != "" && in.DropNs > 0 {
		v.NoData = "no marker was acked before the NIC drop: the workload did not run into the hibernate"
	}
	if cold {
		v.ColdBoot = in.ColdBootAllowed
	} else {
		v.OK = v.OK && !v.BootIDChanged
	}
	if in.DropNs <= 0 {
		v.NoData, v.OK = "no NIC drop time: the wake cannot be judged", false
	}
	v.Message = v.message()
	return v
}

// WithLost is v with more acked markers judged lost (a hibernate's plan
// that lets the writer ack past its snapshot): the verdict fails.
func (v CutVerdict) WithLost(lost []SeqAt) CutVerdict {
	if len(lost) == 0 {
		return v
	}
	v.Lost = append(append([]SeqAt(nil), v.Lost...), lost...)
	v.OK = false
	v.Message = v.message()
	return v
}

func (v CutVerdict) message() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s → %s", v.Source, v.Target)
	if v.Snapshot != "" {
		fmt.Fprintf(&b, " (%s)", v.Snapshot)
	}
	fmt.Fprintf(&b, ": cut seq %d..%d, %d present, %d acked before the pause, %d judged", v.First, v.Cut, v.Present, v.AckedBeforePause, v.Judged)
	if v.NoData != "" {
		b.WriteString("; " + v.NoData)
	}
	list := func(kind string, s []SeqAt) {
		if len(s) == 0 {
			return
		}
		fmt.Fprintf(&b, "; %s %d: ", kind, len(s))
		for i, x := range s {
			if i == 5 {
				fmt.Fprintf(&b, ", … %d more", len(s)-5)
				break
			}
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "seq %d", x.Seq)
			if x.When != "" {
				fmt.Fprintf(&b, " (%s)", x.When)
			}
		}
	}
	list("LOST", v.Lost)
	list("PHANTOM", v.Phantom)
	list("HOLE", v.Hole)
	list("RAM LOST", v.RAMLost)
	list("RAM PHANTOM", v.RAMPhantom)
	list("RAM HOLE", v.RAMHole)
	if v.BootIDChanged {
		fmt.Fprintf(&b, "; boot id changed %q → %q", v.BootIDBefore, v.BootIDAfter)
		if v.ColdBoot != "" {
			fmt.Fprintf(&b, ", accepted: %s (RAM markers not required)", v.ColdBoot)
		}
	}
	return b.String()
}

// relTimes says when a marker was begun and acked relative to the window's
// pause, resume and fault.
func relTimes(w CutWindow, a WorkloadAck) string {
	if !w.GuestClock {
		return "ack received " + rel(a.HostNs, w)
	}
	return "began " + rel(a.BeginNs, w) + ", acked " + rel(a.AckNs, w)
}

func rel(t int64, w CutWindow) string {
	parts := []string{"pause" + signed(t-w.PauseNs)}
	if w.ResumeNs > 0 {
		parts = append(parts, "resume"+signed(t-w.ResumeNs))
	}
	if w.FaultNs > 0 {
		parts = append(parts, "fault"+signed(t-w.FaultNs))
	}
	return strings.Join(parts, " ")
}

func signed(d int64) string {
	s := time.Duration(d).Round(10 * time.Microsecond).String()
	if d >= 0 {
		return "+" + s
	}
	return "−" + strings.TrimPrefix(s, "-")
}
