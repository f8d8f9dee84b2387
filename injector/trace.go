package injector

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/internal/rt"
)

// Trace is the harness end of the failpoint trace protocol (docs/architecture.md §3):
// a unixgram socket every component of the stack sends one datagram to per
// phase hit (VMCHAOS_TRACE). It keeps every event in arrival order.
//
// Accuracy: one reader goroutine, locked to its own OS thread (SCHED_FIFO
// when the host allows it), reads the socket with raw syscalls and also fires
// timed actions (the signals of `at` triggers) from the same thread, sleeping
// in ppoll until the next one is due. So a fault never waits for the Go
// scheduler or for CFS behind a loaded machine between the hit and the kill.
type Trace struct {
	path string
	fd   int // the bound unixgram socket
	wake int // eventfd: wakes the reader (new timed action, close)
	done chan struct{}

	mu      sync.Mutex
	events  evStore // what was read, in arrival order (with read times)
	waiters []*waiter
	bad     int
	lastBad string
	closed  bool
	RT      bool // the reader thread runs SCHED_FIFO

	posted []func() // to run on the reader thread

	// reader-thread only
	due    []*timed
	intern interner // strings of decoded datagrams
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
	// onHit, when set, runs on the reader thread at the completing hit and
	// returns an action to fire there at its due time (nil: nothing to fire).
	onHit func(Hit) *timed
}

// timed is an action the reader thread fires at CLOCK_MONOTONIC due.
type timed struct {
	due  int64
	fire func()
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
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("trace listen %s: %w", path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("trace listen %s: %w", path, err)
	}
	// A burst of hits must not block the stack: a deep receive queue (root
	// may exceed net.core.rmem_max).
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	// Units may run as another user.
	_ = os.Chmod(path, 0o666)
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		_ = os.Remove(path)
		return nil, fmt.Errorf("trace listen %s: eventfd: %w", path, err)
	}
	// The reader thread needs a free P each time it returns from ppoll; on a
	// 2-core host GOMAXPROCS=2 lets two descheduled normal threads hold both
	// and delay a due signal by a CFS slice. Spare Ps cost nothing idle; the
	// old value comes back when the last trace closes.
	raiseProcs()
	t := &Trace{path: path, fd: fd, wake: wake, done: make(chan struct{})}
	started := make(chan struct{})
	go t.read(started)
	<-started
	return t, nil
}

// Path is the socket path to put into VMCHAOS_TRACE.
func (t *Trace) Path() string { return t.path }

// minProcs is the GOMAXPROCS floor while a Trace is open (see ListenTrace).
const minProcs = 8

var procs struct {
	sync.Mutex
	open  int
	saved int // the value before the first open trace raised it; 0: not raised
	gc    int // GC percent before the first open trace raised it; 0: not raised
}

// quietGC is the GC percent floor while a Trace is open: every GC cycle
// stops the world twice, and on a loaded host a stop waits for every thread
// of the process to be scheduled, the reader thread included, for
// milliseconds. A higher percent makes cycles rarer; the live heap of a
// harness is small. VMCHAOS_INJECTOR_GC=0 leaves GC alone.
var quietGC = func() int {
	if os.Getenv("VMCHAOS_INJECTOR_GC") == "0" {
		return 0
	}
	return 800
}()

func raiseProcs() {
	procs.Lock()
	defer procs.Unlock()
	procs.open++
	if procs.open == 1 && runtime.GOMAXPROCS(0) < minProcs {
		procs.saved = runtime.GOMAXPROCS(minProcs)
	}
	if procs.open == 1 && quietGC > 0 {
		if old := debug.SetGCPercent(quietGC); old >= 0 && old < quietGC {
			procs.gc = old
		} else {
			debug.SetGCPercent(old) // off or already higher: keep it
		}
	}
}

