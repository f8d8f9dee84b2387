package failpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/internal/rt"
)

// SignalPoint is the datagram a `signal(SIG,DELAY)` action sends right before
// it signals its own process: ts_ns is when it fired; attrs name the point
// that armed it ("point"), that hit's datagram ("hit_seq", 0 when it had no
// trace), DELAY ("delay_ns"), how late it fired after hit + DELAY ("late_ns")
// and the signal ("signal", e.g. "KILL"). A DELAY > 0 adds "spin_ns": how
// long before its due time the timer thread began to spin (about 1 ms; less,
// or below 0, when the kernel woke it late), so a late fire tells a late
// wake-up from a spin held up. "backup": 1 when the backup thread fired it
// (see backupLag): the timer thread had not by due + backupLag. Attrs hold
// small numbers only: JSON numbers pass through float64. It is protocol, not
// a phase: it is not in the Catalogue and is never a LastPhase.
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

// parseSignalArg parses "SIG,DELAY[,once=TOKEN]": SIG a name with or
// without "SIG" ("KILL", "SIGKILL"); DELAY a Go duration ("59ms", "2950us")
// or a bare number of milliseconds, 0..24h; TOKEN see OnceClaimFile.
func parseSignalArg(arg string) (syscall.Signal, time.Duration, string, error) {
	name, d, ok := strings.Cut(arg, ",")
	if !ok {
		return 0, 0, "", errors.New("want signal(SIG,DELAY)")
	}
	sig, ok := signalNames[strings.TrimPrefix(strings.TrimSpace(name), "SIG")]
	if !ok {
		return 0, 0, "", fmt.Errorf("unknown signal %q", name)
	}
	d, once, hasOnce := strings.Cut(d, ",")
	if hasOnce {
		k, tok, _ := strings.Cut(strings.TrimSpace(once), "=")
		if k != "once" || !validToken(tok) {
			return 0, 0, "", fmt.Errorf("%q: want once=TOKEN (1-64 of A-Za-z0-9_-)", once)
		}
		once = tok
	}
	d = strings.TrimSpace(d)
	var delay time.Duration
	if n, err := strconv.ParseUint(d, 10, 32); err == nil {
		delay = time.Duration(n) * time.Millisecond
	} else if delay, err = time.ParseDuration(d); err != nil {
		return 0, 0, "", fmt.Errorf("delay %q: want a duration or a number of ms", d)
	}
	if delay < 0 || delay > MaxSignalDelay {
		return 0, 0, "", fmt.Errorf("delay %s: want 0..%s", delay, MaxSignalDelay)
	}
	return sig, delay, once, nil
}

// validToken: a once= token is a file name part, so no separators or dots.
func validToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// OnceClaimFile is the file in the control dir whose exclusive creation
// claims a `signal(SIG,DELAY,once=TOKEN)` action. Every process started with
// the action arms it at its first hit (a restarted victim gets the same
// environment), so the token makes it one-shot across processes: only the
// process that creates the file fires, any later one goes on unharmed. The
// file holds the claimant's pid.
func OnceClaimFile(ctlDir, token string) string {
	return filepath.Join(ctlDir, "once-"+token+".claimed")
}

// claimOnce creates OnceClaimFile with O_EXCL; false when another process
// (or an earlier incarnation of this one) claimed it, or it cannot be
// written (no fault is better than a fault nobody can account for).
func claimOnce(ctlDir, token string) bool {
	f, err := os.OpenFile(OnceClaimFile(ctlDir, token), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return false
	}
	_, _ = fmt.Fprintf(f, "%d\n", os.Getpid())
	_ = f.Close()
	return true
}

// spinFor is how long before its due time a signal action stops sleeping and
// polls the clock. A sleeping thread leaves its vCPU halted, and a VM's
// halted vCPU is woken late now and then (0.3-2.8 ms in 1 of 1,000 wake-ups
// on the project's VM, with the host's steal time at 0.2 %); a spin is not.
// 1 ms of spin took the in-victim bench's idle p99.9 from 2.0 to 0.34 ms;
// 2 ms did no better and, SCHED_FIFO, held the other victims up.
const spinFor = 1 * time.Millisecond

// backupLag is how long after its due time a signal the timer thread has
// not fired is fired by the backup thread. Each vCPU of a VM loses its CPU to
// the host now and then: a thread spinning on one stood still for 0.2-4 ms
// 30-50 times in 20 s on the project's idle 2-core VM, and those stalls never
// overlapped between the two vCPUs. A second thread, woken on the other
// vCPU, fires a signal the spinning one cannot.
const backupLag = 150 * time.Microsecond

