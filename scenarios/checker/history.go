package checker

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/reports"
)

// The history invariants are judged once, at the end, over the whole case.
// Each is a pure function of what the case recorded, so each is table-tested
// with a violating, a missing-data and a clean fixture.

// TraceLoss is the completeness check of a trace: nil when every datagram
// the stack sent can be accounted for, otherwise why not. sockPath is the
// trace socket (a socket file gone means later datagrams were dropped by
// their senders); malformed is the count of datagrams that did not parse.
// lost is the trace's own loss report (Losses of (*injector.Trace).Lost:
// sequence gaps per emitting process), nil when it has none.
func TraceLoss(sockPath string, malformed int, lastBad string, lost error) error {
	var why []string
	if lost != nil {
		why = append(why, lost.Error())
	}
	if malformed > 0 {
		why = append(why, fmt.Sprintf("%d malformed datagram(s), last: %s", malformed, lastBad))
	}
	if fi, err := os.Lstat(sockPath); err != nil {
		why = append(why, fmt.Sprintf("trace socket: %v (senders drop datagrams without it)", err))
	} else if fi.Mode()&os.ModeSocket == 0 {
		why = append(why, fmt.Sprintf("trace socket %s is no longer a socket", sockPath))
	}
	if len(why) == 0 {
		return nil
	}
	return fmt.Errorf("trace incomplete: %s", strings.Join(why, "; "))
}

// Losses turns the trace's sequence gaps ((*injector.Trace).Lost) into the
// error TraceLoss takes: nil when there is none.
func Losses(ls []injector.Loss) error {
	if len(ls) == 0 {
		return nil
	}
	var w []string
	var n uint64
	for _, l := range ls {
		w = append(w, l.String())
		n += l.Count()
	}
	if len(w) > 4 {
		w = append(w[:4], fmt.Sprintf("… %d more gap(s)", len(w)-4))
	}
	return fmt.Errorf("%d datagram(s) lost: %s", n, strings.Join(w, "; "))
}

// traceGuard is the evidence of an invariant judged from an incomplete
// trace: a lost datagram may be the very violation.
func traceGuard(in *Input) []string {
	if in != nil && in.TraceLoss != nil {
		return []string{"judged from the trace, which is incomplete, nothing proven: " + in.TraceLoss.Error()}
	}
	return nil
}

// TraceGuard is traceGuard for an invariant judged outside the checker
// (the runner's no-unexpected-restart): with loss (a TraceLoss error) it
// returns invariant name failed with the guard's evidence, and true.
func TraceGuard(name string, loss error) (reports.Invariant, bool) {
	g := traceGuard(&Input{TraceLoss: loss})
	if g == nil {
		return reports.Invariant{}, false
	}
	return result(name, g), true
}

// NoFailedWriteInvariant: the agent never wrote lifecycle failed after the fault.
func NoFailedWriteInvariant(in *Input, events []failpoint.Event, faultNs int64) reports.Invariant {
	if g := traceGuard(in); g != nil {
		return result(NoFailedWrite, g)
	}
	var ev []string
	for _, e := range events {
		if e.Point == "agent.failed" && e.TsNs >= faultNs {
			ev = append(ev, fmt.Sprintf("%s at +%.0fms: %v", e.VM, float64(e.TsNs-faultNs)/1e6, e.Attrs["reason"]))
		}
	}
	if len(ev) > 0 {
		return reports.Invariant{Name: NoFailedWrite, Evidence: fmt.Sprintf("lifecycle failed written %d time(s) after the fault: %s", len(ev), strings.Join(ev, "; "))}
	}
	return reports.Invariant{Name: NoFailedWrite, OK: true}
}

