package runner

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// laps times a case's phases when VMCHAOS_LAPS names a file: one line per
// case, "id phase=ms ...", appended. It answers where a case's wall time
// goes (stack start, arm, act, inject, restore, converge, teardown) without
// a profiler; unset, it costs nothing.
type laps struct {
	t     time.Time
	parts []string
}

var lapsMu sync.Mutex

func newLaps() *laps {
	if os.Getenv("VMCHAOS_LAPS") == "" {
		return nil
	}
	return &laps{t: time.Now()}
}

// lap closes the phase that ran since the last lap.
func (l *laps) lap(name string) {
	if l == nil {
		return
	}
	now := time.Now()
	l.parts = append(l.parts, fmt.Sprintf("%s=%d", name, now.Sub(l.t).Milliseconds()))
	l.t = now
}

// flush appends the case's line to the VMCHAOS_LAPS file.
func (l *laps) flush(id string) {
	if l == nil {
		return
	}
	lapsMu.Lock()
	defer lapsMu.Unlock()
	f, err := os.OpenFile(os.Getenv("VMCHAOS_LAPS"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %s\n", id, strings.Join(l.parts, " "))
}
