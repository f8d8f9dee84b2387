package runner

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios/checker"
	"github.com/vmchaos/vmchaos/vmctl"
)

// history judges the invariants that are about the whole case rather than
// one poll: the ledger, counters across restarts, events, failed writes and
// when a save was refused.
func (cr *caseRun) history(ctx context.Context, converged bool, budget time.Duration) []reports.Invariant {
	var out []reports.Invariant
	ex := cr.s.Expect
	events := cr.st.Trace.Sorted()

	// Every judgement read from the trace refuses to pass when it is incomplete.
	bad, lastBad := cr.st.Trace.Malformed()
	in := &checker.Input{TraceLoss: checker.TraceLoss(cr.st.Trace.Path(), bad, lastBad, checker.Losses(cr.st.Trace.Lost()))}

	if ex.Ledger && converged {
		out = append(out, cr.verifyLedger(ctx, budget))
	}
	// the cut is compulsory where a guest writes and the case takes a
	// snapshot (issue 31 item 4), whether or not it verifies the ledger
	switch {
	case cr.cutCompulsory() && !converged:
		out = append(out, cr.cutNotJudged())
	case cr.cutCompulsory() || (ex.Ledger && converged):
		out = append(out, cr.judgeWorkload(ctx, budget)...)
	}

	if cr.scraper != nil {
		cr.scraper.ScrapeNow(ctx, failpoint.Now)
		samples := cr.scraper.Samples()
		out = append(out, checker.MetricsMonotonicInvariant(in, samples, cr.scraper.Failures(),
			checker.Restarts(events, cr.scraper.Since())))
		if len(ex.Metrics) > 0 {
			wants := make([]checker.MetricWant, len(ex.Metrics))
			for i, m := range ex.Metrics {
				wants[i] = checker.MetricWant{Series: m.Series, Min: m.Min, Max: m.Max}
			}
			out = append(out, checker.MetricExpectationsInvariant(samples, wants))
		}
		out = append(out, cr.seedPathInvariants(ctx, in, events, samples)...)
	}

	if ex.Events {
		out = append(out, cr.eventsObserved())
	}

	if ex.MACKept {
		out = append(out, checker.MACKeptInvariant(cr.macs, cr.macsErr, func(name string) ([]string, error) { return cr.vmMACs(ctx, name) }))
	}

	if ex.NoFailedWrite {
		out = append(out, checker.NoFailedWriteInvariant(in, events, cr.faultNs))
	}

	if ex.SaveRejectedBeforeCapture {
		out = append(out, checker.SaveRejectedBeforeCaptureInvariant(in, events, cr.faultNs, cr.victims))
	}

	if ex.FailedOK {
		n := 0
		for _, e := range events {
			if e.Point == "agent.failed" {
				n++
			}
		}
		// in a cluster the failure may be another node's (a fault on the
		// target's wake): its own trace counts, and the migration's
		// await saw it leave failed (the VM ready there)
		n += cr.otherNodesFailed()
		inv := reports.Invariant{Name: "failed-left-by-itself", OK: n > 0 && converged}
		switch {
		case n == 0:
			// not a fail: the product did not break, the case did not
			// test what it is about (judgeInvariants: inconclusive)
			inv.NotExercised = true
			inv.Evidence = "the transient failure never wrote failed: the path under test was not exercised"
		case converged:
			inv.Evidence = fmt.Sprintf("failed written %d time(s), left by the agent's own bounded retry (no operator action)", n)
		default:
			inv.Evidence = fmt.Sprintf("failed written %d time(s) and never left", n)
		}
		out = append(out, inv)
	}
	return out
}

