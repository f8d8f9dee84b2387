package injector

import (
	"context"
	"net"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// TestLostBetweenKeepsRunsThatMayLieInTheWindow: a run of lost datagrams
// lies between the stamps of the datagrams around it; LostBetween keeps the
// runs whose span meets the window, so a judgement is refused only for a
// loss it may depend on.
func TestLostBetweenKeepsRunsThatMayLieInTheWindow(t *testing.T) {
	ev := func(ts int64, pid int, seq uint64) failpoint.Event {
		return failpoint.Event{TsNs: ts, Proc: "vmctl", Pid: pid, Point: "x", Seq: seq}
	}
	events := []failpoint.Event{
		ev(10, 1, 1), ev(20, 1, 3), // #2 of pid 1 in (10, 20)
		ev(50, 2, 2),                                // #1 of pid 2 before 50
		ev(100, 3, 1), ev(300, 3, 2), ev(400, 3, 5), // #3..#4 of pid 3 in (300, 400)
	}
	for _, tc := range []struct {
		from, to int64
		want     []int // pids of the runs kept
	}{
		{0, 5, []int{2}},           // only a run with no lower bound
		{15, 15, []int{1, 2}},      // inside pid 1's span
		{25, 45, []int{2}},         // between: pid 2's run has no lower bound
		{60, 299, nil},             // nothing may have been lost there
		{350, 1000, []int{3}},      // pid 3's run
		{400, 400, []int{3}},       // a closed edge
		{401, 1 << 40, []int(nil)}, // after every run
	} {
		var got []int
		for _, l := range LostBetween(events, tc.from, tc.to) {
			got = append(got, l.Pid)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("LostBetween [%d, %d] = pids %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

// TestTailLostFindsWhatNoGapShows: the datagrams a cleanly exited process
// sent after the last one that arrived leave no gap; its trace end (how many
// it sent) shows them. A stream received whole, a later incarnation under
// the same pid, and a process that sent nothing are not losses.
func TestTailLostFindsWhatNoGapShows(t *testing.T) {
	ev := func(ts int64, pid int, seq uint64) failpoint.Event {
		return failpoint.Event{TsNs: ts, Proc: "vmctl", Pid: pid, Point: "x", Seq: seq}
	}
	events := []failpoint.Event{
		ev(10, 1, 1), ev(20, 1, 2), // pid 1 sent 4: #3..#4 lost at the tail
		ev(30, 2, 1), ev(40, 2, 2), // pid 2 sent 2: whole
		ev(50, 1, 1), ev(60, 1, 2), ev(70, 1, 3), // pid 1 again (reused), sent 3: whole
	}
	ends := []failpoint.TraceEnd{
		{Proc: "vmctl", Pid: 1, FirstTsNs: 10, LastSeq: 4},
		{Proc: "vmctl", Pid: 2, FirstTsNs: 30, LastSeq: 2},
		{Proc: "vmctl", Pid: 1, FirstTsNs: 50, LastSeq: 3},
		{Proc: "vmctl", Pid: 3, LastSeq: 0},
	}
	want := []Loss{{Proc: "vmctl", Pid: 1, First: 3, Last: 4, AfterNs: 20}}
	if got := TailLost(events, ends); !reflect.DeepEqual(got, want) {
		t.Fatalf("TailLost = %v, want %v", got, want)
	}
	// every datagram of a stream lost: the end still accounts for them
	if got := TailLost(nil, ends[:1]); len(got) != 1 || got[0].First != 1 || got[0].Last != 4 {
		t.Fatalf("TailLost of a stream that never arrived = %v", got)
	}
}

// TestDrainIngestsWhatTheSocketHolds: datagrams already written to the
// trace socket are in the trace once Drain returns, so a check at teardown
// never takes a queued datagram for a lost one.
func TestDrainIngestsWhatTheSocketHolds(t *testing.T) {
	tr, err := ListenTrace(filepath.Join(t.TempDir(), "t.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	c, err := net.Dial("unixgram", tr.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 200
	for i := 1; i <= n; i++ {
		if _, err := c.Write([]byte(`{"ts_ns":1,"pid":1,"proc":"vmctl","point":"x"}`)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := tr.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := tr.Len(); got != n {
		t.Fatalf("after Drain the trace holds %d of %d datagrams", got, n)
	}
	tr.Close()
	if err := tr.Drain(ctx); err != ErrTraceClosed {
		t.Fatalf("Drain of a closed trace: %v", err)
	}
}
