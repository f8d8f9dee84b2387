package runner

import (
	"context"
	"runtime"
	"syscall"
	"testing"
	"time"
)

func TestParseLoad(t *testing.T) {
	if n, err := ParseLoad(""); n != 0 || err != nil {
		t.Errorf(`ParseLoad("") = %d, %v`, n, err)
	}
	if n, err := ParseLoad("cpu=1"); n != 1 || err != nil {
		t.Errorf(`ParseLoad("cpu=1") = %d, %v`, n, err)
	}
	for _, bad := range []string{"cpu=0", "cpu=-1", "cpu=x", "mem=1", "cpu", "cpu=100000"} {
		if _, err := ParseLoad(bad); err == nil {
			t.Errorf("ParseLoad(%q) accepted", bad)
		}
	}
}

func TestLoadBurnsCPUAndStopsWithItsThreads(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	before := runtime.NumGoroutine()
	l := StartLoad(context.Background(), 1)
	if runtime.GOMAXPROCS(0) != prev+1 {
		t.Errorf("GOMAXPROCS %d while loading, want %d", runtime.GOMAXPROCS(0), prev+1)
	}
	ru0 := cpuTime(t)
	time.Sleep(300 * time.Millisecond)
	ru1 := cpuTime(t)
	if spins := l.Stop(); spins == 0 {
		t.Error("the hog completed no spin round")
	}
	// the process burned CPU while the test only slept
	if used := ru1 - ru0; used < int64(50*time.Millisecond) {
		t.Errorf("process CPU time grew by %v over 300ms of load, want most of it", time.Duration(used))
	}
	if runtime.GOMAXPROCS(0) != prev {
		t.Errorf("GOMAXPROCS %d after Stop, want %d", runtime.GOMAXPROCS(0), prev)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Stop, %d before", n, before)
	}
	if l.Stop() != 0 {
		t.Error("a second Stop reported spins")
	}
}

// cpuTime is this process's user + system CPU time in ns.
func cpuTime(t *testing.T) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
