// Package rt raises the timing-critical threads (the harness's trace reader,
// a victim's signal timer threads and its hitting thread) to SCHED_FIFO.
package rt

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Priority is their SCHED_FIFO priority: low among RT priorities, above
// every normal task.
const Priority = 10

// ErrOptedOut: VMCHAOS_INJECTOR_RT=0 asks for no raise.
var ErrOptedOut = errors.New("VMCHAOS_INJECTOR_RT=0: no SCHED_FIFO")

// FIFO makes the calling thread SCHED_FIFO at Priority. The caller has
// locked its goroutine to the thread. It fails without the privilege
// (root or CAP_SYS_NICE) and when VMCHAOS_INJECTOR_RT=0.
func FIFO() error {
	if os.Getenv("VMCHAOS_INJECTOR_RT") == "0" {
		return ErrOptedOut
	}
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: Priority}
	return unix.SchedSetAttr(0, &attr, 0)
}
