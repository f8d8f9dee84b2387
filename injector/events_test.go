package injector

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestTraceKeepsEveryEventAcrossChunks: 3.5 chunks of datagrams through a
// real socket while other goroutines copy, scan and wait on the trace without
// pausing (run with -race: a view read outside the lock must never see a slot
// the reader thread is still filling). Every event comes back once, in order,
// at its index.
func TestTraceKeepsEveryEventAcrossChunks(t *testing.T) {
	tr, c := traceAndSender(t)
	total := 3*chunkLen + chunkLen/2
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A waiter armed before the events, one armed after (counts past hits).
	early := make(chan Hit, 1)
	go func() {
		h, err := tr.WaitPoint(ctx, 0, "p", chunkLen+1, "")
		if err != nil {
			t.Error(err)
		}
		early <- h
	}()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				evs := tr.Events()
				for i, e := range evs {
					if e.TsNs != int64(i+1) {
						t.Errorf("during ingest: event %d has ts %d", i, e.TsNs)
						return
					}
				}
				if tail := tr.Since(len(evs) - 5); len(tail) < min(5, len(evs)) {
					t.Errorf("Since(%d) gave %d events", len(evs)-5, len(tail))
					return
				}
				_, _ = tr.LastOf(7, int64(len(evs)))
			}
		}()
	}
	for i := 1; i <= total; i++ {
		msg := fmt.Sprintf(`{"ts_ns":%d,"seq":%d,"pid":7,"proc":"vmctl","point":"p"}`, i, i)
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		if i%256 == 0 {
			time.Sleep(time.Millisecond) // let the reader keep up with a 64 KiB socket buffer
		}
	}
	for tr.Len() < total && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	evs := tr.Events()
	if len(evs) != total {
		t.Fatalf("trace holds %d events, sent %d (lost: %v)", len(evs), total, tr.Lost())
	}
	for i, e := range evs {
		if e.TsNs != int64(i+1) {
			t.Fatalf("event %d has ts %d", i, e.TsNs)
		}
	}
	if h := <-early; h.Index != chunkLen || h.Event.TsNs != chunkLen+1 || h.RecvNs == 0 {
		t.Fatalf("waiter armed before: hit %+v, want index %d", h, chunkLen)
	}
	h, err := tr.WaitPoint(ctx, chunkLen-3, "p", 2*chunkLen, "")
	if err != nil || h.Index != 3*chunkLen-4 || h.Event.TsNs != int64(3*chunkLen-3) {
		t.Fatalf("waiter armed after, from %d: %+v %v", chunkLen-3, h, err)
	}
	if got := tr.Since(2*chunkLen - 1); len(got) != total-2*chunkLen+1 || got[0].TsNs != int64(2*chunkLen) {
		t.Fatalf("Since across a chunk edge: %d events, first %+v", len(got), got[0])
	}
	if e, ok := tr.LastOf(7, int64(2*chunkLen+1)); !ok || e.TsNs != int64(2*chunkLen+1) {
		t.Fatalf("LastOf across chunks: %+v %v", e, ok)
	}
	if l := tr.Lost(); len(l) != 0 {
		t.Fatalf("lost %v", l)
	}
}

// traceAndSender opens a trace and a datagram socket to it, both closed when
// the test ends.
func traceAndSender(tb testing.TB) (*Trace, net.Conn) {
	tr, err := ListenTrace(filepath.Join(tb.TempDir(), "t.sock"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Close() })
	c, err := net.Dial("unixgram", tr.Path())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return tr, c
}
