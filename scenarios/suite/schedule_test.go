package suite

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/scenarios/runner"
)

// overlapRecorder is a fake case runner: it records, for every case, the
// cases in flight at any moment while it ran.
type overlapRecorder struct {
	mu       sync.Mutex
	running  map[int]bool
	overlaps map[int]map[int]bool
	peak     int
	// pair is closed once two shared cases were in flight at once; a
	// shared case waits for it (or the safety timeout) so that a scheduler
	// that does run shared cases together is seen doing it
	pair     chan struct{}
	pairOnce sync.Once
	waitPair bool // more than one worker: shared cases wait for a pair
	classes  []Class
	ran      []int
	// timed: the alone cases inside their timed part (between the
	// gate's Enter and Leave); timedOverlaps[i]: every case in flight at
	// any moment of alone case i's timed part; entered: the alone cases
	// that got the gate
	timed         map[int]bool
	timedOverlaps map[int]map[int]bool
	entered       map[int]bool
	// repeat: how many timed parts an alone case runs (a --repeat run
	// enters the gate once per repetition); 0 means 1
	repeat int
}

func newOverlapRecorder(classes []Class, workers int) *overlapRecorder {
	return &overlapRecorder{running: map[int]bool{}, overlaps: map[int]map[int]bool{}, pair: make(chan struct{}),
		classes: classes, waitPair: workers > 1, timed: map[int]bool{}, timedOverlaps: map[int]map[int]bool{},
		entered: map[int]bool{}}
}

// busy gives any case a broken scheduler started beside this one the
// chance to be in flight while this part still runs.
func busy() {
	for k := 0; k < 50; k++ {
		runtime.Gosched()
	}
	time.Sleep(time.Millisecond)
}

func (o *overlapRecorder) run(ctx context.Context, i int) {
	o.mu.Lock()
	o.overlaps[i] = map[int]bool{}
	shared := 0
	for j := range o.running {
		o.overlaps[i][j], o.overlaps[j][i] = true, true
	}
	o.running[i] = true
	o.ran = append(o.ran, i)
	for j := range o.timed {
		o.timedOverlaps[j][i] = true
	}
	for j := range o.running {
		if o.classes[j] == Shared {
			shared++
		}
	}
	o.peak = max(o.peak, len(o.running))
	if shared >= 2 {
		o.pairOnce.Do(func() { close(o.pair) })
	}
	o.mu.Unlock()
	if o.classes[i] == Shared && o.waitPair {
		select {
		case <-o.pair:
		case <-time.After(10 * time.Second): // safety net: the assertions say what went wrong
		case <-ctx.Done():
		}
	}
	busy()
	if g := runner.ClockGateOf(ctx); g != nil {
		// an alone case as the runner runs it: its stack start before the
		// timed part, its convergence and teardown after it
		for range max(o.repeat, 1) {
			o.timedPart(ctx, i, g)
			busy()
		}
	}
	o.mu.Lock()
	delete(o.running, i)
	o.mu.Unlock()
}

func (o *overlapRecorder) timedPart(ctx context.Context, i int, g runner.ClockGate) {
	if g.Enter(ctx) != nil {
		return
	}
	o.mu.Lock()
	o.entered[i] = true
	if o.timedOverlaps[i] == nil {
		o.timedOverlaps[i] = map[int]bool{}
	}
	for j := range o.running {
		if j != i {
			o.timedOverlaps[i][j] = true
		}
	}
	o.timed[i] = true
	o.mu.Unlock()
	busy()
	o.mu.Lock()
	delete(o.timed, i)
	o.mu.Unlock()
	g.Leave()
}

// mixed interleaves alone cases with shared ones, as the catalogue does.
func mixed() []Class {
	var cs []Class
	for i := 0; i < 24; i++ {
		if i%4 == 1 {
			cs = append(cs, Alone)
		} else {
			cs = append(cs, Shared)
		}
	}
	return cs
}

