package injector

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/failpoint"
)

// Options configure an Injector.
type Options struct {
	CtlDir  string // VMCHAOS_FAILPOINT_CTL of the stack: needed by park triggers
	VMMName string // argv[0] basename of the VMM; default "cloud-hypervisor"
	Disk    Disk   // the registry's storage the stack can fill (registry-storage-full); nil: none
	Link    Link   // the node's path to the registry (net-partition, net-delay, net-loss); nil: none
}

// Injector ties a Supervisor and a Trace: Arm returns at once and the fault
// fires in the background when its trigger matches.
type Injector struct {
	sup Supervisor
	tr  *Trace
	opt Options
}

// New returns an injector over sup and tr.
func New(sup Supervisor, tr *Trace, opt Options) *Injector {
	if opt.VMMName == "" {
		opt.VMMName = "cloud-hypervisor"
	}
	return &Injector{sup: sup, tr: tr, opt: opt}
}

// Armed is one pending injection.
type Armed struct {
	done   chan struct{}
	cancel context.CancelFunc
	mu     sync.Mutex
	inj    Injection
}

// Wait returns the injection record once the fault fired (or the arming
// context ended: then Err says so and Landed is false).
func (a *Armed) Wait(ctx context.Context) (Injection, error) {
	select {
	case <-a.done:
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.inj, nil
	case <-ctx.Done():
		return Injection{}, fmt.Errorf("wait for injection: %w", ctx.Err())
	}
}

// Done is closed when the record is final.
func (a *Armed) Done() <-chan struct{} { return a.done }

// Cancel disarms it (a no-op after it fired).
func (a *Armed) Cancel() { a.cancel() }

type armCfg struct {
	from     int
	intend   []string
	inVictim bool                       // see InVictim
	once     string                     // see Once
	allow    func(host int) error       // see Allow
	resolve  func(pid int) (int, error) // see Resolve
	// hitterProc: which processes an in-victim sigkill-hitter may be (see HitterProc)
	hitterProc string
	// supMain: a supervisor fault's unit main process, read at Arm for the
	// record (zero when it had none)
	supMain Proc
	between func(context.Context) // see Between
}

// ArmOption tunes one Arm.
type ArmOption func(*armCfg)

// From counts trigger hits from trace index mark (default: the trace length at Arm).
func From(mark int) ArmOption { return func(c *armCfg) { c.from = mark } }

// Allow vets the host pid of a sigkill-hitter victim before it is killed
// (harness path) or once it armed itself (in the victim): an error refuses it
// and becomes the record's Err.
func Allow(f func(hostPID int) error) ArmOption { return func(c *armCfg) { c.allow = f } }

// Resolve maps a sigkill-hitter's pid as it sees itself to the host pid of
// a process the caller vouches for (an error refuses it), in place of the
// supervisor's HostPID and Allow: a caller that knows its processes finds
// them without a scan of every process (in a sandbox HostPID may have to
// scan the host, milliseconds a short-lived victim may not have).
func Resolve(f func(pid int) (hostPID int, err error)) ArmOption {
	return func(c *armCfg) { c.resolve = f }
}

// HitterProc narrows an in-victim sigkill-hitter to processes emitting as
// proc ("vmctl"): each is identified at its first datagram (while it surely
// lives), so fewer candidates keep that identification from falling behind.
func HitterProc(proc string) ArmOption { return func(c *armCfg) { c.hitterProc = proc } }

// Between makes a registry-restart at a parked phase a stop, then between,
// then a start (InjectHit only): the caller releases the parked process in
// between and waits for it to meet the stopped registry. A restart issued
// whole while the process is parked is over before it runs on, and its next
// request meets a registry that already answers again or not, as the race
// with the registry's start goes (mig-registry-restart-at-push-blobs passed
// sequentially and found no failure at 5 cases at a time).
func Between(f func(context.Context)) ArmOption { return func(c *armCfg) { c.between = f } }

// Intend names the phases the fault must land in (LastPhase ∈ phases);
// otherwise Landed is false and the case is inconclusive.
func Intend(phases ...string) ArmOption { return func(c *armCfg) { c.intend = phases } }

