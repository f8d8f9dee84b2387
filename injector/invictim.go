package injector

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// InVictim records a fault the victim fires on itself: the process that hits
// the trigger point was started with the failpoint action
// `POINT=1*signal(SIG,OFFSET)` (VictimSpec), so the signal comes from inside
// it, OFFSET after the hit on its own clock, and neither trace delivery nor
// the harness's wake-up is part of the error. The injector then only waits
// for the victim's failpoint.signal datagram and checks it: the right signal,
// the right delay, and a process that is the fault's victim (sigkill-main,
// sigstop, sigcont: the unit's main process at Arm; sigkill-child: an agent
// child of Fault.Child's kind). Only `at POINT[@vm=X] + OFFSET` triggers with
// N = 1 qualify: the action fires at the first hit of each process.
func InVictim() ArmOption { return func(c *armCfg) { c.inVictim = true } }

// Once is InVictim for a spec made by VictimSpecOnce with this token: only
// the victim's failpoint.signal that carries it counts.
func Once(token string) ArmOption { return func(c *armCfg) { c.inVictim, c.once = true, token } }

// VictimSpecOnce is VictimSpec, one-shot across processes: the action
// carries `once=token` (failpoint.OnceClaimFile), so of every process
// started with the spec — a victim restarted with the same environment,
// every child an agent starts — only the first to hit the point fires.
func VictimSpecOnce(f Fault, t Trigger, token string) (string, error) {
	spec, err := VictimSpec(f, t)
	if err != nil || token == "" {
		return spec, err
	}
	point, rest, _ := strings.Cut(spec, ")")
	return point + ",once=" + token + ")" + rest, nil
}

// VictimSpec is the VMCHAOS_FAILPOINTS entry that arms f inside the process
// that hits t's point (see InVictim); "" with the reason when f and t do not
// qualify.
func VictimSpec(f Fault, t Trigger) (string, error) {
	k, err := LookupFaultKind(f.Kind)
	if err != nil || k.traits().signal == 0 {
		return "", fmt.Errorf("fault %s: not a signal to the process that hits the point", f.Kind)
	}
	sig := k.traits().signal
	if t.Kind != TriggerAt || t.N > 1 {
		return "", fmt.Errorf("trigger %s: in-victim arming needs `at POINT + OFFSET` at the first hit", t)
	}
	spec := fmt.Sprintf("%s=1*signal(%s,%dus)", t.Point, failpoint.SignalName(sig), t.Offset.Microseconds())
	if t.Offset%time.Microsecond != 0 {
		spec = fmt.Sprintf("%s=1*signal(%s,%s)", t.Point, failpoint.SignalName(sig), t.Offset)
	}
	if t.VM != "" {
		spec += "@vm=" + t.VM
	}
	return spec, nil
}

// armInVictim checks that f on t can be armed in the victim and opens what
// must be identified now: the victim's identity is checked against it when
// it fires, when it may already be gone.
func (in *Injector) armInVictim(k FaultKind, f Fault, t Trigger, pre *victim) (*victim, error) {
	if _, err := VictimSpec(f, t); err != nil {
		return pre, fmt.Errorf("arm %s: %w", t, err)
	}
	switch k.traits().rule {
	case victimMain:
		if pre == nil {
			return nil, fmt.Errorf("arm %s in the victim: unit %s has no main process now", t, f.Unit)
		}
	case victimVMM:
		// A VM's VMM that runs now is identified now, like a main process:
		// once it killed itself its argv and pid mapping are gone.
		if f.VM != "" {
			v, err := in.vmmVictim(f.VM)
			if err != nil {
				return pre, fmt.Errorf("arm %s in the victim: %w", t, err)
			}
			return v, nil
		}
	}
	return pre, nil
}