// SaveRejectedBeforeCaptureInvariant: a snapshot save the agent started
// after the fault and that failed must not have paused and captured the VM
// first — the name clash must be found by the preflight (seed 001 #3,
// manager side). victims are the pids the harness killed itself.
func SaveRejectedBeforeCaptureInvariant(in *Input, events []failpoint.Event, faultNs int64, victims map[int]bool) reports.Invariant {
	if g := traceGuard(in); g != nil {
		return result(SaveRejectedBeforeCapture, g)
	}
	captured := map[int]int64{}
	for _, e := range events {
		if e.Proc == "vmctl" && e.Point == "snapshot.save.captured" && e.TsNs >= faultNs {
			captured[e.Pid] = e.TsNs
		}
	}
	var ev []string
	saves, attempts := 0, 0
	for _, e := range events {
		if e.Point != "agent.child.exit" || e.TsNs < faultNs {
			continue
		}
		pid, _ := e.Attrs["child_pid"].(float64)
		code, _ := e.Attrs["code"].(float64)
		if isSnapshotSave(e.Attrs["argv"]) {
			attempts++
		}
		if ts, ok := captured[int(pid)]; ok {
			saves++
			if code != 0 && !victims[int(pid)] {
				ev = append(ev, fmt.Sprintf("snapshot save pid %d captured the VM at +%.0fms and then failed (exit %g): refused after the full capture", int(pid), float64(ts-faultNs)/1e6, code))
			}
		}
	}
	if len(ev) > 0 {
		return result(SaveRejectedBeforeCapture, ev)
	}
	// With no save after the fault there is nothing the check could have
	// caught: missing data is not a pass (architecture §9).
	if attempts == 0 && saves == 0 {
		return reports.Invariant{Name: SaveRejectedBeforeCapture,
			Evidence: "no snapshot save ran after the fault (no agent.child.exit of a snapshot save in the trace): nothing to judge"}
	}
	return reports.Invariant{Name: SaveRejectedBeforeCapture, OK: true,
		Evidence: fmt.Sprintf("%d snapshot save(s) after the fault, %d completed capture(s), none refused after its capture", attempts, saves)}
}

// isSnapshotSave reports whether a traced child argv (a JSON array) is a
// `snapshot save` call of the manager.
func isSnapshotSave(argv any) bool {
	words, _ := argv.([]any)
	for i := 0; i+1 < len(words); i++ {
		if words[i] == "snapshot" && words[i+1] == "save" {
			return true
		}
	}
	return false
}

// ScrapeFailure is one scrape that returned no sample.
type ScrapeFailure struct {
	TsNs int64
	Err  string
	// Down: the endpoint did not answer at all (nothing listening: the
	// agent is between two lives), as opposed to answering wrong.
	Down bool
}

