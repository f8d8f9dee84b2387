package injector

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/failpoint"
)

// Trace is the harness end of the failpoint trace protocol (ARCHITECTURE §3):
// a unixgram socket every component of the stack sends one datagram to per
// phase hit (VMCHAOS_TRACE). It keeps every event in arrival order and wakes
// waiters on the reader goroutine itself, so a trigger learns of a hit one
// datagram delivery after it happened: this is the accuracy-critical path.
type Trace struct {
	path string
	conn *net.UnixConn
	done chan struct{}

	mu      sync.Mutex
	events  []failpoint.Event
	recvNs  []int64 // CLOCK_MONOTONIC when each event was read
	waiters []*waiter
	bad     int
	lastBad string
	closed  bool
}

// Hit is one event as a waiter sees it.
type Hit struct {
	Index  int             // position in the trace
	Event  failpoint.Event // the datagram
	RecvNs int64           // CLOCK_MONOTONIC when the harness read it
}

type waiter struct {
	match func(*failpoint.Event) bool
	need  int // hits still to see
	ch    chan Hit
}

// ErrTraceClosed is returned by waits on a closed trace.
var ErrTraceClosed = errors.New("trace closed")

// ListenTrace binds a unixgram socket at path (a stale socket file there is
// replaced) and starts reading. Point the stack at it with VMCHAOS_TRACE=path;
// keep it outside /run so that a sandboxed stack sees the same file.
func ListenTrace(path string) (*Trace, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("trace listen %s: %w", path, err)
	}
	// A burst of hits must not block the stack: ask for a deep receive queue
	// (the kernel caps it at net.core.rmem_max).
	_ = conn.SetReadBuffer(8 << 20)
	// Units may run as another user.
	_ = os.Chmod(path, 0o666)
	t := &Trace{path: path, conn: conn, done: make(chan struct{})}
	go t.read()
	return t, nil
}

// Path is the socket path to put into VMCHAOS_TRACE.
func (t *Trace) Path() string { return t.path }

func (t *Trace) read() {
	defer close(t.done)
	buf := make([]byte, 1<<16)
	for {
		n, _, err := t.conn.ReadFromUnix(buf)
		if err != nil {
			t.mu.Lock()
			closed := t.closed
			t.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		now := failpoint.Now()
		ev, err := failpoint.ParseEvent(buf[:n])
		t.mu.Lock()
		if err != nil {
			t.bad++
			t.lastBad = err.Error()
			t.mu.Unlock()
			continue
		}
		idx := len(t.events)
		t.events = append(t.events, ev)
		t.recvNs = append(t.recvNs, now)
		if len(t.waiters) > 0 {
			t.offer(Hit{Index: idx, Event: ev, RecvNs: now})
		}
		t.mu.Unlock()
	}
}

// offer hands h to every waiter it completes; called with mu held.
func (t *Trace) offer(h Hit) {
	kept := t.waiters[:0]
	for _, w := range t.waiters {
		if w.match(&h.Event) {
			w.need--
			if w.need == 0 {
				w.ch <- h // buffered, exactly one send
				continue
			}
		}
		kept = append(kept, w)
	}
	for i := len(kept); i < len(t.waiters); i++ {
		t.waiters[i] = nil
	}
	t.waiters = kept
}

// Close stops reading and removes the socket file. Waiters get ErrTraceClosed.
func (t *Trace) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	for _, w := range t.waiters {
		close(w.ch)
	}
	t.waiters = nil
	t.mu.Unlock()
	err := t.conn.Close()
	<-t.done
	_ = os.Remove(t.path)
	return err
}

// Len is the number of events so far; pass it as `from` to count only later hits.
func (t *Trace) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.events)
}

// Mark is Len, named for its use: "count hits from here".
func (t *Trace) Mark() int { return t.Len() }

// Events returns a copy of every event in arrival order.
func (t *Trace) Events() []failpoint.Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]failpoint.Event(nil), t.events...)
}

