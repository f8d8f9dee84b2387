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
}

// evView is a published prefix of a trace.
type evView struct {
	chunks []*evChunk
	n      int
}

// view is the published prefix; call with Trace.mu held.
func (s *evStore) view() evView { return evView{s.chunks, s.n} }

// slot returns where event n goes, making a new chunk when one is full. The
// reader thread fills it before publish makes it visible, so filling needs no
// lock.
func (s *evStore) slot(spare **evChunk) (*failpoint.Event, *int64, bool) {
	c, i := s.n/chunkLen, s.n%chunkLen
	if c < len(s.chunks) {
		return &s.chunks[c].ev[i], &s.chunks[c].recv[i], false
	}
	if *spare == nil {
		*spare = new(evChunk)
	}
	return &(*spare).ev[0], &(*spare).recv[0], true
}

// publish makes the slot filled last visible; call with Trace.mu held.
// newChunk says slot handed out the spare, which joins the store here.
func (s *evStore) publish(spare **evChunk, newChunk bool) {
	if newChunk {
		s.chunks = append(s.chunks, *spare)
		*spare = nil
	}
	s.n++
}

func (v evView) Len() int { return v.n }

// at is event i (i < Len) and when it was read.
func (v evView) at(i int) (*failpoint.Event, int64) {
	c := v.chunks[i/chunkLen]
	return &c.ev[i%chunkLen], c.recv[i%chunkLen]
}

func (v evView) hit(i int) Hit {
	e, recv := v.at(i)
	return Hit{Index: i, Event: *e, RecvNs: recv}
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
