package managerlayer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
)

// parkWait bounds the wait for the VMM to park at the case's point.
const parkWait = 60 * time.Second

// settle is how long the released VMM gets to finish the request its dead
// client sent (scaled: fakech's durations are).
func (cr *caseRun) settle() time.Duration {
	d := time.Duration(float64(2*time.Second) * cr.r.opts.Scale)
	if d < 200*time.Millisecond {
		d = 200 * time.Millisecond
	}
	return d
}

// inject delivers the case's fault. ok is false (with why) when it did not
// land where the case intended: the case is then inconclusive.
func (cr *caseRun) inject(ctx context.Context, window time.Duration) (inj reports.Injection, ok bool, why string) {
	if cr.c.Trigger == TrigKillVMM {
		return cr.killVMM(ctx)
	}
	inj, why = cr.planInjection(window)
	if why != "" {
		return inj, false, why
	}
	mark := cr.trace.Mark()
	t0 := time.Now()
	rv, err := cr.startVerb(cr.c.Op.Call)
	if err != nil {
		return inj, false, "start the verb: " + err.Error()
	}
	inj.VictimPID = rv.cmd.Process.Pid
	if why := cr.waitToFire(ctx, rv, mark, t0); why != "" {
		return inj, false, why
	}
	return cr.killVerb(ctx, rv, inj, mark)
}

// planInjection is the injection record for the case's trigger, and arms a
// park: from then on the first hit of the point parks.
func (cr *caseRun) planInjection(window time.Duration) (inj reports.Injection, why string) {
	c := cr.c
	switch c.Trigger {
	case TrigPark:
		inj = reports.Injection{Fault: "sigkill-verb", Trigger: "park " + c.Point, IntendedPhase: c.Point}
		for _, f := range []string{".release", ".paused"} {
			if err := os.Remove(filepath.Join(cr.ctl, c.Point+f)); err != nil && !os.IsNotExist(err) {
				return inj, err.Error()
			}
		}
	case TrigOffset:
		off := time.Duration(float64(window) * c.Fraction)
		cr.out.OffsetMs = float64(off) / float64(time.Millisecond)
		inj = reports.Injection{Fault: "sigkill-verb", Trigger: fmt.Sprintf("%s start + %.0f%% of %s (%s)", c.Op.Verb, c.Fraction*100, window.Round(time.Millisecond), off.Round(time.Millisecond)),
			IntendedPhase: fmt.Sprintf("inside %s", c.Op.Verb)}
	default:
		return inj, "unknown trigger " + c.Trigger
	}
	return inj, ""
}

// waitToFire polls until the fault is due (the VMM parked at the point, or
// the offset passed since t0). It returns why not when the verb exited
// first, the context ended or the park never came.
func (cr *caseRun) waitToFire(ctx context.Context, rv *running, mark int, t0 time.Time) string {
	c := cr.c
	var target time.Time
	if c.Trigger == TrigOffset {
		target = t0.Add(time.Duration(cr.out.OffsetMs * float64(time.Millisecond)))
	}
	deadline := time.Now().Add(parkWait)
	for {
		select {
		case code := <-rv.exit:
			rv.exit <- code
			phases := cr.phasesSince(mark)
			if c.Trigger == TrigPark {
				_ = cr.releasePark()
				return fmt.Sprintf("%s exited %d after %s without the VMM parking at %s (VMM phases: %s)",
					c.Op.Verb, code, time.Since(t0).Round(time.Millisecond), c.Point, orNone(phases))
			}
			return fmt.Sprintf("%s finished (exit %d) in %s, before the offset %.0fms: the window was shorter than calibrated (VMM phases: %s)",
				c.Op.Verb, code, time.Since(t0).Round(time.Millisecond), cr.out.OffsetMs, orNone(phases))
		case <-ctx.Done():
			_ = rv.cmd.Process.Kill()
			return ctx.Err().Error()
		case <-time.After(time.Millisecond):
		}
		if c.Trigger == TrigPark {
			if _, err := os.Stat(filepath.Join(cr.ctl, c.Point+".paused")); err == nil {
				return ""
			}
		} else if !time.Now().Before(target) {
			return ""
		}
		if time.Now().After(deadline) {
			_ = rv.cmd.Process.Kill()
			_ = cr.releasePark()
			return fmt.Sprintf("%s did not reach %s within %s", c.Op.Verb, c.Point, parkWait)
		}
	}
}