// Restarts are the CLOCK_MONOTONIC times the agent started (agent.started)
// after since.
func Restarts(events []failpoint.Event, since int64) []int64 {
	var out []int64
	for _, e := range events {
		if e.Point == "agent.started" && e.TsNs > since {
			out = append(out, e.TsNs)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// MetricsMonotonicInvariant: no counter went backwards between consecutive
// samples, and the samples prove it across every restart of the agent: one
// served before the restart and one requested after it. An endpoint that
// answered wrong (status, body) fails; one that was down is a gap, and a gap
// around a restart leaves that restart unproven, which fails too. restarts
// come from the trace, so an incomplete trace proves nothing either.
func MetricsMonotonicInvariant(in *Input, samples []Sample, failures []ScrapeFailure, restarts []int64) reports.Invariant {
	if g := traceGuard(in); g != nil {
		return result(MetricsMonotonic, g)
	}
	var ev []string
	if len(samples) < 2 {
		ev = append(ev, fmt.Sprintf("only %d scrape(s): nothing proven", len(samples)))
	}
	for _, f := range failures {
		if !f.Down {
			ev = append(ev, fmt.Sprintf("scrape at %d failed: %s", f.TsNs, f.Err))
		}
	}
	for _, r := range restarts {
		before, after := false, false
		for _, s := range samples {
			before = before || s.TsNs < r
			after = after || s.StartNs > r
		}
		if !before || !after {
			ev = append(ev, fmt.Sprintf("agent restart at %d has no sample before (%v) and after (%v) it: counters across it unproven", r, before, after))
		}
	}
	ev = append(ev, Backwards(samples)...)
	if len(ev) > 0 {
		return result(MetricsMonotonic, ev)
	}
	return reports.Invariant{Name: MetricsMonotonic, OK: true,
		Evidence: fmt.Sprintf("%d samples across %d restart(s)", len(samples), len(restarts))}
}

// LedgerResult is the ledger verification of one guest: its verdict, or the
// error that kept it from being read.
type LedgerResult struct {
	Guest   string
	Verdict ledger.Verdict
	Err     error
}

// LedgerCleanInvariant: every guest's ledger verdict is clean, and was
// actually taken: an SSH error is no verdict, a verdict needs an acked
// marker of the guest (ledger.Classify), and a RAM check without a journaled
// boot id baseline cannot tell a fresh boot from a restored one. A guest
// whose journal the harness could not read (ledger.ErrJournal) proves
// nothing: when that is all that is wrong, the invariant is the harness's
// error (HarnessError), not the product's fail.
func LedgerCleanInvariant(results []LedgerResult) reports.Invariant {
	if len(results) == 0 {
		return result(LedgerClean, []string{"no guest was verified: the ledger proved nothing"})
	}
	var ev []string
	unread := 0
	for _, r := range results {
		switch v := r.Verdict; {
		case r.Err != nil && errors.Is(r.Err, ledger.ErrJournal):
			unread++
			ev = append(ev, fmt.Sprintf("%s: %v", r.Guest, r.Err))
		case r.Err != nil:
			ev = append(ev, fmt.Sprintf("%s: %v", r.Guest, r.Err))
		case v.RAMChecked && v.BootIDBefore == "":
			ev = append(ev, fmt.Sprintf("%s: RAM and boot id checked without a journaled boot id baseline: a fresh boot cannot be told from a restore", r.Guest))
		case v.RAMChecked && v.BootIDAfter == "":
			ev = append(ev, fmt.Sprintf("%s: the guest reported no boot id", r.Guest))
		case !v.OK || v.Stable == 0:
			ev = append(ev, fmt.Sprintf("%s: %s", r.Guest, v.Message))
		}
	}
	if len(ev) > 0 {
		inv := result(LedgerClean, ev)
		inv.HarnessError = unread == len(ev)
		return inv
	}
	return reports.Invariant{Name: LedgerClean, OK: true, Evidence: fmt.Sprintf("%d guest(s) verified", len(results))}
}

// MetricWant is one expected delta of a series over a case (the catalogue's
// Expect.Metrics): at least Min and, with Max ≥ 0, at most Max.
type MetricWant struct {
	Series   string
	Min, Max float64
}

// MetricExpectationsInvariant judges the deltas of the wanted series between
// the first and the last sample. A series the last sample does not have was
// never exported (or is misnamed): that is missing data, never a delta of 0.
// A labelled counter child absent from the first sample only (a fresh stack
// exports it from its first increment on) starts from 0, and the evidence
// says so; any other series must be in both.
func MetricExpectationsInvariant(samples []Sample, wants []MetricWant) reports.Invariant {
	if len(samples) < 2 {
		return result(MetricExpectations, []string{fmt.Sprintf("only %d scrape(s): no delta to judge", len(samples))})
	}
	first, last := samples[0], samples[len(samples)-1]
	var ev, notes []string
	for _, w := range wants {
		key := Canonical(w.Series)
		to, ok := last.Values[key]
		if !ok {
			ev = append(ev, fmt.Sprintf("%s: missing from the last scrape (never exported): nothing proven", w.Series))
			continue
		}
		from, ok := first.Values[key]
		if !ok {
			if _, typ := family(key, last.Types); typ != "counter" || !strings.Contains(key, "{") {
				ev = append(ev, fmt.Sprintf("%s: missing from the first scrape and not a labelled counter: no baseline", w.Series))
				continue
			}
			notes = append(notes, w.Series+" first exported during the case (from 0)")
		}
		d := to - from
		switch {
		case d < w.Min:
			ev = append(ev, fmt.Sprintf("%s delta %g, want ≥ %g", w.Series, d, w.Min))
		case w.Max >= 0 && d > w.Max:
			ev = append(ev, fmt.Sprintf("%s delta %g, want in [%g, %g]", w.Series, d, w.Min, w.Max))
		default:
			notes = append(notes, fmt.Sprintf("%s delta %g", w.Series, d))
		}
	}
	if len(wants) == 0 {
		ev = append(ev, "no series expected: nothing to judge")
	}
	if len(ev) > 0 {
		return result(MetricExpectations, ev)
	}
	return reports.Invariant{Name: MetricExpectations, OK: true, Evidence: strings.Join(notes, "; ")}
}
