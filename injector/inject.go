package injector

import (
	"context"
	"encoding/json"
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

// Fault kinds (ARCHITECTURE §7).
const (
	FaultSigkillMain  = "sigkill-main"  // kill -KILL MainPID, as a crash or the OOM killer would
	FaultStop         = "stop"          // systemctl stop; systemctl start after StopFor (0: stays stopped)
	FaultRestart      = "restart"       // systemctl restart
	FaultKillAll      = "kill-all"      // systemctl kill --kill-who=all -s KILL
	FaultSigkillChild = "sigkill-child" // the in-flight vmctl child (pid from agent.child.exec)
	FaultSigkillVMM   = "sigkill-vmm"   // the VM's cloud-hypervisor process
	FaultSigstop      = "sigstop"       // SIGSTOP to MainPID; SIGCONT after StopFor (0: stays stopped)
	FaultSigcont      = "sigcont"       // SIGCONT to MainPID
	// FaultSigkillHitter SIGKILLs the process whose hit fired the trigger
	// (the runner's sigkill-direct: a vmctl the harness started itself);
	// Allow decides whether that process may be killed.
	FaultSigkillHitter = "sigkill-hitter"
)

// FaultKinds lists every fault kind.
var FaultKinds = []string{FaultSigkillMain, FaultStop, FaultRestart, FaultKillAll, FaultSigkillChild, FaultSigkillVMM, FaultSigstop, FaultSigcont, FaultSigkillHitter}

// Fault is what to do when a trigger fires.
type Fault struct {
	Kind    string        `json:"kind"`
	Unit    string        `json:"unit,omitempty"`     // the supervised unit (all kinds but sigkill-vmm)
	StopFor time.Duration `json:"stop_for,omitempty"` // stop / sigstop: how long before start / SIGCONT
	VM      string        `json:"vm,omitempty"`       // sigkill-vmm: VM id (default: the trigger hit's vm); sigkill-child: only a child run for this VM (agent events carry the intent name)
	Child   string        `json:"child,omitempty"`    // sigkill-child: only a child of this kind ("snapshot-save")
}

// String is the fault as a report shows it.
func (f Fault) String() string {
	s := f.Kind
	if f.StopFor > 0 {
		s += " for " + FormatOffset(f.StopFor)
	}
	if f.Child != "" {
		s += " child=" + f.Child
	}
	if f.VM != "" {
		s += " vm=" + f.VM
	}
	return s
}

// Validate checks the fault's fields.
func (f Fault) Validate() error {
	if !slices.Contains(FaultKinds, f.Kind) {
		return fmt.Errorf("fault %q: unknown kind (want one of %s)", f.Kind, strings.Join(FaultKinds, ", "))
	}
	if f.Unit == "" && f.Kind != FaultSigkillVMM && f.Kind != FaultSigkillHitter {
		return fmt.Errorf("fault %s: needs a unit", f.Kind)
	}
	if f.StopFor < 0 {
		return fmt.Errorf("fault %s: negative StopFor", f.Kind)
	}
	return nil
}

// Injection is the record of one fault: what was asked and where it landed.
// Times are CLOCK_MONOTONIC ns (failpoint.Now), comparable with trace events.
type Injection struct {
	Fault         `json:"-"` // MarshalJSON writes the text forms
	Trigger       `json:"-"`
	RequestedNs   int64  // trigger hit + offset (park: when the point was seen parked)
	ActualNs      int64  // right after the signal syscall (or the supervisor call) returned
	Err           string // why it did not land ("" = it did)
	VictimPID     int    // host pid signalled (main, child or VMM); 0 for supervisor faults without one
	LastPhase     string // last phase the operation's process had reached at ActualNs
	IntendedPhase string // the trigger point (or the Intend list)
	Landed        bool   // intended phase reached and the fault delivered; false → the case is inconclusive
	TriggerPID    int    // pid (as emitted) of the process whose hit fired the trigger
	TriggerNs     int64  // ts of that hit
	HitRecvNs     int64  // when the harness read that hit (delivery = HitRecvNs − TriggerNs)
	ResumedNs     int64  // stop / sigstop with StopFor: when start / SIGCONT was issued
	InVictim      bool   // the victim fired it on itself (InVictim): ActualNs is its own stamp
}

// MarshalJSON flattens the embedded Fault and Trigger (whose Kind, VM and
// Child would otherwise collide and vanish) into their text forms.
func (in Injection) MarshalJSON() ([]byte, error) {
	type flat struct {
		Fault         string `json:"fault"`
		Unit          string `json:"unit,omitempty"`
		Trigger       string `json:"trigger"`
		RequestedNs   int64  `json:"requested_ns"`
		ActualNs      int64  `json:"actual_ns"`
		Err           string `json:"error,omitempty"`
		VictimPID     int    `json:"victim_pid,omitempty"`
		LastPhase     string `json:"last_phase"`
		IntendedPhase string `json:"intended_phase"`
		Landed        bool   `json:"landed"`
		TriggerPID    int    `json:"trigger_pid,omitempty"`
		TriggerNs     int64  `json:"trigger_ns,omitempty"`
		HitRecvNs     int64  `json:"hit_recv_ns,omitempty"`
		ResumedNs     int64  `json:"resumed_ns,omitempty"`
		InVictim      bool   `json:"in_victim,omitempty"`
	}
	return json.Marshal(flat{in.Fault.String(), in.Unit, in.Trigger.String(), in.RequestedNs, in.ActualNs, in.Err,
		in.VictimPID, in.LastPhase, in.IntendedPhase, in.Landed, in.TriggerPID, in.TriggerNs, in.HitRecvNs, in.ResumedNs, in.InVictim})
}

// Options configure an Injector.
type Options struct {
	CtlDir  string // VMCHAOS_FAILPOINT_CTL of the stack: needed by park triggers
	VMMName string // argv[0] basename of the VMM; default "cloud-hypervisor"
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

// Intend names the phases the fault must land in (LastPhase ∈ phases);
// otherwise Landed is false and the case is inconclusive.
func Intend(phases ...string) ArmOption { return func(c *armCfg) { c.intend = phases } }

// Arm validates f and t and returns at once; the fault fires when t matches.
// Hits of the trigger point are counted from the moment of Arm (see From).
func (in *Injector) Arm(ctx context.Context, f Fault, t Trigger, opts ...ArmOption) (*Armed, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	// Resolve the main pid before the trigger: at offset 0 there is no time
	// to ask the supervisor (D-Bus for a sandbox) after the hit. Done before
	// the mark, so hits during the lookup do not count as already past due.
	var pre *victim
	if needsMain(f.Kind) {
		if v, err := in.mainVictim(ctx, f.Unit); err == nil {
			pre = v
		}
	}
	// A supervisor fault's main process is read now for the same reason:
	// the record names it, and a D-Bus round trip between the hit and the
	// call (1 ms, tens of ms while the sandbox's systemd is busy) would be
	// all of the fault's error.
	var supMain Proc
	if isSupervisorFault(f.Kind) {
		if pid, err := in.sup.MainPID(ctx, f.Unit); err == nil && pid > 0 {
			supMain, _ = Identify(pid)
		}
	}
	cfg := armCfg{from: in.tr.Len(), supMain: supMain}
	for _, o := range opts {
		o(&cfg)
	}
	if f.Kind == FaultSigkillHitter && t.Kind == TriggerAfterExit {
		pre.close()
		return nil, fmt.Errorf("arm %s: %s needs a trigger hit by its victim", t, f.Kind)
	}
	if cfg.inVictim {
		if _, err := VictimSpec(f, t); err != nil {
			pre.close()
			return nil, fmt.Errorf("arm %s: %w", t, err)
		}
		// The victim's identity is checked against this process when it
		// fires, when it may already be gone.
		if needsMain(f.Kind) && pre == nil {
			return nil, fmt.Errorf("arm %s in the victim: unit %s has no main process now", t, f.Unit)
		}
		// A VM's VMM that runs now is identified now, like a main process:
		// once it killed itself its argv and pid mapping are gone.
		if f.Kind == FaultSigkillVMM && f.VM != "" {
			v, err := in.vmmVictim(f.VM)
			if err != nil {
				return nil, fmt.Errorf("arm %s in the victim: %w", t, err)
			}
			pre = v
		}
	}
	switch t.Kind {
	case TriggerAt, TriggerAfterExit:
	case TriggerPark:
		if in.opt.CtlDir == "" {
			return nil, fmt.Errorf("arm %s: park needs Options.CtlDir (the stack's %s)", t, failpoint.EnvCtl)
		}
		// Stale files of an earlier park would make this one fire at once or
		// never hold the point. The release goes first: a restarted process
		// that announces itself between the two removals must not still see
		// the old release and move on, leaving a .paused that names a process
		// no longer held (the fault then lands past the point).
		for _, suf := range []string{".release", ".paused"} {
			if err := os.Remove(filepath.Join(in.opt.CtlDir, t.Point+suf)); err != nil && !os.IsNotExist(err) {
				pre.close()
				return nil, fmt.Errorf("arm %s: %w", t, err)
			}
		}
	default:
		pre.close()
		return nil, fmt.Errorf("arm: unknown trigger kind %q", t.Kind)
	}
	if t.N < 1 {
		t.N = 1
	}
	actx, cancel := context.WithCancel(ctx)
	a := &Armed{done: make(chan struct{}), cancel: cancel}
	a.inj = Injection{Fault: f, Trigger: t, IntendedPhase: t.Point}
	if len(cfg.intend) > 0 {
		a.inj.IntendedPhase = strings.Join(cfg.intend, "|")
	}
	go func() {
		defer close(a.done)
		defer cancel()
		var inj Injection
		if cfg.inVictim {
			inj = in.runInVictim(actx, f, t, cfg, pre)
		} else {
			inj = in.run(actx, f, t, cfg, pre)
		}
		a.mu.Lock()
		a.inj = inj
		a.mu.Unlock()
	}()
	return a, nil
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
	if err := f.Validate(); err != nil {
		inj.Err = err.Error()
		return inj
	}
	now := failpoint.Now()
	inj.RequestedNs = now
	v, err := in.resolve(ctx, f, nil)
	if err != nil {
		inj.Err = err.Error()
		return inj
	}
	in.fire(ctx, f, v, &inj)
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
	if err := f.Validate(); err != nil {
		inj.Err = err.Error()
		return inj
	}
	inj.RequestedNs = failpoint.Now()
	v, err := in.resolveWith(ctx, f, &hit, &cfg)
	if err != nil {
		inj.Err = "victim: " + err.Error()
		return inj
	}
	defer v.close()
	in.fire(ctx, f, v, &inj)
	inj.Landed = inj.Err == ""
	return inj
}

// victim is a process resolved ahead of the signal.
type victim struct{ fd *PidFD }

func (v *victim) close() {
	if v != nil && v.fd != nil {
		v.fd.Close()
	}
}

func (in *Injector) run(ctx context.Context, f Fault, t Trigger, cfg armCfg, pre *victim) (inj Injection) {
	inj = Injection{Fault: f, Trigger: t, IntendedPhase: t.Point}
	if len(cfg.intend) > 0 {
		inj.IntendedPhase = strings.Join(cfg.intend, "|")
	}
	defer pre.close()

	var hit Hit
	var err error
	var v *victim
	if sig, ok := faultSignal[f.Kind]; ok && t.Kind != TriggerPark {
		// The accuracy-critical path: resolved and fired on the trace's
		// reader thread, no goroutine hand-off between hit and signal.
		fr := in.fireOnReader(ctx, f, t, cfg, pre, sig)
		hit, v = fr.hit, fr.v
		if v != nil && v != pre {
			defer v.close()
		}
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
			return inj
		}
		if f.Kind == FaultSigstop && f.StopFor > 0 {
			in.contLater(v.fd.Proc, inj.ActualNs+int64(f.StopFor))
		}
	} else {
		var watch *mainWatch
		if isSupervisorFault(f.Kind) {
			watch = in.watchMain(ctx, f.Unit, cfg.supMain)
			defer watch.stop()
		}
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
		if err != nil {
			inj.Err = "trigger: " + err.Error()
			return inj
		}
		inj.TriggerPID, inj.TriggerNs, inj.HitRecvNs = hit.Event.Pid, hit.Event.TsNs, hit.RecvNs

		v = pre
		if v == nil || v.fd.Exited() {
			if v, err = in.resolveWith(ctx, f, &hit, &cfg); err != nil {
				inj.Err = "victim: " + err.Error()
				in.release(t)
				return inj
			}
			defer v.close()
		}
		if isSupervisorFault(f.Kind) {
			// The main read before the hit while it still runs; asked
			// again only when it changed since (its cost then shows in
			// the error).
			if m := watch.get(); m.PID > 0 && m.Alive() {
				inj.VictimPID = m.PID
			} else {
				inj.VictimPID = in.newMain(ctx, f.Unit).PID
			}
		}
		if err := sleepUntil(ctx, inj.RequestedNs); err != nil {
			inj.Err = "waiting for the offset: " + err.Error()
			in.release(t)
			return inj
		}
		in.fire(ctx, f, v, &inj)
	}

	// Let datagrams sent before the signal arrive, then read where the
	// operation was when the fault landed.
	settle := time.Now().Add(20 * time.Millisecond)
	if v != nil && v.fd != nil && isKill(f.Kind) {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = v.fd.WaitExit(wctx)
		cancel()
	}
	time.Sleep(time.Until(settle))
	if e, ok := in.tr.LastOf(inj.TriggerPID, inj.ActualNs); ok {
		inj.LastPhase = e.Point
	}
	in.release(t)
	if inj.Err == "" && f.Kind == FaultStop && f.StopFor > 0 {
		_ = sleepUntil(ctx, failpoint.Now()+int64(f.StopFor))
		inj.ResumedNs = failpoint.Now()
		if err := in.sup.StartAgain(ctx, f.Unit); err != nil {
			inj.Err = "start after stop: " + err.Error()
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
	return inj
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

// faultSignal maps the faults that are one signal to a victim to that signal.
var faultSignal = map[string]syscall.Signal{
	FaultSigkillMain: syscall.SIGKILL, FaultSigkillChild: syscall.SIGKILL, FaultSigkillVMM: syscall.SIGKILL,
	FaultSigstop: syscall.SIGSTOP, FaultSigcont: syscall.SIGCONT, FaultSigkillHitter: syscall.SIGKILL,
}

// contLater sends SIGCONT to p at CLOCK_MONOTONIC at (sigstop with StopFor).
func (in *Injector) contLater(p Proc, at int64) {
	go func() {
		_ = sleepUntil(context.Background(), at)
		_ = signalProc(p, syscall.SIGCONT)
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
func (in *Injector) fireOnReader(ctx context.Context, f Fault, t Trigger, cfg armCfg, pre *victim, sig syscall.Signal) firing {
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
			nv, err := in.resolveWith(ctx, f, &h, &cfg)
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

func needsMain(kind string) bool {
	return kind == FaultSigkillMain || kind == FaultSigstop || kind == FaultSigcont
}

func isSupervisorFault(kind string) bool {
	return kind == FaultStop || kind == FaultRestart || kind == FaultKillAll
}

func isKill(kind string) bool {
	return kind == FaultSigkillMain || kind == FaultSigkillChild || kind == FaultSigkillVMM || kind == FaultSigkillHitter
}

// fire delivers the fault and stamps ActualNs right after the syscall (or
// supervisor call) that delivers it returned.
func (in *Injector) fire(ctx context.Context, f Fault, v *victim, inj *Injection) {
	if v != nil && v.fd != nil {
		inj.VictimPID = v.fd.PID
	}
	var err error
	switch f.Kind {
	case FaultSigkillMain, FaultSigkillChild, FaultSigkillVMM, FaultSigkillHitter:
		err = v.fd.Signal(syscall.SIGKILL)
		inj.ActualNs = failpoint.Now()
	case FaultSigstop:
		err = v.fd.Signal(syscall.SIGSTOP)
		inj.ActualNs = failpoint.Now()
		if err == nil && f.StopFor > 0 {
			in.contLater(v.fd.Proc, inj.ActualNs+int64(f.StopFor))
		}
	case FaultSigcont:
		err = v.fd.Signal(syscall.SIGCONT)
		inj.ActualNs = failpoint.Now()
	case FaultStop, FaultRestart, FaultKillAll:
		if inj.VictimPID == 0 { // Inject: not read ahead
			if pid, e := in.sup.MainPID(ctx, f.Unit); e == nil {
				inj.VictimPID = pid
			}
		}
		inj.ActualNs = failpoint.Now()
		switch f.Kind {
		case FaultStop:
			err = in.sup.Stop(ctx, f.Unit)
		case FaultRestart:
			err = in.sup.Restart(ctx, f.Unit)
		default:
			err = in.sup.KillAll(ctx, f.Unit, syscall.SIGKILL)
		}
	}
	if err != nil {
		inj.Err = err.Error()
	}
}

// resolve finds and opens the victim of f; nil for supervisor faults.
func (in *Injector) resolve(ctx context.Context, f Fault, hit *Hit) (*victim, error) {
	return in.resolveWith(ctx, f, hit, nil)
}

// hitterHost is the host pid of the process that sent hit, through resolve
// when set, else HostPID vetted by allow.
func (in *Injector) hitterHost(ctx context.Context, hit *Hit, allow func(int) error, resolve func(int) (int, error)) (int, error) {
	if hit == nil {
		return 0, fmt.Errorf("%s: no trigger hit", FaultSigkillHitter)
	}
	if resolve != nil {
		host, err := resolve(hit.Event.Pid)
		if err != nil {
			return host, fmt.Errorf("pid %d that hit %s: %w", hit.Event.Pid, hit.Event.Point, err)
		}
		return host, nil
	}
	host, err := in.sup.HostPID(ctx, hit.Event.Pid)
	if err != nil {
		return 0, fmt.Errorf("pid %d that hit %s: %w", hit.Event.Pid, hit.Event.Point, err)
	}
	if allow != nil {
		if err := allow(host); err != nil {
			return host, fmt.Errorf("pid %d (host %d) that hit %s: %w", hit.Event.Pid, host, hit.Event.Point, err)
		}
	}
	return host, nil
}

func (in *Injector) resolveWith(ctx context.Context, f Fault, hit *Hit, cfg *armCfg) (*victim, error) {
	switch f.Kind {
	case FaultSigkillHitter:
		var host int
		var err error
		if cfg != nil {
			host, err = in.hitterHost(ctx, hit, cfg.allow, cfg.resolve)
		} else {
			host, err = in.hitterHost(ctx, hit, nil, nil)
		}
		if err != nil {
			return nil, err
		}
		p, err := Identify(host)
		if err != nil {
			return nil, err
		}
		return in.open(p)
	case FaultSigkillMain, FaultSigstop, FaultSigcont:
		return in.mainVictim(ctx, f.Unit)
	case FaultSigkillChild:
		return in.childVictim(ctx, f, hit)
	case FaultSigkillVMM:
		vm := f.VM
		if vm == "" && hit != nil {
			vm = hit.Event.VM
		}
		return in.vmmVictim(vm)
	}
	return nil, nil
}

func (in *Injector) open(p Proc) (*victim, error) {
	if !in.sup.Owns(p) {
		return nil, fmt.Errorf("pid %d: %w", p.PID, ErrNotOwned)
	}
	fd, err := OpenPidFD(p)
	if err != nil {
		return nil, err
	}
	return &victim{fd: fd}, nil
}

func (in *Injector) mainVictim(ctx context.Context, unit string) (*victim, error) {
	pid, err := in.sup.MainPID(ctx, unit)
	if err != nil {
		return nil, err
	}
	if pid == 0 {
		return nil, fmt.Errorf("unit %s has no main process", unit)
	}
	p, err := Identify(pid)
	if err != nil {
		return nil, err
	}
	return in.open(p)
}

// childVictim picks the agent child to kill: the one the trigger hit names
// (agent.child.exec), else the latest exec'd child that has not exited.
func (in *Injector) childVictim(ctx context.Context, f Fault, hit *Hit) (*victim, error) {
	var pid int
	forVM := func(e failpoint.Event) bool { return f.VM == "" || e.VM == f.VM }
	if hit != nil && hit.Event.Point == "agent.child.exec" && childMatches(hit.Event, f.Child) && forVM(hit.Event) {
		pid = childPID(hit.Event)
	}
	if pid == 0 {
		exited := map[int]bool{}
		v := in.tr.view()
		for i := v.Len() - 1; i >= 0; i-- {
			e := *v.at(i)
			switch e.Point {
			case "agent.child.exit":
				exited[childPID(e)] = true
			case "agent.child.exec":
				if c := childPID(e); c != 0 && !exited[c] && childMatches(e, f.Child) && forVM(e) {
					pid = c
				}
			}
			if pid != 0 {
				break
			}
		}
	}
	if pid == 0 {
		return nil, fmt.Errorf("no in-flight agent child%s in the trace", map[bool]string{true: " of kind " + f.Child}[f.Child != ""])
	}
	host, err := in.sup.HostPID(ctx, pid)
	if err != nil {
		return nil, fmt.Errorf("child pid %d: %w", pid, err)
	}
	p, err := Identify(host)
	if err != nil {
		return nil, err
	}
	return in.open(p)
}

// vmmVictim finds the VM's VMM: argv[0] basename is the VMM name and an
// argument names <run>/<vm>/api.sock (the identity rule of ARCHITECTURE §4.3).
func (in *Injector) vmmVictim(vm string) (*victim, error) {
	if vm == "" {
		return nil, fmt.Errorf("sigkill-vmm: no VM id (set Fault.VM or trigger on a hit that carries vm)")
	}
	want := "/" + vm + "/api.sock"
	for _, pid := range allPIDs() {
		argv := cmdline(pid)
		if len(argv) == 0 || filepath.Base(argv[0]) != in.opt.VMMName {
			continue
		}
		for _, a := range argv[1:] {
			if strings.HasSuffix(a, want) || strings.Contains(a, want+",") {
				p, err := Identify(pid)
				if err != nil {
					return nil, err
				}
				return in.open(p)
			}
		}
	}
	return nil, fmt.Errorf("sigkill-vmm: no %s process with %s in its arguments", in.opt.VMMName, want)
}

// childPID reads attrs.child_pid (a JSON number).
func childPID(e failpoint.Event) int {
	switch v := e.Attrs["child_pid"].(type) {
	case float64:
		return int(v)
	case int:
		return v
	case json.Number:
		n, _ := v.Int64()
		return int(n)
	}
	return 0
}

// ChildKind names an agent child by its argv: the leading non-flag words after
// the binary joined by "-" ("vmctl snapshot save --name x vm" → "snapshot-save").
func ChildKind(argv []string) string {
	var words []string
	for _, a := range argv[min(1, len(argv)):] {
		if strings.HasPrefix(a, "-") || len(words) == 2 {
			break
		}
		words = append(words, a)
	}
	return strings.Join(words, "-")
}

func eventArgv(e failpoint.Event) []string {
	raw, _ := e.Attrs["argv"].([]any)
	out := make([]string, 0, len(raw))
	for _, a := range raw {
		s, _ := a.(string)
		out = append(out, s)
	}
	return out
}

func childMatches(e failpoint.Event, kind string) bool {
	if kind == "" {
		return true
	}
	k := ChildKind(eventArgv(e))
	return k == kind || strings.HasPrefix(k, kind+"-")
}

func childExitMatch(kind, vm string) func(*failpoint.Event) bool {
	return func(e *failpoint.Event) bool {
		return e.Point == "agent.child.exit" && (vm == "" || e.VM == vm) && childMatches(*e, kind)
	}
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
