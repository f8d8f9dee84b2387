package suite

import (
	"context"
	"sync"
)

// Slot is what the scheduler knows about one case once it ran: its class
// and the most cases of the run in flight at once while it ran (itself
// included; 1 for an alone case, and for every case of a --parallel 1 run).
type Slot struct {
	Class       Class
	Concurrency int
	Ran         bool
}

// Schedule runs case i (0 <= i < len(classes)) by calling run(ctx, i) on
// its own goroutine: shared cases up to n at a time, each alone case with
// nothing else of the run in flight. The alone cases run first, one after
// the other in catalogue order, then the shared ones n at a time in
// catalogue order: one drain for the whole run instead of one per alone
// case scattered through the catalogue (a drain waits for the slowest
// shared case in flight). A cancelled ctx starts no further case; cases in
// flight finish. It returns when every started case has returned.
func Schedule(ctx context.Context, classes []Class, n int, run func(ctx context.Context, i int)) []Slot {
	n = max(n, 1)
	tr := &tracker{slots: make([]Slot, len(classes)), running: map[int]bool{}}
	for i, c := range classes {
		tr.slots[i].Class = c
	}
	for i, c := range classes {
		if c != Shared && ctx.Err() == nil {
			// nothing else is in flight: the previous alone case returned
			// and no shared case has started yet
			tr.do(ctx, i, run)
		}
	}
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i, c := range classes {
		if c != Shared {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			tr.do(ctx, i, run)
		}()
	}
	wg.Wait()
	return tr.slots
}

// tracker measures each case's concurrency: the largest number of cases
// in flight at any moment between its start and its end.
type tracker struct {
	mu      sync.Mutex
	slots   []Slot
	running map[int]bool
}

func (t *tracker) do(ctx context.Context, i int, run func(context.Context, int)) {
	t.mu.Lock()
	t.running[i] = true
	for j := range t.running {
		t.slots[j].Concurrency = max(t.slots[j].Concurrency, len(t.running))
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
