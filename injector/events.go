package injector

import "github.com/vmchaos/vmchaos/failpoint"

// chunkLen is how many events one chunk of a trace holds. A chunk is never
// moved or grown, so appending never copies the trace: with one slice, each
// growth of a 150k-event trace (17 MB) copied it on the reader thread, under
// the lock, for milliseconds, and a signal due then fired that late.
const chunkLen = 1024

type evChunk struct {
	ev   [chunkLen]failpoint.Event
	recv [chunkLen]int64 // CLOCK_MONOTONIC when each event was read
}

// evStore is an append-only trace. Only the reader thread appends. An event
// at an index below a published length never changes again, so a view taken
// under Trace.mu can be read after the lock is released: a long scan or a
// copy of the whole trace no longer holds the lock the reader thread needs
// for every datagram.
type evStore struct {
	chunks []*evChunk
	n      int
	next   *evChunk // reader thread only: the chunk event n goes into when the last is full
}

// evView is a published prefix of a trace.
type evView struct {
	chunks []*evChunk
	n      int
}

// view is the published prefix; call with Trace.mu held.
func (s *evStore) view() evView { return evView{s.chunks, s.n} }

// slot returns where event n goes. The reader thread fills it before publish
// makes it visible, so filling needs no lock; a new chunk is made here, not
// under the lock.
func (s *evStore) slot() (*failpoint.Event, *int64) {
	c, i := s.n/chunkLen, s.n%chunkLen
	if c < len(s.chunks) {
		return &s.chunks[c].ev[i], &s.chunks[c].recv[i]
	}
	if s.next == nil {
		s.next = new(evChunk)
	}
	return &s.next.ev[0], &s.next.recv[0]
}

// publish makes the slot filled last visible; call with Trace.mu held.
func (s *evStore) publish() {
	if s.n == len(s.chunks)*chunkLen {
		s.chunks = append(s.chunks, s.next)
		s.next = nil
	}
	s.n++
}

func (v evView) Len() int { return v.n }

// at is event i (i < Len).
func (v evView) at(i int) *failpoint.Event { return &v.chunks[i/chunkLen].ev[i%chunkLen] }

// hit is event i with when it was read.
func (v evView) hit(i int) Hit {
	c := v.chunks[i/chunkLen]
	return Hit{Index: i, Event: c.ev[i%chunkLen], RecvNs: c.recv[i%chunkLen]}
}

// copyFrom returns a copy of events [i, Len).
func (v evView) copyFrom(i int) []failpoint.Event {
	i = max(0, i)
	if i >= v.n {
		return nil
	}
	out := make([]failpoint.Event, 0, v.n-i)
	for i < v.n {
		c, k := i/chunkLen, i%chunkLen
		end := min(chunkLen, k+v.n-i)
		out = append(out, v.chunks[c].ev[k:end]...)
		i += end - k
	}
	return out
}