// Arm validates f and t and returns at once; the fault fires when t matches.
// Hits of the trigger point are counted from the moment of Arm (see From).
func (in *Injector) Arm(ctx context.Context, f Fault, t Trigger, opts ...ArmOption) (*Armed, error) {
	k, err := in.armable(f)
	if err != nil {
		return nil, err
	}
	// Read ahead before the mark, so hits during the lookups do not count
	// as already past due.
	pre, supMain := in.readAhead(ctx, k, f)
	cfg := armCfg{from: in.tr.Len(), supMain: supMain}
	for _, o := range opts {
		o(&cfg)
	}
	if pre, err = in.checkArm(k, f, t, cfg, pre); err != nil {
		pre.close()
		return nil, err
	}
	if t.N < 1 {
		t.N = 1
	}
	actx, cancel := context.WithCancel(ctx)
	a := &Armed{done: make(chan struct{}), cancel: cancel}
	a.inj = pendingRecord(f, t, cfg)
	go func() {
		defer close(a.done)
		defer cancel()
		var inj Injection
		if cfg.inVictim {
			inj = in.runInVictim(actx, k, f, t, cfg, pre)
		} else {
			inj = in.run(actx, k, f, t, cfg, pre)
		}
		a.mu.Lock()
		a.inj = inj
		a.mu.Unlock()
	}()
	return a, nil
}

// armable is f's kind when an Injector can fire it on this host.
func (in *Injector) armable(f Fault) (FaultKind, error) {
	k, err := f.kind()
	if err != nil {
		return nil, err
	}
	if k.traits().node {
		return nil, fmt.Errorf("fault %s: %w", f.Kind, ErrNodeFault)
	}
	if err := k.Available(Host{Sup: in.sup, Disk: in.opt.Disk, Link: in.opt.Link}); err != nil {
		return nil, err // names the kind
	}
	return k, nil
}

// readAhead resolves what a fault needs of its unit before the trigger: at
// offset 0 there is no time to ask the supervisor (D-Bus for a sandbox)
// after the hit. A main-process kind's victim is opened now; a supervisor
// fault's main process is read now for the record, which names it — a D-Bus
// round trip between the hit and the call (1 ms, tens of ms while the
// sandbox's systemd is busy) would be all of the fault's error.
func (in *Injector) readAhead(ctx context.Context, k FaultKind, f Fault) (pre *victim, supMain Proc) {
	tr := k.traits()
	if tr.rule == victimMain {
		if v, err := in.resolveVictim(ctx, k, f, nil, nil); err == nil {
			pre = v
		}
	}
	if tr.supervisor {
		if pid, err := in.sup.MainPID(ctx, f.Unit); err == nil && pid > 0 {
			supMain, _ = Identify(pid)
		}
	}
	return pre, supMain
}

// checkArm checks that f can be armed on t with cfg and prepares the
// trigger; it returns the victim read ahead (an in-victim VMM is opened
// here). On error the caller closes what it returns.
func (in *Injector) checkArm(k FaultKind, f Fault, t Trigger, cfg armCfg, pre *victim) (*victim, error) {
	if k.traits().rule == victimHitter && t.Kind == TriggerAfterExit {
		return pre, fmt.Errorf("arm %s: %s needs a trigger hit by its victim", t, f.Kind)
	}
	if cfg.inVictim {
		var err error
		if pre, err = in.armInVictim(k, f, t, pre); err != nil {
			return pre, err
		}
	}
	return pre, in.prepareTrigger(t)
}

// prepareTrigger checks t's kind and clears what an earlier park left.
func (in *Injector) prepareTrigger(t Trigger) error {
	switch t.Kind {
	case TriggerAt, TriggerAfterExit:
		return nil
	case TriggerPark:
	default:
		return fmt.Errorf("arm: unknown trigger kind %q", t.Kind)
	}
	if in.opt.CtlDir == "" {
		return fmt.Errorf("arm %s: park needs Options.CtlDir (the stack's %s)", t, failpoint.EnvCtl)
	}
	// Stale files of an earlier park would make this one fire at once or
	// never hold the point. The release goes first: a restarted process
	// that announces itself between the two removals must not still see
	// the old release and move on, leaving a .paused that names a process
	// no longer held (the fault then lands past the point).
	for _, suf := range []string{".release", ".paused"} {
		if err := os.Remove(filepath.Join(in.opt.CtlDir, t.Point+suf)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("arm %s: %w", t, err)
		}
	}
	return nil
}