// signalBackup: configurations start the backup thread (with more than one
// CPU). Only BenchmarkSignalTimer turns it off, for its A/B.
var signalBackup = true

// testHookTimerDue, when set (tests only), runs in the timer thread at a
// signal's due time, before it claims it: a test holds the thread there as
// the host would.
var testHookTimerDue atomic.Pointer[func(*pendingSignal)]

// testHookFire, when set (tests only), runs on the firing thread right
// before the kill.
var testHookFire atomic.Pointer[func()]

// pendingSignal is one armed signal(SIG,DELAY).
type pendingSignal struct {
	point, vm, op string
	once          string // the once= token ("" without)
	sig           syscall.Signal
	hitSeq        uint64
	hitNs, due    int64
	delay         time.Duration
	claimed       atomic.Bool // set by the thread that fires it
}

// sigTimer holds the threads that fire the signal actions of one
// configuration: the timer thread, which sleeps until spinFor before due and
// spins, and (with more than one CPU) a backup thread that sleeps until
// backupLag after due. Whichever claims a signal first fires it. They are
// started with the configuration, not at the hit: a goroutine started at the
// hit waits for the Go scheduler (milliseconds on a loaded host) before it
// even sleeps. Each sleeps in ppoll on its own eventfd, so a hit wakes it
// straight from the kernel.
type sigTimer struct {
	efds    []int // one per thread
	mu      sync.Mutex
	pending []*pendingSignal // sorted by due; a claimed one is removed by its claimant
	stopped bool
}

func startSigTimer(st *state) (*sigTimer, error) {
	t := &sigTimer{}
	threads := 1
	if runtime.NumCPU() > 1 && signalBackup {
		threads = 2
	}
	for range threads {
		efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			for _, fd := range t.efds {
				unix.Close(fd)
			}
			return nil, fmt.Errorf("failpoint: signal timer: %w", err)
		}
		t.efds = append(t.efds, efd)
	}
	var cpus []int // nil: not pinned
	if signalPin && threads > 1 {
		cpus = allowedCPUs()
	}
	go t.run(st, 0, 0, spinFor, cpus)
	if len(t.efds) > 1 {
		go t.run(st, 1, backupLag, 0, cpus)
	}
	return t, nil
}

// signalPin: the two threads are pinned to two different CPUs. A sleeping
// thread's timer fires on the CPU it went to sleep on; unpinned, both
// threads could sleep on the same vCPU and be woken late together. Only
// BenchmarkSignalTimer turns it off, for its A/B.
var signalPin = true

// allowedCPUs lists the CPUs this process may run on.
func allowedCPUs() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// pinThread pins thread i to cpus[(pid+i) mod len]: the timer thread and
// the backup on different CPUs, and the victims' timer threads spread over
// the CPUs by pid.
func pinThread(cpus []int, i int) {
	if len(cpus) < 2 {
		return
	}
	var set unix.CPUSet
	set.Set(cpus[(os.Getpid()+i)%len(cpus)])
	_ = unix.SchedSetaffinity(0, &set)
}

// arm queues p and wakes the threads.
func (t *sigTimer) arm(p *pendingSignal) {
	t.mu.Lock()
	i := len(t.pending)
	for i > 0 && t.pending[i-1].due > p.due {
		i--
	}
	t.pending = slices.Insert(t.pending, i, p)
	t.wakeLocked()
	t.mu.Unlock()
}

// wakeLocked writes to each thread's eventfd still open; call with mu held.
// A thread closes its own on its way out, also under mu, so a late Hit of a
// replaced configuration never writes to a number the process has reused.
func (t *sigTimer) wakeLocked() {
	one := [8]byte{1}
	for _, fd := range t.efds {
		if fd >= 0 {
			_, _ = unix.Write(fd, one[:])
		}
	}
}

// closeEventfd closes thread i's eventfd.
func (t *sigTimer) closeEventfd(i int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	_ = unix.Close(t.efds[i])
	t.efds[i] = -1
}

// stop ends the threads (a new configuration replaced this one); signals
// still pending are dropped with them.
func (t *sigTimer) stop() {
	t.mu.Lock()
	t.stopped = true
	t.wakeLocked()
	t.mu.Unlock()
}