// runInVictim waits for the victim's own failpoint.signal datagram, checks
// it and the process that sent it against f, and reads where it landed.
func (in *Injector) runInVictim(ctx context.Context, k FaultKind, f Fault, t Trigger, cfg armCfg, pre *victim) (inj Injection) {
	inj = pendingRecord(f, t, cfg)
	inj.InVictim = true
	defer pre.close()
	if _, err := VictimSpec(f, t); err != nil {
		inj.Err = "in-victim: " + err.Error()
		return inj
	}
	// The main process's pid as it sees itself (innermost NSpid), read now:
	// once it has signalled itself /proc may no longer have it.
	selfPID := 0
	if pre != nil {
		if ns := nsPIDs(pre.fd.PID); len(ns) > 0 {
			selfPID = ns[len(ns)-1]
		}
	}
	// A hitter is identified at its first datagram after Arm (a vmctl
	// sends some before the point, 20 ms for a clone), while it surely
	// lives: by the time its signal — or even its hit, if delivery takes
	// longer than the offset — is read it may be gone, and its pid with it.
	var ids *procIDs
	if k.traits().rule == victimHitter {
		ids = in.identify(ctx, cfg.from, cfg.hitterProc, cfg.allow, cfg.resolve)
	}
	// A VMM not running at Arm is identified at its hit.
	var hitter chan hitterID
	if k.traits().rule == victimVMM && pre == nil {
		var cancel func()
		var err error
		if hitter, cancel, err = in.identifyVMMAtHit(ctx, f, t, cfg); err != nil {
			inj.Err = "trigger: " + err.Error()
			return inj
		}
		defer cancel()
	}
	h, err := in.tr.Wait(ctx, cfg.from, 1, selfSignalled(t, cfg))
	if err != nil {
		inj.Err = "trigger: " + err.Error()
		return inj
	}
	fe := h.Event
	in.readSelfSignal(&inj, fe, t, k.traits().signal)
	switch {
	case inj.Err != "":
	case ids != nil:
		inj.VictimPID, inj.Err = ids.of(ctx, in.tr, fe, h.Index)
	case hitter != nil:
		inj.VictimPID, inj.Err = hitterOfSelf(ctx, fe, hitter)
	default:
		inj.VictimPID, inj.Err = in.victimOfSelf(ctx, k, f, fe, pre, selfPID)
	}
	in.settleInVictim(ctx, k, f, cfg, pre, fe, &inj)
	return inj
}

// identifyVMMAtHit identifies the process that hits t's point as the VM's
// VMM, on the trace reader thread as the hit arrives.
func (in *Injector) identifyVMMAtHit(ctx context.Context, f Fault, t Trigger, cfg armCfg) (chan hitterID, func(), error) {
	hitter := make(chan hitterID, 1)
	cancel, err := in.tr.onHitWaiter(cfg.from, 1, PointMatch(t.Point, t.VM), func(h Hit) *timed {
		host, err := in.vmmHost(ctx, f, &h)
		hitter <- hitterID{h.Event.Pid, host, err}
		return nil
	})
	return hitter, cancel, err
}

// selfSignalled matches the failpoint.signal datagram of a victim armed
// with t's spec (and cfg's once token).
func selfSignalled(t Trigger, cfg armCfg) func(*failpoint.Event) bool {
	return func(e *failpoint.Event) bool {
		return e.Point == failpoint.SignalPoint && e.Attrs["point"] == t.Point && (t.VM == "" || e.VM == t.VM) &&
			(cfg.once == "" || e.Attrs["once"] == cfg.once)
	}
}

// readSelfSignal fills the record from the victim's failpoint.signal
// datagram fe and checks it against the fault: the right signal, the
// right delay, due at its hit + offset.
func (in *Injector) readSelfSignal(inj *Injection, fe failpoint.Event, t Trigger, sig syscall.Signal) {
	late, _ := fe.Attrs["late_ns"].(float64)
	delay, _ := fe.Attrs["delay_ns"].(float64)
	hitSeq, _ := fe.Attrs["hit_seq"].(float64)
	inj.ActualNs = fe.TsNs
	inj.RequestedNs = fe.TsNs - int64(late)
	inj.TriggerPID = fe.Pid
	// The hit that armed it, for its stamp and its delivery; same process,
	// so it arrived first.
	for _, e := range in.tr.eventsOf(fe.Proc, fe.Pid) {
		if e.Event.Seq == uint64(hitSeq) && e.Event.Point == t.Point {
			inj.TriggerNs, inj.HitRecvNs = e.Event.TsNs, e.RecvNs
		}
	}
	switch {
	case fe.Attrs["signal"] != failpoint.SignalName(sig):
		inj.Err = fmt.Sprintf("in-victim: the process fired SIG%v, the fault is %s", fe.Attrs["signal"], inj.Fault.Kind)
	case time.Duration(delay) != t.Offset:
		inj.Err = fmt.Sprintf("in-victim: the process was armed with a delay of %s, the trigger asks %s", time.Duration(delay), FormatOffset(t.Offset))
	case inj.TriggerNs != 0 && inj.TriggerNs+int64(t.Offset) != inj.RequestedNs:
		inj.Err = "in-victim: the signal's due time is not its hit + offset"
	}
}