// verifyLedger verifies every guest that carries markers. A guest whose
// intent ends hibernated is woken once more for the check (the ledger is
// verified after each wake); after a hibernate/wake cycle its RAM markers and
// boot id must have survived.
func (cr *caseRun) verifyLedger(ctx context.Context, budget time.Duration) reports.Invariant {
	var res []checker.LedgerResult
	names := make([]string, 0, len(cr.ledger))
	for n := range cr.ledger {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		fail := func(format string, a ...any) {
			res = append(res, checker.LedgerResult{Guest: name, Err: fmt.Errorf(format, a...)})
		}
		switch cr.goals[name] {
		case checker.GoalDeleted:
			continue
		case checker.GoalHibernated:
			if err := cr.put(ctx, name, nodeagent.Intent{Snapshot: baseSnapshot}); err != nil {
				fail("verification wake: %w", err)
				continue
			}
			if err := cr.waitGoal(ctx, name, budget); err != nil {
				fail("verification wake: %w", err)
				continue
			}
		}
		g, err := cr.guest(ctx, name)
		if err != nil {
			fail("%w", err)
			continue
		}
		vctx, cancel := context.WithTimeout(ctx, budget)
		v, err := cr.st.Ledger.Verify(vctx, g, ledger.VerifyOpts{ExpectRAM: cr.cycles[name], ColdBootAllowed: cr.coldBootReason()})
		cancel()
		if err != nil {
			fail("verify: %w", err)
			continue
		}
		cr.rc.Ledger = append(cr.rc.Ledger, reports.LedgerVerdict{Guest: v.Guest, Stable: v.Stable, Lost: v.Lost,
			InFlight: v.InFlight, Phantom: v.Phantom, LostNames: v.LostNames, PhantomNames: v.PhantomNames, OK: v.OK, Message: v.Message})
		res = append(res, checker.LedgerResult{Guest: name, Verdict: v})
	}
	return checker.LedgerCleanInvariant(res)
}

// eventsObserved: every VMM death must show up in the event stream as a
// change of that VM to stopped (seed 000).
func (cr *caseRun) eventsObserved() reports.Invariant {
	inv := reports.Invariant{Name: checker.EventsObserved, OK: true}
	o := cr.st.Observer
	if o == nil {
		inv.OK, inv.Evidence = false, "no event-stream observer ran"
		return inv
	}
	evs := o.Events()
	cr.mu.Lock()
	kills := append([]vmmKill(nil), cr.kills...)
	cr.mu.Unlock()
	if len(kills) == 0 {
		inv.OK, inv.Evidence = false, "no VMM was killed: nothing to observe"
		return inv
	}
	var ev []string
	for _, k := range kills {
		seen := false
		for _, e := range evs {
			if e.TsNs >= k.TsNs && e.VM.ID == k.ID && (e.Event == "MODIFIED" || e.Event == "DELETED") &&
				(e.VM.State == vmctl.StateStale || e.VM.State == vmctl.StateStopped || e.Event == "DELETED") {
				seen = true
				break
			}
		}
		if !seen {
			var got []string
			for _, e := range evs {
				if e.VM.ID == k.ID && e.TsNs >= k.TsNs {
					got = append(got, e.Event+" "+e.VM.State)
				}
			}
			ev = append(ev, fmt.Sprintf("VMM of %s (%s) killed; the event stream never reported it stopped (events after the kill: %v; %d events in all)", k.Name, k.ID, got, len(evs)))
		}
	}
	if len(ev) > 0 {
		inv.OK, inv.Evidence = false, strings.Join(ev, "; ")
	}
	return inv
}

// metricDeltas is last − first sample for every series.
func (cr *caseRun) metricDeltas() map[string]float64 {
	if cr.scraper == nil {
		return nil
	}
	s := cr.scraper.Samples()
	if len(s) == 0 {
		return nil
	}
	first, last := s[0], s[len(s)-1]
	out := map[string]float64{}
	for k, v := range last.Values {
		if !strings.HasPrefix(k, "nodeagent_") || strings.Contains(k, "_bucket") {
			continue
		}
		if d := v - first.Values[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// timeline is the case's story for the report: every phase hit, the
// faults, agent (re)starts and the convergence point.
func timeline(events []failpoint.Event, injs []reports.Injection, convergeMs float64, faultNs int64) []reports.TimelineEvent {
	var out []reports.TimelineEvent
	for _, e := range events {
		kind := "phase"
		if e.Point == "agent.started" {
			kind = "restart"
		}
		note := ""
		if e.Point == "agent.child.exec" {
			if raw, ok := e.Attrs["argv"].([]any); ok && len(raw) > 1 {
				var w []string
				for _, a := range raw[1:] {
					s, _ := a.(string)
					w = append(w, s)
				}
				note = strings.Join(w, " ")
			}
		}
		out = append(out, reports.TimelineEvent{TsNs: e.TsNs, Kind: kind, Proc: e.Proc, Pid: e.Pid, Point: e.Point, VM: e.VM, Note: note})
	}
	for _, in := range injs {
		if in.ActualNs > 0 {
			out = append(out, reports.TimelineEvent{TsNs: in.ActualNs, Kind: "fault", Point: in.LastPhase, Note: in.Fault + " (" + in.Trigger + ")"})
		}
	}
	if convergeMs >= 0 && faultNs > 0 {
		out = append(out, reports.TimelineEvent{TsNs: faultNs + int64(convergeMs*1e6), Kind: "converged"})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].TsNs < out[j].TsNs })
	const max = 600
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return out
}
