package injector

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ReapOrphans makes this process a child subreaper and has the one reaper
// of the builtin supervisor (reaperT) also collect the zombie children whose
// task name is one of names: the VMMs a manager's verb launched and left to
// this process when it died. A manager judges liveness with kill(pid, 0),
// which is true for a zombie, so an unreaped VMM would never look dead to it
// (docs/architecture.md §14). The harness never starts a process of those
// names itself, so no os/exec caller waits for one. release ends the
// registration; the reaper stops once nothing is registered.
func ReapOrphans(names ...string) (release func(), err error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("reap orphans: PR_SET_CHILD_SUBREAPER: %w", err)
	}
	comms := make([]string, 0, len(names))
	for _, n := range names {
		comms = append(comms, commOf(n))
	}
	reaper.mu.Lock()
	if reaper.comms == nil {
		reaper.comms = map[string]int{}
	}
	if reaper.ours == nil {
		reaper.ours, reaper.foreign = map[Proc]bool{}, map[Proc]bool{}
	}
	for _, c := range comms {
		reaper.comms[c]++
	}
	reaper.startLocked()
	reaper.mu.Unlock()
	return func() {
		reaper.sweep() // the last zombies, before the names stop counting
		reaper.mu.Lock()
		defer reaper.mu.Unlock()
		for _, c := range comms {
			if reaper.comms[c]--; reaper.comms[c] <= 0 {
				delete(reaper.comms, c)
			}
		}
	}, nil
}

// commOf is the kernel's 15-byte task name of a binary.
func commOf(name string) string {
	name = filepath.Base(name)
	if len(name) > 15 {
		return name[:15]
	}
	return name
}

// orphanComm: the child's task name was registered by ReapOrphans. Called
// with r.mu held, for a zombie child.
func (r *reaperT) orphanComm(pid int) bool {
	if len(r.comms) == 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return err == nil && r.comms[strings.TrimSpace(string(b))] > 0
}
