package runner

import (
	"context"
	"runtime"
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
	// the hog burns CPU: spin rounds complete (however busy the machine)
	deadline := time.Now().Add(60 * time.Second)
	for l.Spins() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if spins := l.Stop(); spins == 0 {
		t.Error("the hog completed no spin round")
	}
	if runtime.GOMAXPROCS(0) != prev {
		t.Errorf("GOMAXPROCS %d after Stop, want %d", runtime.GOMAXPROCS(0), prev)
	}
	deadline = time.Now().Add(5 * time.Second)
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
