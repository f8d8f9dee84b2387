package suite

import (
	"context"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/scenarios/runner"
)

// Slot is what the scheduler knows about one case once it ran: its class,
// the most cases of the run in flight at once while it ran (itself
// included; 1 for every case of a --parallel 1 run), and for an alone case
// the most in flight while it held the machine for its timed part (1
// whenever it entered it: nothing beside it; 0 when it never did).
type Slot struct {
	Class            Class
	Concurrency      int
	ClockConcurrency int
	// Clock is how long it held the machine for its timed part: serial
	// time of the run, the floor no number of workers shortens.
	Clock time.Duration
	// ClockWait is how long it waited for the machine before its timed
	// part: the shared cases in flight draining (no new one starts while
	// an alone case waits, so the places they leave stay empty).
	ClockWait time.Duration
	Ran       bool
}

// Schedule runs case i (0 <= i < len(classes)) by calling run(ctx, i) on
// its own goroutine, at most n cases in flight. Shared cases start in
// catalogue order whenever a place is free (RunScheduled: in an Order). Alone cases run one after the
// other in catalogue order, on a lane of their own beside the shared
// cases (n-1 shared places while that lane runs, n after): each gets a
// runner.ClockGate in its ctx, and for the part it enters (the timed part:
// calibration, arming, act, injection) no shared case starts and the ones
// in flight have returned, so nothing else of the run runs beside it.
// Its stack start before and its recovery, convergence and teardown after
// share the machine (issue #37: the alone floor was a third of the
// scheduled wall time with every alone case holding the machine whole).
// The lane starts its next alone case as soon as the previous one left
// its timed part: that case's rest counts as a shared case in flight (the
// next timed part waits for it), never more than n in flight (from 3
// places on the lane, waiting for each case to return, was the run's
// critical path).
// With n = 1 every case runs by itself: the alone ones first, then the
// shared ones. A cancelled ctx starts no further case; cases in flight
// finish. It returns when every started case has returned.
func Schedule(ctx context.Context, classes []Class, n int, run func(ctx context.Context, i int)) []Slot {
	return schedule(ctx, classes, CatalogueOrder(classes), n, false, run)
}

// ScheduleRepeated is Schedule for a run whose cases take the machine more
// than once each (--repeat: every repetition of an alone case enters the
// gate): the lane starts its next alone case only once the previous one
// returned, so no alone case's stack is ever beside another's timed part
// (with the lane moving on at the first Leave, the next case's set-up ran
// beside the repeating case's next timed part, and that case's own rest
// counted against its next Enter: every timed case of `make stability`
// waited out its budget).
func ScheduleRepeated(ctx context.Context, classes []Class, n int, run func(ctx context.Context, i int)) []Slot {
	return schedule(ctx, classes, CatalogueOrder(classes), n, true, run)
}

// schedule is Schedule (ScheduleRepeated with repeated) starting the
// shared cases in order (Order: order.AfterLane only once the lane is
// done).
func schedule(ctx context.Context, classes []Class, order Order, n int, repeated bool, run func(ctx context.Context, i int)) []Slot {
	n = max(n, 1)
	tr := &tracker{slots: make([]Slot, len(classes)), running: map[int]bool{}, holder: -1}
	var alone []int
	for i, c := range classes {
		tr.slots[i].Class = c
		if c != Shared {
			alone = append(alone, i)
		}
	}
	order = order.or(classes)
	shared := append(append([]int(nil), order.Shared...), order.AfterLane...)
	if n == 1 {
		for _, i := range append(alone, shared...) {
			if ctx.Err() != nil {
				break
			}
			tr.do(ctx, i, run)
		}
		return tr.slots
	}
	g := newGate(n, len(alone) > 0)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer g.laneDone()
		for _, i := range alone {
			if !g.laneNext(ctx) {
				return
			}
			h := &hold{g: g, tr: tr, i: i, detached: make(chan struct{}), stay: repeated}
			done := make(chan struct{})
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer close(done)
				tr.do(runner.WithClockGate(ctx, h), i, run)
				h.returned()
			}()
			// the lane moves on once the case's timed part is over: its
			// recovery, convergence and teardown go on as a shared case
			select {
			case <-done:
			case <-h.detached:
			}
		}
	}()
	for k, i := range shared {
		if k == len(order.Shared) && !g.laneOver(ctx) {
			break
		}
		if !g.admit(ctx) {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer g.release()
			tr.do(ctx, i, run)
		}()
	}
	wg.Wait()
	return tr.slots
}

// gate admits shared cases and gives the alone lane the machine for a
// case's timed part. State changes close changed, waking every waiter.
type gate struct {
	mu      sync.Mutex
	n       int  // places in all
	lane    bool // the alone lane still runs: it takes one place
	shared  int  // shared cases in flight (and alone cases' rests)
	want    bool // an alone case waits for the machine: admit nothing
	held    bool // an alone case holds the machine
	changed chan struct{}
}

