package failpoint

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/internal/hoststat"
)

// BenchmarkSignalTimer: how late signal(USR1,3ms) fires in this process with
// the timer thread alone, with the backup thread unpinned, and as shipped
// (both threads pinned to different CPUs), interleaved in blocks of 10 so
// that the host's steal time falls on all three alike. Prints p50 / p99 /
// p99.9 / max of late_ns per variant and how many the backup fired.
// VMCHAOS_BENCH_SIGNALS per variant, default 2000. Run with -benchtime 1x.
func BenchmarkSignalTimer(b *testing.B) {
	n := 2000
	if v := os.Getenv("VMCHAOS_BENCH_SIGNALS"); v != "" {
		if _, err := fmt.Sscan(v, &n); err != nil || n < 10 {
			b.Fatalf("VMCHAOS_BENCH_SIGNALS=%q: want an integer ≥ 10", v)
		}
	}
	got := make(chan os.Signal, 64)
	signal.Notify(got, syscall.SIGUSR1)
	defer signal.Stop(got)
	go func() {
		for range got {
		}
	}()
	r := newReceiver(b)
	defer func() { signalBackup, signalPin = true, true }()
	host := hoststat.Now()
	late := map[string][]int64{}
	backupFired := map[string]int{}
	variants := []string{"alone", "backup", "backup-pinned"}
	next := 0
	for k := 0; k < 3*n; k++ {
		v := variants[k/10%3]
		if k%10 == 0 {
			Reset()
			signalBackup = v != "alone"
			signalPin = v == "backup-pinned"
			if err := Configure("bench", r.path, "tick=signal(USR1,3ms)", ""); err != nil {
				b.Fatal(err)
			}
		}
		_ = Hit(context.Background(), "tick", nil)
		for {
			ev := r.next(b, next)
			next++
			if ev.Point != SignalPoint {
				continue
			}
			late[v] = append(late[v], int64(ev.Attrs["late_ns"].(float64)))
			if ev.Attrs["backup"] != nil {
				backupFired[v]++
			}
			break
		}
		// de-correlate the hits from any periodic host activity
		time.Sleep(time.Duration(rand.Int64N(int64(time.Millisecond))))
	}
	Reset()
	for _, v := range variants {
		xs := late[v]
		slices.Sort(xs)
		q := func(p float64) float64 { return float64(xs[min(len(xs)-1, int(p*float64(len(xs))))]) / 1e3 }
		b.Logf("%-16s (backup fired %3d) n=%d late p50 %7.1fµs p99 %7.1fµs p99.9 %7.1fµs max %7.1fµs", v, backupFired[v], len(xs), q(0.5), q(0.99), q(0.999), float64(xs[len(xs)-1])/1e3)
	}
	if steal := host.StealSince(); steal != "" {
		b.Log(steal)
	}
}