// pendingRecord is the record of f on t before it fired.
func pendingRecord(f Fault, t Trigger, cfg armCfg) Injection {
	inj := Injection{Fault: f, Trigger: t, IntendedPhase: t.Point}
	if len(cfg.intend) > 0 {
		inj.IntendedPhase = strings.Join(cfg.intend, "|")
	}
	return inj
}

// mainWatch holds a unit's main process as last read before a trigger. A
// supervisor fault armed while its unit is down or restarting, or whose
// main another fault kills before the hit (a second fault in a recovery),
// would otherwise need a round trip after the hit: while the held main is
// not alive the watch asks for the new one every 10 ms (checking a live one
// costs a /proc read).
type mainWatch struct {
	mu   sync.Mutex
	main Proc
	done chan struct{}
}

func (in *Injector) watchMain(ctx context.Context, unit string, main Proc) *mainWatch {
	w := &mainWatch{main: main, done: make(chan struct{})}
	go func() {
		if q, ok := in.sup.(quickMainer); ok {
			q.warmMain(ctx, unit)
		}
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if m := w.get(); m.PID > 0 && m.Alive() {
				continue
			}
			if p := in.newMain(ctx, unit); p.PID > 0 {
				w.mu.Lock()
				w.main = p
				w.mu.Unlock()
			}
		}
	}()
	return w
}

// quickMainer names a unit's main process without asking its manager (see
// dbusSup.quickMainPID); warmMain learns ahead what that needs.
type quickMainer interface {
	quickMainPID(unit string) int
	warmMain(ctx context.Context, unit string)
}

// newMain is the unit's main process now: read from /proc where the
// supervisor can, else asked of it.
func (in *Injector) newMain(ctx context.Context, unit string) Proc {
	if q, ok := in.sup.(quickMainer); ok {
		if pid := q.quickMainPID(unit); pid > 0 {
			if p, err := Identify(pid); err == nil {
				return p
			}
		}
	}
	if pid, err := in.sup.MainPID(ctx, unit); err == nil && pid > 0 {
		if p, err := Identify(pid); err == nil {
			return p
		}
	}
	return Proc{}
}

// mainPID is the unit's main pid as the supervisor names it now (read
// from /proc where it can, else asked of it), 0 for none. Unlike newMain
// it does not check the process: a restart fired meanwhile may already
// have ended the main the answer names, and that main is the record's
// victim.
func (in *Injector) mainPID(ctx context.Context, unit string) int {
	if q, ok := in.sup.(quickMainer); ok {
		if pid := q.quickMainPID(unit); pid > 0 {
			return pid
		}
	}
	if pid, err := in.sup.MainPID(ctx, unit); err == nil {
		return pid
	}
	return 0
}

func (w *mainWatch) get() Proc {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.main
}

func (w *mainWatch) stop() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
}

// Inject fires f now, without a trigger.
func (in *Injector) Inject(ctx context.Context, f Fault) Injection {
	inj := Injection{Fault: f}
	k, err := in.armable(f)
	if err != nil {
		inj.Err = err.Error()
		return inj
	}
	inj.RequestedNs = failpoint.Now()
	v, err := in.resolveVictim(ctx, k, f, nil, nil)
	if err != nil {
		inj.Err = err.Error()
		return inj
	}
	defer v.close()
	in.fire(ctx, k, f, v, &inj, nil, nil)
	inj.Landed = inj.Err == ""
	return inj
}

// InjectHit fires f now at the process a trigger hit names (sigkill-hitter:
// the process that sent hit, through Resolve/Allow; other kinds as Inject,
// with hit for the victim's VM or child), e.g. a process the caller holds
// parked. The record names the hit like an armed one.
func (in *Injector) InjectHit(ctx context.Context, f Fault, hit Hit, opts ...ArmOption) Injection {
	var cfg armCfg
	for _, o := range opts {
		o(&cfg)
	}
	inj := Injection{Fault: f, IntendedPhase: hit.Event.Point, TriggerPID: hit.Event.Pid, TriggerNs: hit.Event.TsNs, HitRecvNs: hit.RecvNs}
	k, err := in.armable(f)
	if err != nil {
		inj.Err = err.Error()
		return inj
	}
	inj.RequestedNs = failpoint.Now()
	v, err := in.resolveVictim(ctx, k, f, &hit, &cfg)
	if err != nil {
		inj.Err = "victim: " + err.Error()
		return inj
	}
	defer v.close()
	in.fire(ctx, k, f, v, &inj, cfg.between, nil)
	inj.Landed = inj.Err == ""
	return inj
}

