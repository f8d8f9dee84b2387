package ledger

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkJournalAppend: one intent line, appended and fsynced. Two of
// these bound the host-side cost of a marker.
func BenchmarkJournalAppend(b *testing.B) {
	k, err := NewKey(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	l, err := Open(filepath.Join(b.TempDir(), "ledger.jsonl"), k, filepath.Join(b.TempDir(), "pins"))
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; b.Loop(); i++ {
		if err := l.append(Entry{Kind: KindIntent, Guest: "g1", Marker: fmt.Sprintf("m%d", i)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClassify10k: the verdict over a journal of 10 000 markers of
// 100 guests, for one guest.
func BenchmarkClassify10k(b *testing.B) {
	var entries []Entry
	var disk []string
	for i := range 10000 {
		g := fmt.Sprintf("g%d", i%100)
		m := fmt.Sprintf("%s.m%d", g, i)
		entries = append(entries, intent(g, m), acked(g, m, "b"))
		if g == "g7" {
			disk = append(disk, m)
		}
	}
	obs := Observed{Disk: disk, RAM: disk, BootID: "b", CheckRAM: true}
	for b.Loop() {
		if v := Classify("g7", entries, obs); !v.OK || v.Stable != 100 {
			b.Fatalf("%+v", v)
		}
	}
}

// BenchmarkWriteMarkers: one marker into a running fakech guest over SSH
// (connect, handshake, pin check, mkdir+touch+sync+touch+cat, two fsynced
// journal lines).
func BenchmarkWriteMarkers(b *testing.B) {
	r := newBenchRig(b)
	for i := 0; b.Loop(); i++ {
		if _, err := r.ledger.WriteMarkers(r.ctx, r.guest, i); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerify: list disk and RAM markers and the boot id of a guest
// holding 50 markers, and classify them.
func BenchmarkVerify(b *testing.B) {
	r := newBenchRig(b)
	for i := range 50 {
		if _, err := r.ledger.WriteMarkers(r.ctx, r.guest, i); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		v, err := r.ledger.Verify(r.ctx, r.guest, VerifyOpts{ExpectRAM: true})
		if err != nil || !v.OK || v.Stable != 50 {
			b.Fatalf("%+v %v", v, err)
		}
	}
}

type benchRig struct {
	*rig
	ctx context.Context
}

func newBenchRig(b *testing.B) benchRig {
	r := newRig(b, "bench")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	b.Cleanup(cancel)
	r.boot(ctx)
	// The first contact (pin) and the guest's boot happen outside the
	// measured loop.
	if _, err := r.ledger.Exec(ctx, r.guest, "true"); err != nil {
		b.Fatal(err)
	}
	return benchRig{rig: r, ctx: ctx}
}
