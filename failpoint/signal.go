package failpoint

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SignalPoint is the datagram a `signal(SIG,DELAY)` action sends right before
// it signals its own process: ts_ns is when it fired; attrs name the point
// that armed it ("point"), that hit's datagram ("hit_seq", 0 when it had no
// trace), DELAY ("delay_ns"), how late it fired after hit + DELAY ("late_ns")
// and the signal ("signal", e.g. "KILL"). Attrs hold small numbers only: JSON
// numbers pass through float64. It is protocol, not a phase: it is not in the
// Catalogue and is never a LastPhase.
const SignalPoint = "failpoint.signal"

// MaxSignalDelay bounds DELAY in signal(SIG,DELAY), as offsets are bounded.
const MaxSignalDelay = 24 * time.Hour

// signalNames are the signals signal(SIG,DELAY) accepts: the faults the
// injector delivers plus the usual crash signals.
var signalNames = map[string]syscall.Signal{
	"KILL": syscall.SIGKILL, "STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT, "TERM": syscall.SIGTERM,
	"INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "ABRT": syscall.SIGABRT, "HUP": syscall.SIGHUP,
	"SEGV": syscall.SIGSEGV, "BUS": syscall.SIGBUS, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
}

// SignalName is the name signal(SIG,DELAY) uses for sig ("KILL"), or "" when
// it is not one it accepts.
func SignalName(sig syscall.Signal) string {
	for n, s := range signalNames {
		if s == sig {
			return n
		}
	}
	return ""
}

// parseSignalArg parses "SIG,DELAY": SIG a name with or without "SIG"
// ("KILL", "SIGKILL"); DELAY a Go duration ("59ms", "2950us") or a bare
// number of milliseconds, 0..24h.
func parseSignalArg(arg string) (syscall.Signal, time.Duration, error) {
	name, d, ok := strings.Cut(arg, ",")
	if !ok {
		return 0, 0, errors.New("want signal(SIG,DELAY)")
	}
	sig, ok := signalNames[strings.TrimPrefix(strings.TrimSpace(name), "SIG")]
	if !ok {
		return 0, 0, fmt.Errorf("unknown signal %q", name)
	}
	d = strings.TrimSpace(d)
	var delay time.Duration
	if n, err := strconv.ParseUint(d, 10, 32); err == nil {
		delay = time.Duration(n) * time.Millisecond
	} else if delay, err = time.ParseDuration(d); err != nil {
		return 0, 0, fmt.Errorf("delay %q: want a duration or a number of ms", d)
	}
	if delay < 0 || delay > MaxSignalDelay {
		return 0, 0, fmt.Errorf("delay %s: want 0..%s", delay, MaxSignalDelay)
	}
	return sig, delay, nil
}

// spinFor is how long before its due time a signal action stops sleeping and
// polls the clock: a wake-up from clock_nanosleep can be late by tens of µs
// (more on a loaded host), a spin is not.
const spinFor = 200 * time.Microsecond

// signalAt runs on its own goroutine: it waits on this process's own clock
// until due, announces SignalPoint and signals the process. Running inside
// the victim is the point: no trace delivery and no harness wake-up lies
// between the hit and the fault.
func signalAt(st *state, point, vm, op string, sig syscall.Signal, hitSeq uint64, hitNs int64, delay time.Duration) {
	due := hitNs + int64(delay)
	// The thread is never unlocked: if its scheduling policy changed it must
	// exit with this goroutine rather than go back to the pool.
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	if os.Getenv("VMCHAOS_INJECTOR_RT") != "0" {
		// SCHED_FIFO when allowed (root): a loaded host then cannot queue
		// this thread behind normal tasks. It sleeps, spins ≤ spinFor, ends.
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: 1 /* SCHED_FIFO */, Priority: 10}
		_ = unix.SchedSetAttr(0, &attr, 0)
	}
	if wake := due - int64(spinFor); wake > Now() {
		ts := unix.NsecToTimespec(wake)
		for {
			err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
	}
	for Now() < due {
	}
	fired := Now()
	if st.trace != nil {
		st.send(&Event{TsNs: fired, Pid: st.pid, Proc: st.proc, Point: SignalPoint, VM: vm, Op: op,
			Attrs: map[string]any{"point": point, "hit_seq": hitSeq, "delay_ns": int64(delay), "late_ns": fired - due, "signal": SignalName(sig)}})
	}
	_ = syscall.Kill(os.Getpid(), sig)
}