// run waits for t and fires f: a one-signal kind on the trace reader
// thread, any other (and any park trigger) from this goroutine; then it
// reads where the fault landed.
func (in *Injector) run(ctx context.Context, k FaultKind, f Fault, t Trigger, cfg armCfg, pre *victim) (inj Injection) {
	inj = pendingRecord(f, t, cfg)
	defer pre.close()
	var v *victim
	var fired bool
	if sig := k.traits().signal; sig != 0 && t.Kind != TriggerPark {
		v, fired = in.runOnReader(ctx, k, f, t, cfg, pre, sig, &inj)
	} else {
		v, fired = in.runWaiting(ctx, k, f, t, cfg, pre, &inj)
	}
	if v != nil && v != pre {
		defer v.close()
	}
	if fired {
		in.settle(ctx, k, f, t, cfg, v, &inj)
	}
	return inj
}

// runOnReader is the accuracy-critical path: the victim resolved and the
// signal sent on the trace's reader thread, no goroutine hand-off between
// hit and signal. It returns the victim and whether the fault was fired.
func (in *Injector) runOnReader(ctx context.Context, k FaultKind, f Fault, t Trigger, cfg armCfg, pre *victim, sig syscall.Signal, inj *Injection) (*victim, bool) {
	fr := in.fireOnReader(ctx, k, f, t, cfg, pre, sig)
	hit, v := fr.hit, fr.v
	inj.RequestedNs, inj.ActualNs = fr.requested, fr.actual
	inj.TriggerPID, inj.TriggerNs, inj.HitRecvNs = hit.Event.Pid, hit.Event.TsNs, hit.RecvNs
	if v != nil {
		inj.VictimPID = v.fd.PID
	}
	if t.Kind == TriggerAfterExit {
		inj.IntendedPhase = "agent.child.exit"
	}
	if fr.err != nil {
		inj.Err = fr.err.Error()
		return v, false
	}
	k.afterSignal(in, f, v.fd.Proc, inj.ActualNs)
	return v, true
}

// runWaiting waits for the trigger on this goroutine, resolves the victim
// unless the one read ahead still lives, sleeps to the offset and fires. It
// returns the victim and whether the fault was fired.
func (in *Injector) runWaiting(ctx context.Context, k FaultKind, f Fault, t Trigger, cfg armCfg, pre *victim, inj *Injection) (*victim, bool) {
	var watch *mainWatch
	if k.traits().supervisor {
		watch = in.watchMain(ctx, f.Unit, cfg.supMain)
		defer watch.stop()
	}
	hit, err := in.waitTrigger(ctx, t, cfg, inj)
	if err != nil {
		inj.Err = "trigger: " + err.Error()
		return nil, false
	}
	inj.TriggerPID, inj.TriggerNs, inj.HitRecvNs = hit.Event.Pid, hit.Event.TsNs, hit.RecvNs
	v := pre
	if v == nil || v.fd.Exited() {
		if v, err = in.resolveVictim(ctx, k, f, &hit, &cfg); err != nil {
			inj.Err = "victim: " + err.Error()
			in.release(t)
			return nil, false
		}
	}
	var asked chan int
	if watch != nil {
		// The main read before the hit while it still runs. When it
		// changed since (the unit restarted and the watch has not read
		// the new one yet), it is asked beside the wait for the offset: a
		// supervisor's round trip must not hold the fault past its offset
		// (a restart 5 ms after a point hit right after the agent's own
		// restart went out late so). The supervisor fault needs no pid;
		// the record takes the answer once the fault is in.
		if m := watch.get(); m.PID > 0 && m.Alive() {
			inj.VictimPID = m.PID
		} else {
			asked = make(chan int, 1)
			go func() { asked <- in.mainPID(ctx, f.Unit) }()
		}
	}
	if err := sleepUntil(ctx, inj.RequestedNs); err != nil {
		inj.Err = "waiting for the offset: " + err.Error()
		in.release(t)
		return v, false
	}
	in.fire(ctx, k, f, v, inj, nil, asked)
	return v, true
}

