package runner

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// agentDown is the window of a double fault's second fault (trigger
// scenarios.TriggerWhileDown): after the first fault took the agent down and
// before it is back.
const agentDown = "agent down"

// injectWhileDown fires every while-down fault once the first fault is in
// (first: its injection record) and judges it: it landed iff the agent was
// still down when it hit — no agent process started since the first fault,
// and a SIGSTOPped agent still frozen. A VMM killed after the agent came back
// is an ordinary VMM death, not the double fault the case is about.
func (cr *caseRun) injectWhileDown(ctx context.Context, first reports.Injection) []reports.Injection {
	var out []reports.Injection
	for _, f := range cr.s.Faults {
		if f.Trigger != scenarios.TriggerWhileDown {
			continue
		}
		rec := reports.Injection{Fault: f.Kind, Trigger: f.Trigger, RequestedNs: failpoint.Now(), IntendedPhase: agentDown}
		switch {
		case first.ActualNs == 0 || !first.Landed:
			rec.Err = "the first fault did not land: nothing to follow"
		case f.Kind == "sigkill-vmm":
			waitFrozen(ctx, first)
			v, ok, err := cr.st.VMByName(ctx, f.VM)
			if err != nil || !ok {
				rec.Err = fmt.Sprintf("no vm %s: %v", f.VM, err)
				break
			}
			rec.ActualNs = failpoint.Now()
			pid, err := cr.st.KillVMM(ctx, v.ID)
			rec.VictimPID = pid
			if err != nil {
				rec.Err = err.Error()
			}
			cr.mu.Lock()
			cr.kills = append(cr.kills, vmmKill{ID: v.ID, Name: f.VM, TsNs: rec.ActualNs})
			cr.mu.Unlock()
		default:
			in := cr.inj.Inject(ctx, cr.injFault(f))
			rec.Fault, rec.ActualNs, rec.Err, rec.VictimPID = in.Fault.String(), in.ActualNs, in.Err, in.VictimPID
		}
		if rec.ActualNs > 0 {
			var why string
			rec.LastPhase, why = judgeWhileDown(cr.st.Trace.Events(), first, rec.ActualNs, procState)
			if rec.Err == "" {
				rec.Err = why
			}
		}
		rec.Landed = rec.ActualNs > 0 && rec.Err == ""
		if rec.VictimPID > 0 && f.Kind != "sigkill-vmm" {
			cr.mu.Lock()
			cr.victims[rec.VictimPID] = true
			cr.mu.Unlock()
		}
		out = append(out, rec)
	}
	return out
}

// judgeWhileDown judges a while-down fault at tsNs against the agent-down
// window that first opened: the phase it hit and, when it did not land, why.
// evs is the trace in arrival order; state reads a pid's /proc state. An agent
// that was up is a miss; "no agent start in between" read from a trace that
// may have lost a datagram in between proves nothing (the lost one may be
// that start), so it does not land either.
func judgeWhileDown(evs []failpoint.Event, first reports.Injection, tsNs int64, state func(int) byte) (phase, why string) {
	if up := agentUp(evs, first, tsNs, state); up != "" {
		return "agent up", "after its window " + agentDown + " closed: " + up
	}
	if lost := traceLost(evs, first.ActualNs, tsNs); lost != "" {
		return agentDown, agentDown + " not proven: " + lost
	}
	return agentDown, ""
}

// agentUp says why the agent was not down at tsNs after the first fault
// ("" when it was): an agent process started in between, or the frozen
// agent was running again.
func agentUp(evs []failpoint.Event, first reports.Injection, tsNs int64, state func(int) byte) string {
	for _, e := range evs {
		if e.Point == "agent.started" && e.TsNs > first.ActualNs && e.TsNs <= tsNs {
			return fmt.Sprintf("agent pid %d started %s before", e.Pid, ms(tsNs-e.TsNs))
		}
	}
	if strings.HasPrefix(first.Fault, "sigstop") && first.VictimPID > 0 {
		if st := state(first.VictimPID); st != 'T' && st != 't' {
			return fmt.Sprintf("the frozen agent (pid %d) was in state %q, not stopped", first.VictimPID, st)
		}
	}
	return ""
}

// waitFrozen waits (bounded) until a SIGSTOPped agent is seen stopped: the
// stop is delivered when the process next returns to user space, so one in
// uninterruptible sleep (an fsync) still reads 'D' for a while.
func waitFrozen(ctx context.Context, first reports.Injection) {
	if !strings.HasPrefix(first.Fault, "sigstop") || first.VictimPID <= 0 {
		return
	}
	deadline := time.Now().Add(2 * time.Second)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if st := procState(first.VictimPID); st == 'T' || st == 't' || st == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// procState is the state letter of /proc/PID/stat (0 when unreadable).
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// the state follows the last ')' (comm may hold spaces and parens)
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2]
	}
	return 0
}

// firstInjection is the earliest delivered injection (zero when none was).
func firstInjection(injs []reports.Injection) reports.Injection {
	var first reports.Injection
	for _, in := range injs {
		if in.ActualNs > 0 && (first.ActualNs == 0 || in.ActualNs < first.ActualNs) {
			first = in
		}
	}
	return first
}