// killVerb SIGKILLs the verb and records where it died; a park is released
// so the VMM finishes the request of its dead client.
func (cr *caseRun) killVerb(ctx context.Context, rv *running, inj reports.Injection, mark int) (reports.Injection, bool, string) {
	c := cr.c
	inj.RequestedNs = failpoint.Now()
	// The verb is our own child and not yet waited for, so its pid cannot
	// have been reused: a plain kill(2) hits exactly it.
	err := rv.cmd.Process.Signal(syscall.SIGKILL)
	inj.ActualNs = failpoint.Now()
	if err != nil {
		inj.Err = err.Error()
		_ = cr.releasePark()
		return inj, false, "SIGKILL the verb: " + err.Error()
	}
	code, _ := rv.wait(ctx, 10*time.Second)
	inj.LastPhase = cr.lastPhase(mark, inj.ActualNs)
	if c.Trigger == TrigPark {
		inj.LastPhase = c.Point
		// The VMM finishes the request of its dead client, as a real one
		// would once its handler returns.
		if err := cr.releasePark(); err != nil {
			return inj, false, err.Error()
		}
		time.Sleep(cr.settle())
	}
	if code != -1 {
		return inj, false, fmt.Sprintf("%s exited %d on its own before SIGKILL landed", c.Op.Verb, code)
	}
	inj.Landed = true
	return inj, true, ""
}

// phasesSince lists the ch.* points the case's VMMs reported since mark.
func (cr *caseRun) phasesSince(mark int) string {
	var ps []string
	for _, e := range cr.trace.Since(mark) {
		if strings.HasPrefix(e.Point, "ch.") {
			ps = append(ps, e.Point)
		}
	}
	return strings.Join(ps, ",")
}