// restoreProcs puts GOMAXPROCS and the GC percent back when the last trace
// closes.
func restoreProcs() {
	procs.Lock()
	defer procs.Unlock()
	procs.open--
	if procs.open == 0 && procs.saved != 0 {
		runtime.GOMAXPROCS(procs.saved)
		procs.saved = 0
	}
	if procs.open == 0 && procs.gc != 0 {
		debug.SetGCPercent(procs.gc)
		procs.gc = 0
	}
}

// boostThread makes the calling (locked) thread SCHED_FIFO (rt.FIFO), or at
// least gives it a 1ns timer slack. It reports whether RT was granted.
func boostThread() bool {
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	return rt.FIFO() == nil
}

func (t *Trace) read(started chan<- struct{}) {
	// Never unlocked: the thread's scheduling policy changed, so it exits
	// with this goroutine instead of returning to the pool.
	runtime.LockOSThread()
	boosted := boostThread()
	t.mu.Lock()
	t.RT = boosted
	t.mu.Unlock()
	close(started)
	defer close(t.done)
	buf := make([]byte, 1<<16)
	fds := []unix.PollFd{{Fd: int32(t.fd), Events: unix.POLLIN}, {Fd: int32(t.wake), Events: unix.POLLIN}}
	for {
		// Fire what is due, then sleep until the next due action or input.
		tsp := t.fireDue()
		fds[0].Revents, fds[1].Revents = 0, 0
		if err := rawPpoll(fds, tsp); err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		// A due action before the datagrams that woke us with it: reading
		// a backlog can take milliseconds.
		t.fireDue()
		if fds[1].Revents != 0 {
			var b [8]byte
			_, _ = unix.Read(t.wake, b[:])
			t.mu.Lock()
			closed, posted := t.closed, t.posted
			t.posted = nil
			t.mu.Unlock()
			if closed {
				return
			}
			for _, f := range posted {
				f()
			}
		}
		for {
			n, err := recvDatagram(t.fd, buf)
			if err != nil {
				break // EAGAIN: drained
			}
			t.ingest(buf[:n])
			if len(t.due) > 0 && t.due[0].due-int64(spinFor) <= failpoint.Now() {
				t.fireDue()
			}
		}
	}
}

// rawPoll makes the reader's ppoll a raw syscall (VMCHAOS_INJECTOR_RAWPOLL=0
// opts out): the thread keeps its P while it sleeps, so waking up is the
// kernel's business only. Through the scheduler's syscall path a sleep
// longer than 20 µs loses the P, and taking one back needs the scheduler
// lock, which on a loaded host a descheduled normal thread may hold.
var rawPoll = os.Getenv("VMCHAOS_INJECTOR_RAWPOLL") != "0"

// maxRawSleep bounds one raw ppoll: a stop-the-world normally interrupts it
// (the preemption signal makes it return EINTR), this caps the wait where
// asynchronous preemption is off.
const maxRawSleep = 5 * time.Millisecond

func rawPpoll(fds []unix.PollFd, tsp *unix.Timespec) error {
	if !rawPoll {
		_, err := unix.Ppoll(fds, tsp, nil)
		return err
	}
	ts := unix.NsecToTimespec(int64(maxRawSleep))
	if tsp != nil && tsp.Nano() < int64(maxRawSleep) {
		ts = *tsp
	}
	_, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)),
		uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// spinFor is how long before a due action the reader stops sleeping and
// polls the clock: a ppoll wake-up can be late by tens of µs, a spin is not.
// VMCHAOS_INJECTOR_SPIN=0 turns it off.
var spinFor = func() time.Duration {
	if os.Getenv("VMCHAOS_INJECTOR_SPIN") == "0" {
		return 0
	}
	return 200 * time.Microsecond
}()

// fireDue fires every action due now (spinning for one due within spinFor)
// and returns how long to sleep until the next one (nil: none pending).
func (t *Trace) fireDue() *unix.Timespec {
	for len(t.due) > 0 {
		now := failpoint.Now()
		next := t.due[0].due
		if next-int64(spinFor) > now {
			ts := unix.NsecToTimespec(next - int64(spinFor) - now)
			return &ts
		}
		for failpoint.Now() < next {
		}
		a := t.due[0]
		t.due = t.due[1:]
		a.fire()
	}
	return nil
}

