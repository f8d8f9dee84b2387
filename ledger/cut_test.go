package ledger

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// history is a synthetic writer run: seq i began at i*10ms and was acked 1ms
// later (guest clock = trace clock), received by the host 2ms after that.
func history(from, to int) []WorkloadAck {
	var out []WorkloadAck
	for s := from; s <= to; s++ {
		b := int64(s) * 10e6
		out = append(out, WorkloadAck{Seq: s, BeginNs: b, AckNs: b + 1e6, HostNs: b + 3e6})
	}
	return out
}

func names(seqs ...[2]int) []string {
	var out []string
	for _, r := range seqs {
		for s := r[0]; s <= r[1]; s++ {
			out = append(out, fmt.Sprintf("seq-%d", s))
		}
	}
	return out
}

func seqsOf(s []SeqAt) []int {
	var out []int
	for _, x := range s {
		out = append(out, x.Seq)
	}
	return out
}

// pause between seq 20's ack (201ms) and seq 21's begin (210ms); resume
// between seq 24's ack and seq 25's begin.
var win = CutWindow{Snapshot: "snap", PauseNs: 205e6, ResumeNs: 245e6, GuestClock: true}

func TestClassifyCut(t *testing.T) {
	for _, tc := range []struct {
		name                string
		acks                []WorkloadAck
		first               int
		w                   CutWindow
		disk, ram           []string
		checkRAM            bool
		ok                  bool
		cut                 int
		lost, phantom, hole []int
		ramLost             []int
		noData              bool
	}{
		{name: "consistent: exactly the acked prefix", acks: history(1, 30), w: win, disk: names([2]int{1, 20}), ok: true, cut: 20},
		{name: "consistent: in-flight markers between pause and resume may be in", acks: history(1, 30), w: win, disk: names([2]int{1, 24}), ok: true, cut: 24},
		{name: "LOST: acked before the pause, missing", acks: history(1, 30), w: win, disk: names([2]int{1, 19}), cut: 19, lost: []int{20}},
		{name: "LOST in the middle is not also a HOLE", acks: history(1, 30), w: win, disk: names([2]int{1, 9}, [2]int{11, 20}), cut: 9, lost: []int{10}},
		{name: "PHANTOM: began after the resume (disk copied after resume)", acks: history(1, 30), w: win, disk: names([2]int{1, 27}), cut: 27, phantom: []int{25, 26, 27}},
		{name: "PHANTOM without the markers between: no holes reported above the resume", acks: history(1, 30), w: win, disk: names([2]int{1, 20}, [2]int{28, 28}), cut: 20, phantom: []int{28}},
		{name: "HOLE: an unacked marker missing below a present one", acks: history(1, 20), w: win, disk: names([2]int{1, 20}, [2]int{22, 22}), cut: 20, hole: []int{21}},
		{name: "torn journal: present markers beyond the journal are in flight", acks: history(1, 20), w: win, disk: names([2]int{1, 23}), ok: true, cut: 23},
		{name: "unjournaled marker after a writer that got past the resume", acks: history(1, 26), w: win, disk: names([2]int{1, 20}, [2]int{31, 31}), cut: 20, phantom: []int{31}},
		{name: "below the writer's first seq", acks: history(5, 30), first: 5, w: win, disk: names([2]int{3, 3}, [2]int{5, 20}), cut: 20, phantom: []int{3}},
		{name: "no marker acked before the pause: no data, not a pass", acks: history(21, 30), w: win, disk: names([2]int{21, 22}), cut: 22, noData: true},
		{name: "no pause time", acks: history(1, 30), w: CutWindow{GuestClock: true}, disk: names([2]int{1, 20}), cut: 20, noData: true},
		{name: "RAM LOST while the disk is fine", acks: history(1, 30), w: win, disk: names([2]int{1, 20}), ram: names([2]int{1, 18}), checkRAM: true, cut: 20, ramLost: []int{19, 20}},
		{name: "RAM not judged without CheckRAM", acks: history(1, 30), w: win, disk: names([2]int{1, 20}), ram: nil, ok: true, cut: 20},
		{name: "host clock only: receipt before the pause binds, no phantom by time", acks: history(1, 30), w: CutWindow{PauseNs: 205e6, ResumeNs: 245e6}, disk: names([2]int{1, 27}), ok: true, cut: 27},
		{name: "host clock only: seq 20 received after the pause is not binding", acks: history(1, 30), w: CutWindow{PauseNs: 202e6, ResumeNs: 245e6}, disk: names([2]int{1, 19}), ok: true, cut: 19},
		{name: "other files in the dir are ignored", acks: history(1, 30), w: win, disk: append(names([2]int{1, 20}), "lost+found", "seq-", "seq-0", "seq-01", "x"), ok: true, cut: 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := ClassifyCut(CutInput{Source: "a", Target: "b", Acks: tc.acks, First: tc.first, Window: tc.w, Disk: tc.disk, RAM: tc.ram, CheckRAM: tc.checkRAM})
			if v.OK != tc.ok || v.Cut != tc.cut || (v.NoData != "") != tc.noData {
				t.Fatalf("ok %v cut %d nodata %q, want ok %v cut %d nodata %v: %s", v.OK, v.Cut, v.NoData, tc.ok, tc.cut, tc.noData, v.Message)
			}
			for _, c := range []struct {
				kind      string
				got, want []int
			}{{"lost", seqsOf(v.Lost), tc.lost}, {"phantom", seqsOf(v.Phantom), tc.phantom}, {"hole", seqsOf(v.Hole), tc.hole}, {"ram lost", seqsOf(v.RAMLost), tc.ramLost}} {
				if !reflect.DeepEqual(c.got, c.want) {
					t.Errorf("%s %v, want %v: %s", c.kind, c.got, c.want, v.Message)
				}
			}
			for _, k := range []string{"LOST", "PHANTOM", "HOLE"} {
				has := strings.Contains(v.Message, "; "+k+" ")
				want := k == "LOST" && len(tc.lost) > 0 || k == "PHANTOM" && len(tc.phantom) > 0 || k == "HOLE" && len(tc.hole) > 0
				if has != want {
					t.Errorf("message %q: %s listed %v, want %v", v.Message, k, has, want)
				}
			}
		})
	}
}