// waitTrigger waits for t's hit and sets the record's requested time (and
// intended phase for after-exit).
func (in *Injector) waitTrigger(ctx context.Context, t Trigger, cfg armCfg, inj *Injection) (hit Hit, err error) {
	switch t.Kind {
	case TriggerAt:
		hit, err = in.tr.WaitPoint(ctx, cfg.from, t.Point, t.N, t.VM)
		inj.RequestedNs = hit.Event.TsNs + int64(t.Offset)
	case TriggerAfterExit:
		hit, err = in.tr.Wait(ctx, cfg.from, t.N, childExitMatch(t.Child, t.VM))
		inj.RequestedNs = hit.Event.TsNs + int64(t.Offset)
		inj.IntendedPhase = "agent.child.exit"
	case TriggerPark:
		// The parked file first: it is what proves the process is held. Its
		// hit was sent before the file was written, so it is in the trace
		// or about to be.
		var pid int
		if pid, err = failpoint.WaitParked(ctx, in.opt.CtlDir, t.Point); err == nil {
			inj.RequestedNs = failpoint.Now()
			hit, err = in.parkedHit(ctx, t, pid)
		}
	}
	return hit, err
}

// settle reads where the fault landed once datagrams sent before it
// arrived (and a killed victim is gone), releases a park, runs the kind's
// follow-up (stop: the start after StopFor) and judges the landing.
func (in *Injector) settle(ctx context.Context, k FaultKind, f Fault, t Trigger, cfg armCfg, v *victim, inj *Injection) {
	settle := time.Now().Add(20 * time.Millisecond)
	if v != nil && v.fd != nil && k.traits().kills {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = v.fd.WaitExit(wctx)
		cancel()
	}
	time.Sleep(time.Until(settle))
	if e, ok := in.tr.LastOf(inj.TriggerPID, inj.ActualNs); ok {
		inj.LastPhase = e.Point
	}
	in.release(t)
	if inj.Err == "" {
		resumed, err := k.afterSettle(ctx, in, f)
		inj.ResumedNs = resumed
		if err != nil {
			inj.Err = err.Error()
		}
	}
	inj.Landed = inj.Err == "" && inj.LastPhase != ""
	switch {
	case len(cfg.intend) > 0:
		inj.Landed = inj.Landed && slices.Contains(cfg.intend, inj.LastPhase)
	case t.Kind == TriggerPark:
		// The parked process cannot have moved on: anything else means the
		// fault hit some other process or point.
		inj.Landed = inj.Landed && inj.LastPhase == t.Point
	}
}