// settleInVictim lets datagrams sent before the signal arrive (and a
// killed victim die), then reads where the operation was when the fault
// landed, runs the kind's follow-up (sigstop: the SIGCONT after StopFor)
// and judges the landing.
func (in *Injector) settleInVictim(ctx context.Context, k FaultKind, f Fault, cfg armCfg, pre *victim, fe failpoint.Event, inj *Injection) {
	if k.traits().kills && pre != nil && inj.VictimPID == pre.fd.PID {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = pre.fd.WaitExit(wctx)
		cancel()
	}
	time.Sleep(20 * time.Millisecond)
	if e, ok := in.tr.LastOf(fe.Pid, inj.ActualNs); ok {
		inj.LastPhase = e.Point
	}
	if inj.Err == "" && pre != nil {
		k.afterSignal(in, f, pre.fd.Proc, inj.ActualNs)
	}
	inj.Landed = inj.Err == "" && inj.LastPhase != ""
	if len(cfg.intend) > 0 {
		inj.Landed = inj.Landed && slices.Contains(cfg.intend, inj.LastPhase)
	}
}

// vmmHost is the host pid of the process that sent hit when it is the VM's
// VMM (the identity rule of vmmVictim), else an error.
func (in *Injector) vmmHost(ctx context.Context, f Fault, hit *Hit) (int, error) {
	host, err := in.sup.HostPID(ctx, hit.Event.Pid)
	if err != nil {
		return 0, fmt.Errorf("pid %d that hit %s: %w", hit.Event.Pid, hit.Event.Point, err)
	}
	vm := f.VM
	if vm == "" {
		vm = hit.Event.VM
	}
	v, err := in.vmmVictim(vm)
	if err != nil {
		return host, err
	}
	defer v.close()
	if v.fd.PID != host {
		return host, fmt.Errorf("pid %d (host %d) that hit %s is not vm %s's VMM (host %d)", hit.Event.Pid, host, hit.Event.Point, vm, v.fd.PID)
	}
	return host, nil
}

type hitterID struct {
	pid, host int
	err       error
}

// hitterOfSelf checks that the process that signalled itself is the one
// whose hit was identified (and allowed) as it arrived.
func hitterOfSelf(ctx context.Context, fe failpoint.Event, hitter <-chan hitterID) (int, string) {
	select {
	case id := <-hitter:
		switch {
		case id.err != nil:
			return id.host, "in-victim: " + id.err.Error()
		case id.pid != fe.Pid:
			return id.host, fmt.Sprintf("in-victim: pid %d fired, but pid %d hit %s first", fe.Pid, id.pid, fe.Attrs["point"])
		}
		return id.host, ""
	case <-ctx.Done():
		return 0, "in-victim: the hit that armed it was never identified"
	}
}