// Since returns a copy of the events from index i on.
func (t *Trace) Since(i int) []failpoint.Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i < 0 {
		i = 0
	}
	if i > len(t.events) {
		return nil
	}
	return append([]failpoint.Event(nil), t.events[i:]...)
}

// Malformed returns how many datagrams failed to parse and the last error.
func (t *Trace) Malformed() (int, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bad, t.lastBad
}

// Wait returns the n-th event (n ≥ 1) at index ≥ from that satisfies match.
// Events already in the trace count, so arming after the hit is not a miss.
func (t *Trace) Wait(ctx context.Context, from, n int, match func(*failpoint.Event) bool) (Hit, error) {
	if n < 1 {
		n = 1
	}
	w := &waiter{match: match, need: n, ch: make(chan Hit, 1)}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return Hit{}, ErrTraceClosed
	}
	if from < 0 {
		from = 0
	}
	for i := from; i < len(t.events); i++ {
		if match(&t.events[i]) {
			w.need--
			if w.need == 0 {
				h := Hit{Index: i, Event: t.events[i], RecvNs: t.recvNs[i]}
				t.mu.Unlock()
				return h, nil
			}
		}
	}
	t.waiters = append(t.waiters, w)
	t.mu.Unlock()
	select {
	case h, ok := <-w.ch:
		if !ok {
			return Hit{}, ErrTraceClosed
		}
		return h, nil
	case <-ctx.Done():
		t.mu.Lock()
		for i, x := range t.waiters {
			if x == w {
				t.waiters = append(t.waiters[:i], t.waiters[i+1:]...)
				break
			}
		}
		t.mu.Unlock()
		// The hit may have raced the cancellation; it wins.
		select {
		case h, ok := <-w.ch:
			if ok {
				return h, nil
			}
		default:
		}
		return Hit{}, fmt.Errorf("trace: waiting for a hit: %w", ctx.Err())
	}
}

// PointMatch matches hits of point, and of vm when vm is not empty.
func PointMatch(point, vm string) func(*failpoint.Event) bool {
	return func(e *failpoint.Event) bool { return e.Point == point && (vm == "" || e.VM == vm) }
}

// WaitPoint waits for the n-th hit of point (of vm, if set) at index ≥ from.
func (t *Trace) WaitPoint(ctx context.Context, from int, point string, n int, vm string) (Hit, error) {
	return t.Wait(ctx, from, n, PointMatch(point, vm))
}

// LastOf returns the last event emitted by pid (as the emitter saw its pid) at
// or before tsNs.
func (t *Trace) LastOf(pid int, tsNs int64) (failpoint.Event, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var best failpoint.Event
	found := false
	for i := range t.events {
		e := &t.events[i]
		if e.Pid == pid && e.TsNs <= tsNs && (!found || e.TsNs >= best.TsNs) {
			best, found = *e, true
		}
	}
	return best, found
}

// Sorted returns the events ordered by their CLOCK_MONOTONIC timestamp
// (arrival order can differ slightly across processes).
func (t *Trace) Sorted() []failpoint.Event {
	ev := t.Events()
	sort.SliceStable(ev, func(i, j int) bool { return ev[i].TsNs < ev[j].TsNs })
	return ev
}

// WriteJSONL writes the trace, one event per line in arrival order, durably.
func (t *Trace) WriteJSONL(path string) error {
	ev := t.Events()
	var buf []byte
	for _, e := range ev {
		b, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("trace write %s: %w", path, err)
		}
		buf = append(append(buf, b...), '\n')
	}
	if err := durable.WriteFile(path, buf, 0o644); err != nil {
		return fmt.Errorf("trace write %s: %w", path, err)
	}
	return nil
}

// ReadJSONL reads a trace written by WriteJSONL.
func ReadJSONL(path string) ([]failpoint.Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace read %s: %w", path, err)
	}
	defer f.Close()
	var out []failpoint.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		e, err := failpoint.ParseEvent(sc.Bytes())
		if err != nil {
			return out, fmt.Errorf("trace read %s line %d: %w", path, len(out)+1, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}