func newGate(n int, lane bool) *gate {
	return &gate{n: n, lane: lane, changed: make(chan struct{})}
}

// wait blocks until ok (called under g.mu, which it holds again on
// return); false once ctx is done, whatever ok says.
func (g *gate) wait(ctx context.Context, ok func() bool) bool {
	for ctx.Err() == nil && !ok() {
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		g.mu.Lock()
	}
	return ctx.Err() == nil
}

func (g *gate) broadcast() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// admit takes a place for a shared case; false when ctx ended first.
func (g *gate) admit(ctx context.Context) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	places := func() int {
		if g.lane {
			return g.n - 1
		}
		return g.n
	}
	if !g.wait(ctx, func() bool { return !g.want && !g.held && g.shared < places() }) {
		return false
	}
	g.shared++
	return true
}

// release gives a shared case's place back once it returned.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shared--
	g.broadcast()
}

// laneNext waits until the lane may start its next alone case without
// more than n cases in flight: the rest of the previous one, once past its
// timed part, counts among the shared cases; false once ctx is done.
func (g *gate) laneNext(ctx context.Context) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.wait(ctx, func() bool { return g.shared <= g.n-1 })
}

// laneOver waits until the lane is done (every alone case started and
// the last one past its timed part); false once ctx is done.
func (g *gate) laneOver(ctx context.Context) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.wait(ctx, func() bool { return !g.lane })
}

// laneDone: the lane started its last alone case and that case left its
// timed part or returned; its place goes to shared cases.
func (g *gate) laneDone() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lane, g.want, g.held = false, false, false
	g.broadcast()
}

// hold is one alone case's runner.ClockGate. Once it leaves the machine
// the rest of the case counts as a shared case in flight (the next timed
// part waits for it like for any other) and the lane moves on
// (detached closed); returned gives that count back. With stay (a case
// that enters once per repetition, ScheduleRepeated) it never detaches:
// the lane waits for it to return, and it is the only alone case in
// flight whenever it enters.
type hold struct {
	g        *gate
	tr       *tracker
	i        int
	detached chan struct{}
	left     bool // under g.mu: the rest counts among g.shared
	stay     bool // the lane waits for the case to return (ScheduleRepeated)
}

// Enter stops admitting shared cases, waits until the ones in flight have
// returned, and holds the machine.
func (h *hold) Enter(ctx context.Context) error {
	g := h.g
	asked := time.Now()
	g.mu.Lock()
	g.want = true
	ok := g.wait(ctx, func() bool { return g.shared == 0 })
	if ok {
		g.held = true
	} else {
		g.want = false
		g.broadcast()
	}
	g.mu.Unlock()
	h.tr.waited(h.i, time.Since(asked))
	if !ok {
		return ctx.Err()
	}
	h.tr.hold(h.i)
	return nil
}

// Leave lets shared cases start again, and the lane its next case: the
// rest of this one is a shared case from now on.
func (h *hold) Leave() {
	h.tr.hold(-1)
	g := h.g
	g.mu.Lock()
	defer g.mu.Unlock()
	g.want, g.held = false, false
	if !h.left && !h.stay { // a staying case keeps the lane's place until it returns
		h.left = true
		g.shared++
		close(h.detached)
	}
	g.broadcast()
}

// returned: the case returned; the shared place its rest took is free.
func (h *hold) returned() {
	g := h.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if h.left {
		g.shared--
		g.broadcast()
	}
}

// tracker measures each case's concurrency: the largest number of cases
// in flight at any moment between its start and its end, and for the case
// holding the machine, while it holds it.
type tracker struct {
	mu      sync.Mutex
	slots   []Slot
	running map[int]bool
	holder  int // the alone case holding the machine, -1 for none
	since   time.Time
}

func (t *tracker) do(ctx context.Context, i int, run func(context.Context, int)) {
	t.mu.Lock()
	t.running[i] = true
	for j := range t.running {
		t.slots[j].Concurrency = max(t.slots[j].Concurrency, len(t.running))
	}
	if t.holder >= 0 {
		t.slots[t.holder].ClockConcurrency = max(t.slots[t.holder].ClockConcurrency, len(t.running))
	}
	t.slots[i].Ran = true
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.running, i)
		t.mu.Unlock()
	}()
	run(ctx, i)
}

// waited adds d to how long case i waited for the machine.
func (t *tracker) waited(i int, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.slots[i].ClockWait += d
}

// hold records that case i (-1: none) holds the machine from now on.
func (t *tracker) hold(i int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holder >= 0 {
		t.slots[t.holder].Clock += time.Since(t.since)
	}
	t.holder, t.since = i, time.Now()
	if i >= 0 {
		t.slots[i].ClockConcurrency = max(t.slots[i].ClockConcurrency, len(t.running))
	}
}
