package injector

import (
	"fmt"

	"github.com/vmchaos/vmchaos/failpoint"
)

// Loss is a run of trace datagrams one emitting process sent but the harness
// never read: sequence numbers First..Last (inclusive) of (Proc, Pid).
type Loss struct {
	Proc  string `json:"proc"`
	Pid   int    `json:"pid"`
	First uint64 `json:"first"`
	Last  uint64 `json:"last"`
	// The run was sent after AfterNs (the ts_ns of the stream's datagram
	// before it; 0: it began at #1, so any time before BeforeNs) and before
	// BeforeNs (the datagram that showed the gap; 0: a lost tail, any time
	// after AfterNs).
	AfterNs  int64 `json:"after_ns,omitempty"`
	BeforeNs int64 `json:"before_ns,omitempty"`
}

// In reports whether the run may have been sent within [fromNs, toNs].
func (l Loss) In(fromNs, toNs int64) bool {
	return l.AfterNs <= toNs && (l.BeforeNs == 0 || l.BeforeNs >= fromNs)
}

// Count is how many datagrams the run holds.
func (l Loss) Count() uint64 { return l.Last - l.First + 1 }

func (l Loss) String() string {
	if l.First == l.Last {
		return fmt.Sprintf("%s pid %d: datagram #%d lost", l.Proc, l.Pid, l.First)
	}
	return fmt.Sprintf("%s pid %d: datagrams #%d..#%d lost (%d)", l.Proc, l.Pid, l.First, l.Last, l.Count())
}

// LostIn returns the sequence gaps in events taken in arrival order (a
// Trace's Events or a trace.jsonl read back with ReadJSONL).
//
// Each process numbers its datagrams from 1 and, on a unixgram socket, they
// arrive in that order, so for each (proc, pid) a number above the next
// expected one means the ones between were lost. A number at or below the
// last one seen is a new incarnation under a reused pid (a restart inside a
// pid namespace), which numbers from 1 again. Events without a number (seq 0,
// an older emitter) are not judged. Limit: datagrams lost after a process's
// last received one (it died, or the run ended) leave no gap here; TailLost
// finds them for a process that wrote its trace end.
func LostIn(events []failpoint.Event) []Loss {
	type key struct {
		proc string
		pid  int
	}
	type seen struct {
		seq  uint64
		tsNs int64
	}
	last := map[key]seen{}
	var out []Loss
	for i := range events {
		e := &events[i]
		if e.Seq == 0 {
			continue
		}
		k := key{e.Proc, e.Pid}
		prev := last[k]
		if e.Seq <= prev.seq {
			prev = seen{} // new incarnation
		}
		if e.Seq > prev.seq+1 {
			out = append(out, Loss{Proc: e.Proc, Pid: e.Pid, First: prev.seq + 1, Last: e.Seq - 1, AfterNs: prev.tsNs, BeforeNs: e.TsNs})
		}
		last[k] = seen{e.Seq, e.TsNs}
	}
	return out
}

// LostBetween is LostIn cut to the runs that may have been sent within
// [fromNs, toNs]: what a judgement over that window cannot do without.
func LostBetween(events []failpoint.Event, fromNs, toNs int64) []Loss {
	var out []Loss
	for _, l := range LostIn(events) {
		if l.In(fromNs, toNs) {
			out = append(out, l)
		}
	}
	return out
}

// TailLost returns, for each trace end (a process that exited cleanly and
// said how many datagrams it sent), the datagrams after the last one of that
// stream in events (arrival order): the tail loss no gap shows. The stream
// of an end is its (proc, pid) from its first stamp on, up to a new
// incarnation (a number at or below the last).
func TailLost(events []failpoint.Event, ends []failpoint.TraceEnd) []Loss {
	var out []Loss
	for _, end := range ends {
		if end.LastSeq == 0 {
			continue
		}
		var got uint64
		var lastNs int64
		for i := range events {
			e := &events[i]
			if e.Proc != end.Proc || e.Pid != end.Pid || e.Seq == 0 || e.TsNs < end.FirstTsNs {
				continue
			}
			if e.Seq <= got {
				break // a later incarnation under the same pid
			}
			got, lastNs = e.Seq, e.TsNs
		}
		if got < end.LastSeq {
			out = append(out, Loss{Proc: end.Proc, Pid: end.Pid, First: got + 1, Last: end.LastSeq, AfterNs: lastNs})
		}
	}
	return out
}

// Lost returns the datagrams sent to this trace and never read, per
// (proc, pid), in the order the gaps showed (see LostIn for what is and is
// not detected). A run whose checks read the trace should treat a non-empty
// result as missing evidence, not as "that phase did not happen".
func (t *Trace) Lost() []Loss { return LostIn(t.Events()) }
