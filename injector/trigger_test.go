package injector

import (
	"reflect"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/offset"
)

func TestParseTrigger(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Trigger
	}{
		{"at vm.clone.reserved#1@vm=x + 59ms", Trigger{Kind: "at", Point: "vm.clone.reserved", N: 1, VM: "x", Offset: 59 * time.Millisecond}},
		{"at snapshot.save.paused", Trigger{Kind: "at", Point: "snapshot.save.paused", N: 1}},
		{"at a.b#3+1.5s", Trigger{Kind: "at", Point: "a.b", N: 3, Offset: 1500 * time.Millisecond}},
		{"at a.b + 0.25", Trigger{Kind: "at", Point: "a.b", N: 1, Offset: 250 * time.Microsecond}},
		{"park snapshot.save.paused", Trigger{Kind: "park", Point: "snapshot.save.paused", N: 1}},
		{"park vm.clone.restored@vm=ABC", Trigger{Kind: "park", Point: "vm.clone.restored", N: 1, VM: "ABC"}},
		// the N-th hit: the runner's pause spec passes the first N-1
		{"park ch.resume#2@vm=ABC", Trigger{Kind: "park", Point: "ch.resume", N: 2, VM: "ABC"}},
		{"after-exit snapshot-save + 28ms", Trigger{Kind: "after-exit", Child: "snapshot-save", N: 1, Offset: 28 * time.Millisecond}},
	} {
		got, err := ParseTrigger(c.in)
		if err != nil {
			t.Fatalf("%q: %v", c.in, err)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Fatalf("%q: got %+v want %+v", c.in, got, c.want)
		}
		again, err := ParseTrigger(got.String())
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("%q: round trip via %q: %+v %v", c.in, got.String(), again, err)
		}
	}
	for _, bad := range []string{"", "at", "kill x", "at x + -1ms", "park x + 1ms", "park x#0", "at x#0", "at x#01", "at x y", "at x@vm=", "at x + 2d", "at x + 25h"} {
		if _, err := ParseTrigger(bad); err == nil {
			t.Fatalf("%q: accepted", bad)
		}
	}
}

func TestParseSweep(t *testing.T) {
	got, err := ParseSweep("0ms..8s/250ms")
	if err != nil || len(got) != 33 || got[0] != 0 || got[32] != 8*time.Second {
		t.Fatalf("got %d offsets (%v) %v", len(got), got, err)
	}
	got, err = ParseSweep("0,59ms,1s")
	if err != nil || !reflect.DeepEqual(got, []time.Duration{0, 59 * time.Millisecond, time.Second}) {
		t.Fatalf("list: %v %v", got, err)
	}
	for _, bad := range []string{"", "1s..0/1ms", "0..1s/0", "0..1s", "0..24h/1us", "a,b"} {
		if _, err := ParseSweep(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

func FuzzParseTrigger(f *testing.F) {
	for _, s := range []string{"at vm.clone.reserved#1@vm=x + 59ms", "park snapshot.save.paused", "after-exit snapshot-save + 28ms", "at a+0.0001", "at a#9@vm=b+1h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tr, err := ParseTrigger(s)
		if err != nil {
			return
		}
		again, err := ParseTrigger(tr.String())
		if err != nil || !reflect.DeepEqual(again, tr) {
			t.Fatalf("%q → %q → %+v, %v", s, tr.String(), again, err)
		}
	})
}

func FuzzParseSweep(f *testing.F) {
	for _, s := range []string{"0ms..8s/250ms", "0,1,10ms", "5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ds, err := ParseSweep(s)
		if err != nil {
			return
		}
		if len(ds) == 0 || len(ds) > maxSweep+1 {
			t.Fatalf("%q: %d offsets", s, len(ds))
		}
		for _, d := range ds {
			if d < 0 || d > offset.Max {
				t.Fatalf("%q: offset %v out of range", s, d)
			}
		}
	})
}