// ingest records one datagram and runs the waiters it completes.
func (t *Trace) ingest(b []byte) {
	now := failpoint.Now()
	if t.intern == nil {
		t.intern = interner{}
	}
	ev, err := decodeEvent(b, t.intern)
	if err != nil {
		t.mu.Lock()
		t.bad++
		t.lastBad = err.Error()
		t.mu.Unlock()
		return
	}
	// Filled before the lock: nobody reads the slot until it is published.
	slot, recv := t.events.slot()
	*slot, *recv = ev, now
	t.mu.Lock()
	idx := t.events.n
	t.events.publish()
	var fired []*waiter
	if len(t.waiters) > 0 {
		fired = t.offer(Hit{Index: idx, Event: ev, RecvNs: now})
	}
	t.mu.Unlock()
	for _, w := range fired {
		t.schedule(w.onHit(Hit{Index: idx, Event: ev, RecvNs: now}))
	}
}

// schedule queues a timed action; reader thread only.
func (t *Trace) schedule(a *timed) {
	if a == nil {
		return
	}
	if a.due <= failpoint.Now() {
		a.fire()
		return
	}
	i := sort.Search(len(t.due), func(i int) bool { return t.due[i].due > a.due })
	t.due = append(t.due, nil)
	copy(t.due[i+1:], t.due[i:])
	t.due[i] = a
}

// offer hands h to every waiter it completes and returns those with an
// onHit callback (to be run without the lock); called with mu held.
func (t *Trace) offer(h Hit) (fired []*waiter) {
	kept := t.waiters[:0]
	for _, w := range t.waiters {
		if w.match(&h.Event) {
			w.need--
			if w.need == 0 {
				if w.onHit != nil {
					fired = append(fired, w)
				} else {
					w.ch <- h // buffered, exactly one send
				}
				continue
			}
		}
		kept = append(kept, w)
	}
	for i := len(kept); i < len(t.waiters); i++ {
		t.waiters[i] = nil
	}
	t.waiters = kept
	return fired
}

// onHitWaiter registers a waiter whose completing hit runs onHit on the reader
// thread (events already in the trace count, as for Wait). It returns a
// cancel func that removes the waiter if it has not completed.
func (t *Trace) onHitWaiter(from, n int, match func(*failpoint.Event) bool, onHit func(Hit) *timed) (cancel func(), err error) {
	w := &waiter{match: match, need: n, onHit: onHit}
	h, done, err := t.arm(from, w)
	if err != nil {
		return nil, err
	}
	if done {
		// Already happened: run it on the reader thread all the same.
		t.post(func() { t.schedule(onHit(h)) })
		return func() {}, nil
	}
	return func() { t.disarm(w) }, nil
}

// arm counts w's matches among the events already at index >= from. If they
// complete it, it returns that hit (done) and w is never registered;
// otherwise w joins the waiters the reader feeds. Wait and onHitWaiter share
// it so both see past and future hits the same way. The published events are
// counted without the lock (a long trace would hold the reader thread up);
// only those that came in meanwhile are counted under it.
func (t *Trace) arm(from int, w *waiter) (h Hit, done bool, err error) {
	if w.need < 1 {
		w.need = 1
	}
	from = max(from, 0)
	count := func(v evView, from int) bool {
		for i := from; i < v.Len(); i++ {
			if w.match(v.at(i)) {
				w.need--
				if w.need == 0 {
					h = v.hit(i)
					return true
				}
			}
		}
		return false
	}
	v := t.view()
	if count(v, from) {
		return h, true, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return Hit{}, false, ErrTraceClosed
	}
	if count(t.events.view(), max(from, v.Len())) {
		return h, true, nil
	}
	t.waiters = append(t.waiters, w)
	return Hit{}, false, nil
}

// view is the trace read so far, to scan without holding the lock.
func (t *Trace) view() evView {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.events.view()
}