func TestCutTimesAreRelativeToThePauseAndResume(t *testing.T) {
	w := win
	w.FaultNs = 200e6
	v := ClassifyCut(CutInput{Source: "a", Target: "b", Acks: history(1, 30), Window: w, Disk: names([2]int{1, 19}, [2]int{25, 25})})
	if len(v.Lost) != 1 || v.Lost[0].When != "began pause−5ms resume−45ms fault+0s, acked pause−4ms resume−44ms fault+1ms" {
		t.Fatalf("lost %+v", v.Lost)
	}
	if len(v.Phantom) != 1 || !strings.HasPrefix(v.Phantom[0].When, "began pause+45ms resume+5ms") {
		t.Fatalf("phantom %+v", v.Phantom)
	}
}

func TestClassifyWake(t *testing.T) {
	in := WakeInput{Guest: "a", Acks: history(1, 30), DropNs: 205e6, GuestClock: true,
		Disk: names([2]int{1, 22}), RAM: names([2]int{1, 22}), BootBefore: "b1", BootAfter: "b1"}
	if v := ClassifyWake(in); !v.OK || v.Cut != 22 {
		t.Fatalf("clean wake: %s", v.Message)
	}
	fresh := in
	fresh.BootAfter, fresh.RAM = "b2", nil
	v := ClassifyWake(fresh)
	if v.OK || !v.BootIDChanged || len(v.RAMLost) != 20 || !strings.Contains(v.Message, "boot id changed") {
		t.Fatalf("fresh boot over the hibernate snapshot passed: %s", v.Message)
	}
	lost := in
	lost.Disk = names([2]int{1, 15})
	if v := ClassifyWake(lost); v.OK || !reflect.DeepEqual(seqsOf(v.Lost), []int{16, 17, 18, 19, 20}) {
		t.Fatalf("lost before the NIC drop: %s", v.Message)
	}
	nodrop := in
	nodrop.DropNs = 0
	if v := ClassifyWake(nodrop); v.OK || v.NoData == "" {
		t.Fatalf("no drop time passed: %s", v.Message)
	}
	// A power cut killed the VMM: a fresh boot may take the RAM markers, never
	// a disk marker acked before the drop.
	cut := fresh
	cut.ColdBootAllowed = "power cut: 1 VMM(s) died with the node"
	if v := ClassifyWake(cut); !v.OK || v.ColdBoot == "" || !strings.Contains(v.Message, "accepted: power cut") {
		t.Fatalf("a cold boot the power cut explains failed: %s", v.Message)
	}
	cutLost := cut
	cutLost.Disk = names([2]int{1, 15})
	if v := ClassifyWake(cutLost); v.OK || !reflect.DeepEqual(seqsOf(v.Lost), []int{16, 17, 18, 19, 20}) {
		t.Fatalf("disk markers lost in a power cut passed: %s", v.Message)
	}
	// The allowance is not a pass for an unchanged boot that lost RAM.
	ramGone := in
	ramGone.ColdBootAllowed, ramGone.RAM = "power cut", nil
	if v := ClassifyWake(ramGone); v.OK {
		t.Fatalf("RAM markers gone without a reboot passed: %s", v.Message)
	}
}

