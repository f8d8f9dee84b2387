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
// last received one (it died, or the run ended) leave no gap and are not
// reported.
func LostIn(events []failpoint.Event) []Loss {
	type key struct {
		proc string
		pid  int
	}
	last := map[key]uint64{}
	var out []Loss
	for i := range events {
		e := &events[i]
		if e.Seq == 0 {
			continue
		}
		k := key{e.Proc, e.Pid}
		prev := last[k]
		if e.Seq <= prev {
			prev = 0 // new incarnation
		}
		if e.Seq > prev+1 {
			out = append(out, Loss{Proc: e.Proc, Pid: e.Pid, First: prev + 1, Last: e.Seq - 1})
		}
		last[k] = e.Seq
	}
	return out
}

// Lost returns the datagrams sent to this trace and never read, per
// (proc, pid), in the order the gaps showed (see LostIn for what is and is
// not detected). A run whose checks read the trace should treat a non-empty
// result as missing evidence, not as "that phase did not happen".
func (t *Trace) Lost() []Loss { return LostIn(t.Events()) }