// victimOfSelf checks that the process that signalled itself is f's victim
// and returns its host pid.
func (in *Injector) victimOfSelf(ctx context.Context, k FaultKind, f Fault, fe failpoint.Event, pre *victim, selfPID int) (int, string) {
	if k.traits().rule == victimVMM && pre != nil {
		if selfPID == 0 || selfPID != fe.Pid {
			return 0, fmt.Sprintf("in-victim: pid %d (as it sees itself) that hit %s is not vm %s's VMM at Arm (host pid %d)", fe.Pid, fe.Attrs["point"], f.VM, pre.fd.PID)
		}
		return pre.fd.PID, ""
	}
	if k.traits().rule == victimMain {
		if pre == nil {
			return 0, fmt.Sprintf("in-victim: unit %s had no main process at Arm", f.Unit)
		}
		// The emitter's pid is as its own pid namespace sees it.
		if selfPID == 0 || selfPID != fe.Pid {
			return 0, fmt.Sprintf("in-victim: pid %d (as it sees itself) that hit %s is not unit %s's main process (host pid %d)", fe.Pid, fe.Attrs["point"], f.Unit, pre.fd.PID)
		}
		return pre.fd.PID, ""
	}
	// sigkill-child: an agent child of the asked kind (and VM).
	v := in.tr.view()
	for i := 0; i < v.Len(); i++ {
		if e := v.at(i); e.Point == "agent.child.exec" && childPID(*e) == fe.Pid && childMatches(*e, f.Child) && (f.VM == "" || e.VM == f.VM) {
			host, err := in.sup.HostPID(ctx, fe.Pid)
			if err != nil {
				host = 0 // already gone: the record keeps the emitter's pid in TriggerPID
			}
			return host, ""
		}
	}
	return 0, fmt.Sprintf("in-victim: pid %d that hit %s is not an agent child%s", fe.Pid, fe.Attrs["point"],
		map[bool]string{true: " of kind " + f.Child}[f.Child != ""])
}

// eventsOf returns the events (with read times) of one emitting process.
func (t *Trace) eventsOf(proc string, pid int) []Hit {
	v := t.view()
	var out []Hit
	for i := 0; i < v.Len(); i++ {
		if e := v.at(i); e.Pid == pid && e.Proc == proc {
			out = append(out, v.hit(i))
		}
	}
	return out
}

// procIDs are the host pids (or why not) of the processes that sent
// datagrams since a mark, each identified at its first one: keyed by that
// datagram's trace index, so a pid reused by a later process is never
// mistaken for the earlier one.
type procIDs struct {
	from int
	mu   sync.Mutex
	last map[int]uint64   // pid → seq of the datagram it was last identified at
	ids  map[int]hitterID // trace index of the identifying datagram → identity
}

// identify identifies, in the background until ctx ends, every process
// emitting as proc ("" any) at its first datagram from index from on (a pid
// whose seq starts again is a new process under a reused pid: identified
// again).
func (in *Injector) identify(ctx context.Context, from int, proc string, allow func(int) error, resolve func(int) (int, error)) *procIDs {
	p := &procIDs{from: from, last: map[int]uint64{}, ids: map[int]hitterID{}}
	fresh := func(e *failpoint.Event) bool {
		if proc != "" && e.Proc != proc {
			return false
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		last, seen := p.last[e.Pid]
		return !seen || e.Seq <= last
	}
	go func() {
		for idx := from; ; {
			h, err := in.tr.Wait(ctx, idx, 1, fresh)
			if err != nil {
				return
			}
			idx = h.Index + 1
			p.mu.Lock()
			p.last[h.Event.Pid] = h.Event.Seq
			p.mu.Unlock()
			host, err := in.hitterHost(ctx, &h, allow, resolve)
			p.mu.Lock()
			p.ids[h.Index] = hitterID{h.Event.Pid, host, err}
			p.mu.Unlock()
		}
	}()
	return p
}

// of is the identity of the process that sent fe (at trace index feIdx):
// the one made at the first datagram of fe's process since the mark, once
// the background identification has come to it.
func (p *procIDs) of(ctx context.Context, tr *Trace, fe failpoint.Event, feIdx int) (int, string) {
	// Walk back over this pid's datagrams while seq goes down: where it
	// stops is this process's first datagram since the mark.
	start := -1
	evs := tr.eventsOf(fe.Proc, fe.Pid)
	for k := len(evs) - 1; k >= 0; k-- {
		if evs[k].Index > feIdx {
			continue
		}
		if evs[k].Index < p.from || start >= 0 && !(evs[k].Event.Seq > 0 && evs[k].Event.Seq < evs[k+1].Event.Seq) {
			break
		}
		start = evs[k].Index
	}
	for {
		p.mu.Lock()
		id, ok := p.ids[start]
		p.mu.Unlock()
		if ok {
			if id.err != nil {
				return id.host, "in-victim: " + id.err.Error()
			}
			return id.host, ""
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Sprintf("in-victim: pid %d that fired was never identified", fe.Pid)
		case <-time.After(time.Millisecond):
		}
	}
}
