package writerproto

import (
	"strings"
	"testing"
	"time"
)

func TestParseTakesTheWritersArguments(t *testing.T) {
	o, err := Parse(strings.Fields("--rate 500 --start 7 --count 3 --group-ms 2.5 --dir /d --ram-dir /run/r"))
	if err != nil {
		t.Fatal(err)
	}
	want := Opts{Rate: 500, Start: 7, Count: 3, Group: 2500 * time.Microsecond, Disk: "/d", RAM: "/run/r"}
	if o != want {
		t.Fatalf("got %+v, want %+v", o, want)
	}
	if o, err = Parse(strings.Fields("--start auto")); err != nil || o.Start != 0 || o.Rate != DefaultRate || o.Disk != DiskDir || o.RAM != RAMDir {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	for _, bad := range []string{"--rate 0", "--rate -1", "--rate x", "--rate 1e9", "--start 0", "--start x", "--count -1",
		"--group-ms -1", "--bogus 1", "--rate", "--dir"} {
		if _, err := Parse(strings.Fields(bad)); err == nil || !strings.HasPrefix(err.Error(), Cmd+": ") {
			t.Errorf("%q: error %v, want one naming %s", bad, err, Cmd)
		}
	}
}

func TestLinesRoundTrip(t *testing.T) {
	seq, boot, err := ParseStart(StartLine(12, "b-1"))
	if err != nil || seq != 12 || boot != "b-1" {
		t.Fatalf("start: %d %q %v", seq, boot, err)
	}
	lines := strings.SplitAfter(AckLines(5, 3, 100, 200), "\n")
	if len(lines) != 4 || lines[3] != "" {
		t.Fatalf("ack lines %q", lines)
	}
	for i, l := range lines[:3] {
		s, b, a, err := ParseAck(l)
		if err != nil || s != 5+i || b != 100 || a != 200 {
			t.Fatalf("ack %q: %d %d %d %v", l, s, b, a, err)
		}
	}
	for _, bad := range []string{"start 0 b", "start 1", "ack x 1 2", "ack 0 1 2", "nack 1 2 3"} {
		_, _, e1 := ParseStart(bad)
		_, _, _, e2 := ParseAck(bad)
		if e1 == nil && e2 == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestPacerBatchesWhatIsDueAndStopsAtTheCount(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := NewPacer(Opts{Rate: 1000, Group: 5 * time.Millisecond, Count: 100}, t0)
	if n := p.Batch(t0, false); n != 1 {
		t.Fatalf("first batch %d, want 1", n)
	}
	p.Synced(1, t0)
	if w := p.Wake(); !w.Equal(t0.Add(5 * time.Millisecond)) {
		t.Fatalf("wake %v after t0, want the group interval", w.Sub(t0))
	}
	// 10 ms later: markers 2..11 are due (one every ms) and share a sync
	if n := p.Batch(t0.Add(10*time.Millisecond), false); n != 10 {
		t.Fatalf("batch %d, want 10", n)
	}
	p.Synced(10, t0.Add(10*time.Millisecond))
	// a long stall: the backlog is capped at MaxBatch, not owed in full
	if n := p.Batch(t0.Add(time.Hour), false); n != 1 {
		t.Fatalf("after an hour's stall batch %d, want 1 (backlog dropped)", n)
	}
	if n := p.Batch(t0.Add(time.Hour+500*time.Millisecond), false); n != MaxBatch {
		t.Fatalf("batch %d, want MaxBatch", n)
	}
	p.Synced(MaxBatch, t0.Add(time.Hour))
	left := 100 - 11 - MaxBatch
	if n := p.Batch(t0.Add(2*time.Hour), true); n != 1 {
		t.Fatalf("stalled batch %d, want 1", n)
	}
	if n := p.Batch(t0.Add(2*time.Hour+time.Second/2), false); n != left {
		t.Fatalf("batch %d, want the %d left of the count", n, left)
	}
	p.Synced(left, t0.Add(2*time.Hour))
	if !p.Finished() {
		t.Fatal("count reached, pacer not finished")
	}
}

// FuzzParse: arguments from the SSH command line never panic, and what
// parses is within the bounds the writer relies on.
func FuzzParse(f *testing.F) {
	f.Add("--rate 200 --start auto --count 0 --group-ms 5")
	f.Add("--dir /x --ram-dir /run/y --start 3")
	f.Fuzz(func(t *testing.T, s string) {
		o, err := Parse(strings.Fields(s))
		if err != nil {
			return
		}
		if !(o.Rate > 0 && o.Rate <= 100000) || o.Start < 0 || o.Count < 0 || o.Group < 0 || o.Disk == "" || o.RAM == "" {
			t.Fatalf("%q parsed out of bounds: %+v", s, o)
		}
	})
}