// disarm removes w if it is still waiting (no-op once it completed).
func (t *Trace) disarm(w *waiter) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, x := range t.waiters {
		if x == w {
			t.waiters = append(t.waiters[:i], t.waiters[i+1:]...)
			return
		}
	}
}

// post runs f on the reader thread (as an action due now).
func (t *Trace) post(f func()) {
	t.mu.Lock()
	t.posted = append(t.posted, f)
	t.mu.Unlock()
	var one = [8]byte{1}
	_, _ = unix.Write(t.wake, one[:])
}

// Drain returns once every datagram queued on the socket when it was
// called is in the trace: a check at teardown (TailLost) must not take a
// datagram still in the socket for a lost one. It runs the read on the
// reader thread, which owns the socket.
func (t *Trace) Drain(ctx context.Context) error {
	done := make(chan struct{})
	t.post(func() {
		buf := make([]byte, 1<<16)
		for {
			n, err := recvDatagram(t.fd, buf)
			if err != nil {
				break // EAGAIN: drained
			}
			t.ingest(buf[:n])
		}
		close(done)
	})
	select {
	case <-done:
		return nil
	case <-t.done:
		return ErrTraceClosed
	case <-ctx.Done():
		return fmt.Errorf("trace drain: %w", ctx.Err())
	}
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
		if w.ch != nil {
			close(w.ch)
		}
	}
	t.waiters = nil
	t.mu.Unlock()
	var one = [8]byte{1}
	_, _ = unix.Write(t.wake, one[:])
	<-t.done
	err := unix.Close(t.fd)
	unix.Close(t.wake)
	restoreProcs()
	_ = os.Remove(t.path)
	return err
}

// Len is the number of events so far; pass it as `from` to count only later hits.
func (t *Trace) Len() int { return t.view().Len() }

// Mark is Len, named for its use: "count hits from here".
func (t *Trace) Mark() int { return t.Len() }

// Events returns a copy of every event in arrival order.
func (t *Trace) Events() []failpoint.Event { return t.view().copyFrom(0) }

// Since returns a copy of the events from index i on.
func (t *Trace) Since(i int) []failpoint.Event { return t.view().copyFrom(i) }

// Malformed returns how many datagrams failed to parse and the last error.
func (t *Trace) Malformed() (int, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bad, t.lastBad
}

// Wait returns the n-th event (n ≥ 1) at index ≥ from that satisfies match.
// Events already in the trace count, so arming after the hit is not a miss.
func (t *Trace) Wait(ctx context.Context, from, n int, match func(*failpoint.Event) bool) (Hit, error) {
	w := &waiter{match: match, need: n, ch: make(chan Hit, 1)}
	if h, done, err := t.arm(from, w); err != nil || done {
		return h, err
	}
	select {
	case h, ok := <-w.ch:
		if !ok {
			return Hit{}, ErrTraceClosed
		}
		return h, nil
	case <-ctx.Done():
		t.disarm(w)
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

// LastOf returns the last phase event emitted by pid (as the emitter saw its
// pid) at or before tsNs; a failpoint.signal datagram is not a phase.
func (t *Trace) LastOf(pid int, tsNs int64) (failpoint.Event, bool) {
	v := t.view()
	return lastOf(v.Len(), v.at, pid, tsNs)
}

// arrivalSlack bounds how much earlier than an event already in the trace a
// later-arriving one can be stamped (a datagram's delivery; ms in practice).
const arrivalSlack = int64(10 * time.Second)

// lastOf scans events 0..n-1 from the newest back and stops once they are
// more than arrivalSlack older than the best match: a long run's trace holds
// 100k+ events.
func lastOf(n int, at func(int) *failpoint.Event, pid int, tsNs int64) (failpoint.Event, bool) {
	var best failpoint.Event
	found := false
	for i := n - 1; i >= 0; i-- {
		e := at(i)
		if found && e.TsNs < best.TsNs-arrivalSlack {
			break
		}
		if e.Pid == pid && e.Point != failpoint.SignalPoint && e.TsNs <= tsNs && (!found || e.TsNs > best.TsNs) {
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