func TestCutRewrittenSeqKeepsItsFirstHistory(t *testing.T) {
	acks := history(1, 30)
	// a later session rewrote seq 20 long after the resume
	acks = append(acks, WorkloadAck{Seq: 20, BeginNs: 900e6, AckNs: 901e6, HostNs: 903e6})
	v := ClassifyCut(CutInput{Source: "a", Target: "b", Acks: acks, Window: win, Disk: names([2]int{1, 19})})
	if v.OK || !reflect.DeepEqual(seqsOf(v.Lost), []int{20}) {
		t.Fatalf("%s", v.Message)
	}
}

// FuzzClassifyCut builds a writer history around a pause/resume from the
// fuzzer's numbers (markers 1..p written before the pause, p+1..n after the
// resume, the journal torn after seq t), a listing that is the exact cut or
// one mutation of it, and checks the verdict: the cut passes whatever the
// journal lost; a dropped acked marker is LOST, an added post-resume one
// PHANTOM, a dropped unjournaled one below a present one a HOLE.
func FuzzClassifyCut(f *testing.F) {
	f.Add(uint8(40), uint8(20), uint8(30), uint8(0), uint8(0))
	f.Add(uint8(40), uint8(20), uint8(10), uint8(1), uint8(5))
	f.Add(uint8(40), uint8(20), uint8(30), uint8(2), uint8(25))
	f.Add(uint8(40), uint8(20), uint8(15), uint8(3), uint8(18))
	f.Add(uint8(5), uint8(0), uint8(0), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, nb, pb, tb, op, xb uint8) {
		n := int(nb)%200 + 1
		p := int(pb) % (n + 1) // markers 1..p before the pause
		torn := int(tb) % (n + 1)
		const pause, resume = int64(1e9), int64(2e9)
		var acks []WorkloadAck
		for s := 1; s <= torn; s++ {
			b := int64(s) * 1e6 // before the pause
			if s > p {
				b = resume + int64(s)*1e6
			}
			acks = append(acks, WorkloadAck{Seq: s, BeginNs: b, AckNs: b + 1e5, HostNs: b + 3e5})
		}
		present := map[int]bool{}
		for s := 1; s <= p; s++ {
			present[s] = true
		}
		x := int(xb)%n + 1
		switch op % 4 {
		case 1: // drop a pre-pause marker
			if x > p {
				return
			}
			delete(present, x)
		case 2: // add a post-resume marker
			if x <= p {
				return
			}
			present[x] = true
		case 3: // drop an in-flight (unjournaled) pre-pause marker below the top
			if x > p || x <= torn || x == p {
				return
			}
			delete(present, x)
		}
		var disk []string
		for s := range present {
			disk = append(disk, fmt.Sprintf("seq-%d", s))
		}
		w := CutWindow{PauseNs: pause, ResumeNs: resume, GuestClock: true}
		v := ClassifyCut(CutInput{Source: "a", Target: "b", Acks: acks, First: 1, Window: w, Disk: disk, RAM: disk, CheckRAM: true})
		findings := len(v.Lost) + len(v.Phantom) + len(v.Hole)
		if v.OK && (findings > 0 || v.NoData != "") {
			t.Fatalf("OK with findings: %s", v.Message)
		}
		acked := min(p, torn)
		switch op % 4 {
		case 0:
			if findings != 0 {
				t.Fatalf("the exact cut 1..%d (journal torn after %d) failed: %s", p, torn, v.Message)
			}
			if v.OK != (acked > 0) || v.Cut != p {
				t.Fatalf("exact cut: ok %v cut %d, want ok %v cut %d: %s", v.OK, v.Cut, acked > 0, p, v.Message)
			}
		case 1:
			if x <= torn && !reflect.DeepEqual(seqsOf(v.Lost), []int{x}) {
				t.Fatalf("dropped acked seq %d: %s", x, v.Message)
			}
			if x > torn && x < p && !reflect.DeepEqual(seqsOf(v.Hole), []int{x}) {
				t.Fatalf("dropped unjournaled seq %d below %d: %s", x, p, v.Message)
			}
			if x > torn && x == p {
				// the top marker, never acked: a cut just below it is consistent
				if findings != 0 {
					t.Fatalf("dropped the unacked top seq %d: %s", x, v.Message)
				}
			} else if v.OK {
				t.Fatalf("dropped seq %d passed: %s", x, v.Message)
			}
		case 2:
			if x <= torn && !reflect.DeepEqual(seqsOf(v.Phantom), []int{x}) {
				t.Fatalf("added post-resume seq %d: %s", x, v.Message)
			}
			if len(v.Lost) != 0 {
				t.Fatalf("added seq %d made something LOST: %s", x, v.Message)
			}
		case 3:
			if !reflect.DeepEqual(seqsOf(v.Hole), []int{x}) || v.OK {
				t.Fatalf("dropped in-flight seq %d: %s", x, v.Message)
			}
		}
	})
}