// lastPhase is the last ch.* point reported at or before ns.
func (cr *caseRun) lastPhase(mark int, ns int64) string {
	last := "(none: before the VMM's first phase)"
	for _, e := range cr.trace.Since(mark) {
		if strings.HasPrefix(e.Point, "ch.") && e.TsNs <= ns {
			last = e.Point
		}
	}
	return last
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// killVMM kill -9s the VMM of the fixture's VM, found through the
// manager's record and checked against the VMM's command line.
func (cr *caseRun) killVMM(ctx context.Context) (reports.Injection, bool, string) {
	inj := reports.Injection{Fault: "sigkill-vmm", Trigger: "after setup (no verb running)", IntendedPhase: "VM running"}
	vms, err := cr.m.VMs(ctx)
	if err != nil {
		return inj, false, "list: " + err.Error()
	}
	var vm manager.VM
	for _, v := range vms {
		if v.Name == SrcVM {
			vm = v
		}
	}
	if vm.PID <= 0 || !alive(vm.PID) {
		return inj, false, fmt.Sprintf("VM %s has no live VMM to kill (record %+v)", SrcVM, vm)
	}
	if id, ok := cr.m.VMMOf(argvOf(vm.PID)); !ok || id != vm.ID {
		return inj, false, fmt.Sprintf("pid %d is not the VMM of %s (%v)", vm.PID, vm.ID, argvOf(vm.PID))
	}
	inj.VictimPID = vm.PID
	inj.RequestedNs = failpoint.Now()
	inj.ActualNs, err = killPID(vm.PID)
	inj.LastPhase = "running"
	if err != nil {
		inj.Err = err.Error()
		return inj, false, err.Error()
	}
	inj.Landed = true
	return inj, true, ""
}

// deathSeen: the event stream reports the killed VMM's VM as no longer
// running (cocoon and vmctl: MODIFIED "stopped (stale)") after the kill.
func (cr *caseRun) deathSeen(ctx context.Context, killNs int64) reports.Invariant {
	inv := reports.Invariant{Name: "vmm-death-seen"}
	limit := time.Now().Add(10 * time.Second)
	for time.Now().Before(limit) && ctx.Err() == nil {
		for _, e := range cr.events.since(killNs) {
			if e.ev.Name == SrcVM && e.ev.State != manager.StateRunning {
				inv.OK = true
				inv.Evidence = fmt.Sprintf("%s %s %q %.0fms after the kill", e.ev.Type, e.ev.ID, e.ev.State, float64(e.ns-killNs)/1e6)
				return inv
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	inv.Evidence = fmt.Sprintf("no event for %s left running within 10s of the kill (events after it: %s)", SrcVM, cr.events.describe(killNs))
	return inv
}

// recover runs the op's recovery calls; the last one (the retry) must
// succeed, the others' outcomes are evidence.
func (cr *caseRun) recover(ctx context.Context) []reports.Invariant {
	var steps []string
	var last verbResult
	ran := false
	for _, call := range cr.c.Op.Recovery {
		if !manager.Supported(cr.m, call.Verb) {
			steps = append(steps, fmt.Sprintf("%s: the manager has no such verb", call.Verb))
			continue
		}
		last = cr.verb(ctx, call)
		ran = true
		steps = append(steps, last.String())
	}
	if !ran {
		return nil
	}
	inv := reports.Invariant{Name: "recovery-verb-succeeds", OK: last.err == nil, Evidence: strings.Join(steps, "; ")}
	return []reports.Invariant{inv}
}

// event is one event-stream line with the time the harness read it.
type event struct {
	ns int64
	ev manager.Event
}

// eventStream is the manager's event stream, running for the whole case.
type eventStream struct {
	rv   *running
	mu   sync.Mutex
	evs  []event
	bad  []string
	done chan struct{}
}

func (cr *caseRun) startEvents() (*eventStream, error) {
	argv := cr.m.EventCommand()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = cr.m.Env()
	errf, err := os.Create(filepath.Join(cr.caseDir, "logs", "event-stream.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = errf
	out, err := cmd.StdoutPipe()
	if err != nil {
		errf.Close()
		return nil, err
	}
	raw, err := os.Create(filepath.Join(cr.caseDir, "events.jsonl"))
	if err != nil {
		errf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		errf.Close()
		raw.Close()
		return nil, fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	es := &eventStream{rv: &running{cmd: cmd, exit: make(chan int, 1)}, done: make(chan struct{})}
	go func() {
		defer close(es.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			ns := failpoint.Now()
			line := sc.Bytes()
			fmt.Fprintf(raw, "%s\n", line)
			ev, err := cr.m.ParseEvent(line)
			es.mu.Lock()
			if err != nil {
				es.bad = append(es.bad, err.Error())
			} else {
				es.evs = append(es.evs, event{ns: ns, ev: ev})
			}
			es.mu.Unlock()
		}
		err := cmd.Wait()
		raw.Close()
		errf.Close()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		es.rv.exit <- code
	}()
	return es, nil
}

func (es *eventStream) since(ns int64) []event {
	es.mu.Lock()
	defer es.mu.Unlock()
	var out []event
	for _, e := range es.evs {
		if e.ns >= ns {
			out = append(out, e)
		}
	}
	return out
}

func (es *eventStream) describe(ns int64) string {
	var parts []string
	for _, e := range es.since(ns) {
		parts = append(parts, fmt.Sprintf("%s %s %q", e.ev.Type, e.ev.Name, e.ev.State))
	}
	es.mu.Lock()
	if len(es.bad) > 0 {
		parts = append(parts, fmt.Sprintf("%d unparsable line(s), first: %s", len(es.bad), es.bad[0]))
	}
	es.mu.Unlock()
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

func (es *eventStream) stop() {
	if es == nil {
		return
	}
	_ = es.rv.cmd.Process.Kill()
	<-es.done
}

// teardown stops the event stream, kills every process of the case (the
// VMMs outlive the verbs by design), verifies none is left, and keeps the
// trace.
func (cr *caseRun) teardown() error {
	var errs []string
	cr.events.stop()
	for _, p := range tagged(cr.tag) {
		if _, err := killPID(p.PID); err != nil && alive(p.PID) {
			errs = append(errs, err.Error())
		}
	}
	if left := tagged(cr.tag); len(left) > 0 {
		errs = append(errs, fmt.Sprintf("teardown left %d process(es): %v", len(left), left))
	}
	if cr.trace != nil {
		cr.phases = cr.trace.Events()
		if err := cr.trace.WriteJSONL(filepath.Join(cr.caseDir, "trace.jsonl")); err != nil {
			errs = append(errs, err.Error())
		}
		cr.trace.Close()
	}
	_ = os.RemoveAll(cr.dir)
	if len(errs) > 0 {
		return errors.New("teardown: " + strings.Join(errs, "; "))
	}
	return nil
}