// TestScheduleAloneTimedPartsNeverOverlapAndSharedOnesDo from the N auto
// picks on an idle 2-CPU host (3) to the cap; from 3 on, two shared places
// stay beside the alone lane, which the recorder's pairing needs.
func TestScheduleAloneTimedPartsNeverOverlapAndSharedOnesDo(t *testing.T) {
	for n := 3; n <= MaxAuto; n++ {
		t.Run(fmt.Sprintf("parallel-%d", n), func(t *testing.T) { checkTimedPartsAlone(t, n) })
	}
}

func checkTimedPartsAlone(t *testing.T, n int) {
	classes := mixed()
	rec := newOverlapRecorder(classes, n)
	slots := Schedule(context.Background(), classes, n, rec.run)
	if len(rec.ran) != len(classes) {
		t.Fatalf("%d case(s) ran, want %d", len(rec.ran), len(classes))
	}
	sharedOverlap, aloneBeside := false, false
	for i, c := range classes {
		if !slots[i].Ran || slots[i].Class != c {
			t.Errorf("case %d: slot %+v, want ran as %s", i, slots[i], c)
		}
		switch c {
		case Alone:
			if !rec.entered[i] {
				t.Errorf("alone case %d ran without the machine to itself for its timed part", i)
			}
			if len(rec.timedOverlaps[i]) > 0 {
				t.Errorf("alone case %d: cases %v in flight during its timed part", i, rec.timedOverlaps[i])
			}
			if slots[i].ClockConcurrency != 1 {
				t.Errorf("alone case %d: concurrency in its timed part %d, want 1", i, slots[i].ClockConcurrency)
			}
			if slots[i].Clock < time.Millisecond { // busy() sleeps 1 ms inside the timed part
				t.Errorf("alone case %d: held the machine %v, want at least its timed part's 1 ms", i, slots[i].Clock)
			}
			aloneBeside = aloneBeside || len(rec.overlaps[i]) > 0
		case Shared:
			sharedOverlap = sharedOverlap || len(rec.overlaps[i]) > 0
			if len(rec.overlaps[i]) > 0 && slots[i].Concurrency < 2 {
				t.Errorf("shared case %d overlapped %v but recorded concurrency %d", i, rec.overlaps[i], slots[i].Concurrency)
			}
		}
	}
	if !sharedOverlap {
		t.Errorf("with %d workers no shared case ever ran beside another", n)
	}
	if !aloneBeside {
		t.Error("no shared case ever ran beside an alone case's untimed parts")
	}
	if rec.peak > n {
		t.Errorf("%d cases in flight at once, want at most %d", rec.peak, n)
	}
}

func TestScheduleOneWorkerRunsOneCaseAtATime(t *testing.T) {
	classes := mixed()
	rec := newOverlapRecorder(classes, 1)
	slots := Schedule(context.Background(), classes, 1, rec.run)
	if len(rec.ran) != len(classes) {
		t.Fatalf("%d case(s) ran, want %d", len(rec.ran), len(classes))
	}
	if rec.peak != 1 {
		t.Errorf("%d cases in flight at once with one worker", rec.peak)
	}
	for i, s := range slots {
		if s.Concurrency != 1 {
			t.Errorf("case %d: concurrency %d, want 1", i, s.Concurrency)
		}
	}
}

// The order within each class is the catalogue's: alone cases first, then
// shared ones started in order.
func TestScheduleRunsAloneCasesFirstInOrder(t *testing.T) {
	classes := mixed()
	rec := newOverlapRecorder(classes, 1)
	Schedule(context.Background(), classes, 1, rec.run)
	var want []int
	for _, c := range []Class{Alone, Shared} {
		for i, k := range classes {
			if k == c {
				want = append(want, i)
			}
		}
	}
	for k := range want {
		if rec.ran[k] != want[k] {
			t.Fatalf("start order %v, want %v", rec.ran, want)
		}
	}
}

func TestScheduleCancelledStartsNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	classes := mixed()
	rec := newOverlapRecorder(classes, 3)
	slots := Schedule(ctx, classes, 3, rec.run)
	if len(rec.ran) != 0 {
		t.Errorf("cancelled run started %v", rec.ran)
	}
	for i, s := range slots {
		if s.Ran {
			t.Errorf("case %d marked ran", i)
		}
	}
}

// TestScheduleLaneMovesOnOnceAnAloneCaseLeftItsTimedPart: the lane starts
// the next alone case while the previous one's recovery and teardown still
// run (issue #37: from 3 places on the lane was the critical path), and
// that rest counts as a shared case, so the next timed part waits for it.
func TestScheduleLaneMovesOnOnceAnAloneCaseLeftItsTimedPart(t *testing.T) {
	classes := []Class{Alone, Alone}
	secondStarted := make(chan struct{})
	var mu sync.Mutex
	var firstDoneBeforeSecondEntered, secondInTimed, firstRestDuringTimed bool
	firstRest := false
	slots := Schedule(context.Background(), classes, 3, func(ctx context.Context, i int) {
		g := runner.ClockGateOf(ctx)
		if i == 1 {
			close(secondStarted)
		}
		if err := g.Enter(ctx); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		secondInTimed = i == 1
		firstRestDuringTimed = firstRestDuringTimed || (i == 1 && firstRest)
		mu.Unlock()
		g.Leave()
		if i == 0 {
			mu.Lock()
			firstRest = true
			mu.Unlock()
			select { // the rest of case 0: until the lane started case 1
			case <-secondStarted:
			case <-time.After(10 * time.Second): // safety net
				mu.Lock()
				firstDoneBeforeSecondEntered = true
				mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			firstRest = false
			mu.Unlock()
		}
	})
	if firstDoneBeforeSecondEntered {
		t.Error("the lane waited for the first alone case to return before it started the second")
	}
	if !secondInTimed {
		t.Error("the second alone case never entered its timed part")
	}
	if firstRestDuringTimed {
		t.Error("the second alone case's timed part ran beside the rest of the first")
	}
	// it asked for the machine while the first one's rest still ran (at
	// least its 5 ms sleep): that drain is recorded as its wait
	if slots[1].ClockWait <= 0 || slots[1].ClockWait > 10*time.Second {
		t.Errorf("second alone case waited %v for the machine, want the first one's rest", slots[1].ClockWait)
	}
}

// TestScheduleAloneCaseEntersOncePerRepetition: with --repeat an alone
// case enters the gate once per repetition, after the lane has moved on
// to the next alone case. The scheduler must neither deadlock (the case's
// own rest counted against its next Enter: every timed case of `make
// stability` waited out its budget) nor let the next alone case hold the
// machine beside the repeating case's live stack.
// From 3 places on, as TestScheduleAloneTimedPartsNeverOverlapAndSharedOnesDo
// (the recorder's shared cases wait for a pair of them in flight).
func TestScheduleAloneCaseEntersOncePerRepetition(t *testing.T) {
	for n := 3; n <= MaxAuto; n++ {
		t.Run(fmt.Sprintf("parallel-%d", n), func(t *testing.T) {
			classes := mixed()
			o := newOverlapRecorder(classes, n)
			o.repeat = 3
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ScheduleRepeated(ctx, classes, n, o.run)
			if ctx.Err() != nil {
				t.Fatalf("the run did not finish within 20 s: an alone case waited for the machine for ever")
			}
			for i, c := range classes {
				if c != Alone {
					continue
				}
				if !o.entered[i] {
					t.Errorf("alone case %d never got the machine", i)
				}
				if len(o.timedOverlaps[i]) > 0 {
					t.Errorf("alone case %d: cases in flight during its timed parts: %v", i, o.timedOverlaps[i])
				}
			}
		})
	}
}
