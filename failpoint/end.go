package failpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Two control files account for a process's trace stream beyond its
// datagrams (docs/architecture.md §3), both in VMCHAOS_FAILPOINT_CTL:
//
//   - trace-end.<proc>.<pid>.<first_ts_ns>.json (TraceEnd), written by Close
//     at a clean exit: how many datagrams the process sent. The harness
//     compares it with the last sequence number it read from that stream,
//     so a loss at the tail of a stream (after the last datagram that
//     arrived) is detected, which no gap can show.
//   - trace-dial-failed.<proc>.<pid>.json (DialFailure), written by
//     Configure when VMCHAOS_TRACE is set but the socket cannot be dialed:
//     the process runs on and sends nothing, so the harness must know.
//
// A process killed (SIGKILL, power cut) writes no end: its tail is not
// accounted for, as before.
const (
	TraceEndPrefix   = "trace-end."
	DialFailedPrefix = "trace-dial-failed."
)

// TraceEnd is the trace end of one process incarnation: Proc and Pid as in
// its datagrams, FirstTsNs the ts_ns of its datagram #1 (0: it sent none;
// with Pid it tells incarnations under a reused pid apart), LastSeq the
// number of its last datagram.
type TraceEnd struct {
	Proc      string `json:"proc"`
	Pid       int    `json:"pid"`
	FirstTsNs int64  `json:"first_ts_ns"`
	LastSeq   uint64 `json:"last_seq"`
}

// DialFailure is a process that could not dial the trace socket.
type DialFailure struct {
	Proc  string `json:"proc"`
	Pid   int    `json:"pid"`
	Trace string `json:"trace"`
	Error string `json:"error"`
}

func (d DialFailure) String() string {
	return fmt.Sprintf("%s pid %d could not dial the trace socket %s (%s): it sent no datagram", d.Proc, d.Pid, d.Trace, d.Error)
}

// Close ends this process's trace stream at a clean exit: no datagram
// leaves after it, and its TraceEnd is written to the control dir. Call it
// last in main (and before any os.Exit); a process that never calls it
// is one whose tail the harness cannot account for.
func Close() {
	enabled.Store(false)
	st := current.Swap(nil)
	if st == nil {
		return
	}
	defer st.close()
	if st.trace == nil || st.ctlDir == "" {
		return
	}
	sendMu.Lock()
	end := TraceEnd{Proc: st.proc, Pid: st.pid, FirstTsNs: st.firstNs, LastSeq: st.seq}
	sendMu.Unlock()
	name := fmt.Sprintf("%s%s.%d.%d.json", TraceEndPrefix, st.proc, st.pid, end.FirstTsNs)
	_ = writeCtl(st.ctlDir, name, end)
}

// reportDialFailure writes the DialFailure of st to its control dir (when
// it has one: without it the harness arms nothing here and judges nothing
// from this process's actions).
func reportDialFailure(st *state, tracePath string, err error) {
	if st.ctlDir == "" {
		return
	}
	d := DialFailure{Proc: st.proc, Pid: st.pid, Trace: tracePath, Error: err.Error()}
	_ = writeCtl(st.ctlDir, fmt.Sprintf("%s%s.%d.json", DialFailedPrefix, st.proc, st.pid), d)
}

// writeCtl writes v as JSON to dir/name through a temp file and a rename,
// so a reader never sees half of it.
func writeCtl(dir, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

// ReadTraceReports reads every TraceEnd and DialFailure in the control dir
// dir. A file it cannot read or decode is an error: the accounting it
// carries must not be skipped silently.
func ReadTraceReports(dir string) ([]TraceEnd, []DialFailure, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("trace reports: %w", err)
	}
	var ends []TraceEnd
	var fails []DialFailure
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		var dst any
		switch {
		case strings.HasPrefix(name, TraceEndPrefix):
			ends = append(ends, TraceEnd{})
			dst = &ends[len(ends)-1]
		case strings.HasPrefix(name, DialFailedPrefix):
			fails = append(fails, DialFailure{})
			dst = &fails[len(fails)-1]
		default:
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err == nil {
			err = json.Unmarshal(b, dst)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("trace report %s: %w", name, err))
		}
	}
	return ends, fails, errors.Join(errs...)
}