// parkedHit finds the hit of t.Point by the parked pid (the latest one).
func (in *Injector) parkedHit(ctx context.Context, t Trigger, pid int) (Hit, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		v := in.tr.view()
		for i := v.Len() - 1; i >= 0; i-- {
			if e := v.at(i); e.Pid == pid && e.Point == t.Point {
				h := v.hit(i)
				if t.VM != "" && e.VM != t.VM {
					return h, fmt.Errorf("parked pid %d hit %s for vm %q, not %q", pid, t.Point, e.VM, t.VM)
				}
				return h, nil
			}
		}
		if time.Now().After(deadline) {
			return Hit{}, fmt.Errorf("pid %d parked at %s but its hit never reached the trace", pid, t.Point)
		}
		select {
		case <-ctx.Done():
			return Hit{}, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// contLater sends SIGCONT to p at CLOCK_MONOTONIC at (sigstop with StopFor).
func (in *Injector) contLater(p Proc, at int64) {
	go func() {
		_ = sleepUntil(context.Background(), at)
		_ = signalProc(p, syscall.SIGCONT)
	}()
}

// healLater heals d at CLOCK_MONOTONIC at (registry-storage-full and the
// network kinds with StopFor). The disk or link keeps the heal's time and
// error for the runner, which waits for it before its final check.
func (in *Injector) healLater(d interface{ Heal(context.Context) error }, at int64) {
	go func() {
		_ = sleepUntil(context.Background(), at)
		_ = d.Heal(context.Background())
	}()
}

// firing is the outcome of a fault fired on the trace reader thread.
type firing struct {
	hit               Hit
	v                 *victim
	requested, actual int64
	err               error
}

// fireOnReader arms a trace waiter whose completing hit resolves the victim
// (unless pre is still alive) and queues the signal at hit + offset on the
// reader thread.
func (in *Injector) fireOnReader(ctx context.Context, k FaultKind, f Fault, t Trigger, cfg armCfg, pre *victim, sig syscall.Signal) firing {
	res := make(chan firing, 1)
	// 0 armed, 1 firing, 2 disarmed: a disarm never races a signal that is
	// using pidfds the caller is about to close.
	var state atomic.Int32
	match := PointMatch(t.Point, t.VM)
	if t.Kind == TriggerAfterExit {
		match = childExitMatch(t.Child, t.VM)
	}
	cancel, err := in.tr.onHitWaiter(cfg.from, t.N, match, func(h Hit) *timed {
		fr := firing{hit: h, requested: h.Event.TsNs + int64(t.Offset)}
		v := pre
		if v == nil || v.fd.Exited() {
			nv, err := in.resolveVictim(ctx, k, f, &h, &cfg)
			if err != nil {
				fr.err = fmt.Errorf("victim: %w", err)
				res <- fr
				return nil
			}
			v = nv
		}
		fr.v = v
		return &timed{due: fr.requested, fire: func() {
			if !state.CompareAndSwap(0, 1) {
				return // disarmed; nobody waits for res
			}
			fr.err = v.fd.Signal(sig)
			fr.actual = failpoint.Now()
			res <- fr
		}}
	})
	if err != nil {
		return firing{err: fmt.Errorf("trigger: %w", err)}
	}
	select {
	case fr := <-res:
		return fr
	case <-ctx.Done():
		cancel()
		if !state.CompareAndSwap(0, 2) {
			return <-res // it is firing right now: take its result
		}
		return firing{err: fmt.Errorf("trigger: %w", ctx.Err())}
	}
}

func (in *Injector) release(t Trigger) {
	if t.Kind == TriggerPark {
		_ = failpoint.Release(in.opt.CtlDir, t.Point)
	}
}

// fire delivers the fault through its kind and stamps ActualNs as the kind
// says: right after the signal syscall returned, or as the supervisor call
// that delivers it is made.
// A supervisor fault's main pid still being asked (asked, from runWaiting)
// goes into the record once the fault is in.
func (in *Injector) fire(ctx context.Context, k FaultKind, f Fault, v *victim, inj *Injection, between func(context.Context), asked <-chan int) {
	tg := Target{Sup: in.sup, Unit: f.Unit, Disk: in.opt.Disk, Link: in.opt.Link, Between: between}
	if v != nil && v.fd != nil {
		inj.VictimPID = v.fd.PID
		tg.Victim = v.fd
	}
	if k.traits().supervisor && inj.VictimPID == 0 && asked == nil { // Inject: not read ahead
		if pid, e := in.sup.MainPID(ctx, f.Unit); e == nil {
			inj.VictimPID = pid
		}
	}
	actual, err := k.Inject(ctx, tg)
	if asked != nil && inj.VictimPID == 0 {
		select {
		case inj.VictimPID = <-asked:
		case <-ctx.Done():
		}
	}
	inj.ActualNs = actual
	if err != nil {
		inj.Err = err.Error()
		return
	}
	var p Proc
	if tg.Victim != nil {
		p = tg.Victim.Proc
	}
	k.afterSignal(in, f, p, actual)
}

// sleepUntil waits until CLOCK_MONOTONIC reaches target. The last stretch is
// an absolute clock_nanosleep on a locked thread with minimal timer slack:
// Go timers round sub-millisecond waits up, which would cost the accuracy
// the trigger exists for.
func sleepUntil(ctx context.Context, target int64) error {
	const coarse = 3 * time.Millisecond
	if d := time.Duration(target - failpoint.Now()); d > coarse {
		t := time.NewTimer(d - coarse)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if target <= failpoint.Now() {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	ts := unix.NsecToTimespec(target)
	for {
		err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil)
		if !errors.Is(err, unix.EINTR) {
			return nil
		}
	}
}
