package runner

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// loadSink receives the hog's arithmetic so its loop is not optimised away.
var loadSink atomic.Uint64

// maxLoad bounds a load hog: it never outlives a runaway run by more.
const maxLoad = 6 * time.Hour

// ParseLoad reads a --load spec: "" (none) or "cpu=N", N busy cores.
func ParseLoad(spec string) (int, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return 0, nil
	}
	k, v, ok := strings.Cut(spec, "=")
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if !ok || strings.TrimSpace(k) != "cpu" || err != nil || n < 1 || n > runtime.NumCPU() {
		return 0, fmt.Errorf("--load %q: want cpu=N with 1 <= N <= %d (this machine's cores)", spec, runtime.NumCPU())
	}
	return n, nil
}

// Load is a bounded CPU hog: n goroutines, each locked to its own OS thread
// and spinning, with GOMAXPROCS raised by n so the harness keeps the cores
// it had. They contend with the stack for the machine's cores the way a
// neighbour's build on a shared CI runner does. It lives in this process,
// so it cannot outlive the run (not even a SIGKILLed one); Stop ends it.
type Load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	prev   int
	spins  atomic.Uint64
}

// StartLoad starts n spinning threads until ctx ends, Stop is called, or
// maxLoad passed. n <= 0 starts nothing.
func StartLoad(ctx context.Context, n int) *Load {
	l := &Load{}
	if n <= 0 {
		return l
	}
	ctx, l.cancel = context.WithTimeout(ctx, maxLoad)
	l.prev = runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(l.prev + n)
	for i := 0; i < n; i++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var x uint64
			for {
				// check the context every few million iterations: cheap
				// enough to keep the core busy, quick to stop
				for j := 0; j < 1<<22; j++ {
					x = x*6364136223846793005 + 1442695040888963407
				}
				loadSink.Store(x) // a result the compiler cannot drop
				l.spins.Add(1)
				if ctx.Err() != nil {
					return
				}
			}
		}()
	}
	return l
}

// Stop ends the hog, waits for its threads and restores GOMAXPROCS. It
// returns how many spin rounds ran (proof the hog burned CPU).
func (l *Load) Stop() uint64 {
	if l == nil || l.cancel == nil {
		return 0
	}
	l.cancel()
	l.wg.Wait()
	runtime.GOMAXPROCS(l.prev)
	l.cancel = nil
	return l.spins.Load()
}

// Spins is how many spin rounds have run so far.
func (l *Load) Spins() uint64 { return l.spins.Load() }