// next is the earliest signal no thread has claimed yet (nil: none), or
// stopped once the configuration was replaced.
func (t *sigTimer) next() (p *pendingSignal, stopped bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return nil, true
	}
	for _, p := range t.pending {
		if !p.claimed.Load() {
			return p, false
		}
	}
	return nil, false
}

func (t *sigTimer) remove(p *pendingSignal) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := slices.Index(t.pending, p); i >= 0 {
		t.pending = slices.Delete(t.pending, i, i+1)
	}
}

// run is thread i: it fires each signal lag after its due time, sleeping
// until spin before that and spinning the rest.
func (t *sigTimer) run(st *state, i int, lag, spin time.Duration, cpus []int) {
	// Never unlocked: if its scheduling policy changed the thread must exit
	// with this goroutine rather than go back to the pool.
	runtime.LockOSThread()
	pinThread(cpus, i)
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	// SCHED_FIFO when allowed (root): a loaded host then cannot queue this
	// thread behind normal tasks. It sleeps, spins ≤ spinFor.
	_ = rt.FIFO()
	t.mu.Lock()
	efd := t.efds[i]
	t.mu.Unlock()
	defer t.closeEventfd(i)
	fds := []unix.PollFd{{Fd: int32(efd), Events: unix.POLLIN}}
	for {
		p, stopped := t.next()
		if stopped {
			return
		}
		var tsp *unix.Timespec
		if p != nil {
			at := p.due + int64(lag)
			now := Now()
			wait := at - int64(spin) - now
			if wait <= 0 {
				spinFrom := int64(0)
				if spin > 0 {
					spinFrom = now
				}
				for Now() < at {
				}
				if hook := testHookTimerDue.Load(); lag == 0 && hook != nil {
					(*hook)(p)
				}
				// the other thread may have fired it meanwhile
				if p.claimed.CompareAndSwap(false, true) {
					fire(st, p, spinFrom, lag > 0)
					t.remove(p) // not reached after a fatal signal
				}
				continue
			}
			ts := unix.NsecToTimespec(wait)
			tsp = &ts
		}
		fds[0].Revents = 0
		if _, err := unix.Ppoll(fds, tsp, nil); err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		if fds[0].Revents != 0 {
			var b [8]byte
			_, _ = unix.Read(efd, b[:])
		}
	}
}

// fire announces SignalPoint and signals this process. Running inside the
// victim is the point: no trace delivery and no harness wake-up lies between
// the hit and the fault. spinFrom: when the timer thread began to spin (0:
// it did not); backup: the backup thread fired it.
func fire(st *state, p *pendingSignal, spinFrom int64, backup bool) {
	fired := Now()
	if st.trace != nil {
		attrs := map[string]any{"point": p.point, "hit_seq": p.hitSeq, "delay_ns": int64(p.delay), "late_ns": fired - p.due, "signal": SignalName(p.sig)}
		if p.once != "" {
			attrs["once"] = p.once
		}
		if spinFrom != 0 {
			attrs["spin_ns"] = p.due - spinFrom
		}
		if backup {
			attrs["backup"] = 1
		}
		st.send(&Event{TsNs: fired, Pid: st.pid, Proc: st.proc, Point: SignalPoint, VM: p.vm, Op: p.op, Attrs: attrs})
	}
	if hook := testHookFire.Load(); hook != nil {
		(*hook)()
	}
	_ = syscall.Kill(os.Getpid(), p.sig)
}

// urgent makes the calling thread SCHED_FIFO until the returned func runs.
// A DELAY 0 signal fires from the hitting thread, and a CFS thread can be
// preempted for milliseconds in the few µs between its stamp and its kill:
// in the in-victim bench every such fire over 0.5 ms late had spent that
// long in the guest's run queue. The thread dies with the signal as a rule;
// the func puts it back when it does not. With VMCHAOS_INJECTOR_RT=0, or
// without the privilege, it does nothing.
func urgent() (restore func()) {
	runtime.LockOSThread()
	old, err := unix.SchedGetAttr(0, 0)
	if err == nil {
		err = rt.FIFO()
	}
	if err != nil {
		runtime.UnlockOSThread()
		return func() {}
	}
	return func() {
		_ = unix.SchedSetAttr(0, old, 0)
		runtime.UnlockOSThread()
	}
}

// signalAction runs after the hit's datagram left: DELAY 0 fires here and
// now (as `kill` would). A later one was armed on the configuration's timer
// thread at the stamp (hit), and never comes here.
func signalAction(st *state, p *pendingSignal) {
	p.due = p.hitNs + int64(p.delay)
	fire(st, p, 0, false)
}
