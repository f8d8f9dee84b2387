package checker

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	agentapi "github.com/vmchaos/vmchaos/nodeagent/api"
	"github.com/vmchaos/vmchaos/reports"
)

// Invariants of the seed paths of issue 34 (items 5 and 6): the post-clone
// marker's incarnation, a wedge visible outside the node, and honest
// evidence counting.
const (
	PostCloneMarkerBound   = "post-clone-marker-bound"
	WedgeVisible           = "wedge-visible"
	EvidenceLookupsCounted = "evidence-lookups-counted"
)

func init() {
	State = append(State, StateInvariant{PostCloneMarkerBound,
		"a post_clone marker belongs to one VM incarnation: an intent with no VM bound carries none",
		[]Source{SrcAgent}, Evidence{Asked: func(in *Input) bool { return len(in.Goals) > 0 }}, checkPostCloneMarker})
}

// checkPostCloneMarker: seed 001 held, "a post-clone marker dies with its VM
// incarnation (a hand-injected stale done was gone after the hibernate)".
func checkPostCloneMarker(_ *Input, p *Poll) []string {
	var ev []string
	for name, v := range p.Views {
		if v.VMID == "" && v.PostClone != "" {
			ev = append(ev, fmt.Sprintf("%s: post_clone %q with no VM bound (%s)", name, v.PostClone, describe(v)))
		}
	}
	sort.Strings(ev)
	return ev
}

// Stuck is one stretch of the trace in which an intent's operation was in
// flight and the agent hit none of its phase points: no durable progress.
type Stuck struct {
	VM, Op       string
	FromNs, ToNs int64
	Open         bool // still stuck when the case ended
}

func (s Stuck) String() string {
	end := "the next phase point"
	if s.Open {
		end = "the end of the case"
	}
	return fmt.Sprintf("%s: %s without a phase point for %v (until %s)", s.VM, s.Op, time.Duration(s.ToNs-s.FromNs).Round(time.Millisecond), end)
}

// WedgeSlack is the margin past an operation's budget before the checker
// requires the agent to have reported a wedge: the agent looks once per
// readiness tick and counts progress from its durable markers, which move a
// little before the phase point the trace shows. A safety net, not a timing
// assertion: only stretches longer than budget + slack are judged.
func WedgeSlack(budget time.Duration) time.Duration { return budget/4 + 500*time.Millisecond }

// terminalPoints end an operation: nothing is in flight after them.
var terminalPoints = map[string]bool{"agent.create.ready": true, "agent.wake.ready": true,
	"agent.hibernate.done": true, "agent.delete.done": true}

// phaseOp is the operation of an agent phase point ("" for none: the
// bookkeeping points, agent.started, the wedge report itself).
func phaseOp(point string) (string, bool) {
	if point == "agent.failed" {
		return "", true // an attempt's outcome: progress, operation unchanged
	}
	for _, op := range []string{"create", "wake", "hibernate", "delete"} {
		if strings.HasPrefix(point, "agent."+op+".") {
			return op, true
		}
	}
	return "", false
}

// StuckIntervals walks the trace and returns, per intent, every stretch in
// which its operation was in flight without a phase point for longer than
// its budget plus WedgeSlack. An agent start resets every clock (the new
// process has its own; the downtime before it is no wedge of either), and a
// stretch still open at endNs counts up to endNs.
func StuckIntervals(evs []failpoint.Event, budgets map[string]float64, endNs int64) []Stuck {
	type flight struct {
		op     string
		lastNs int64
	}
	inFlight := map[string]*flight{}
	var out []Stuck
	judge := func(vm string, f *flight, toNs int64, open bool) {
		b := time.Duration(budgets[f.op] * float64(time.Second))
		if b <= 0 {
			return // an operation without a published budget is not judged
		}
		if time.Duration(toNs-f.lastNs) > b+WedgeSlack(b) {
			out = append(out, Stuck{VM: vm, Op: f.op, FromNs: f.lastNs, ToNs: toNs, Open: open})
		}
	}
	for _, e := range evs {
		if e.Proc != "nodeagent" {
			continue
		}
		if e.Point == "agent.started" {
			for _, f := range inFlight {
				f.lastNs = e.TsNs
			}
			continue
		}
		op, ok := phaseOp(e.Point)
		if !ok || e.VM == "" {
			continue
		}
		f := inFlight[e.VM]
		if f != nil {
			judge(e.VM, f, e.TsNs, false)
		}
		if terminalPoints[e.Point] {
			delete(inFlight, e.VM)
			continue
		}
		if f == nil {
			f = &flight{op: "create"}
			inFlight[e.VM] = f
		}
		if op != "" {
			f.op = op
		}
		f.lastNs = e.TsNs
	}
	vms := make([]string, 0, len(inFlight))
	for vm := range inFlight {
		vms = append(vms, vm)
	}
	sort.Strings(vms)
	for _, vm := range vms {
		judge(vm, inFlight[vm], endNs, true)
	}
	return out
}

// WedgeVisibleInvariant: an intent stuck past its operation's budget shows
// outside the node (seed 001, observability): an event on the agent's API
// that names the VM and a reason, inside the stuck stretch (or up to a slack
// after it), and the persisted wedge counter holding at least one increment
// per such event. asked is false when the trace holds no stretch long enough
// to judge: then nothing is claimed. A source that could not be read fails.
func WedgeVisibleInvariant(in *Input, evs []failpoint.Event, api agentapi.Events, apiErr error, last *Sample, endNs int64) (inv reports.Invariant, asked bool) {
	if g := traceGuard(in); g != nil {
		return result(WedgeVisible, g), true
	}
	if apiErr != nil {
		return result(WedgeVisible, []string{"data source failed, nothing proven: agent events: " + apiErr.Error()}), true
	}
	stuck := StuckIntervals(evs, api.Budgets, endNs)
	if len(stuck) == 0 {
		return reports.Invariant{}, false
	}
	var ev, notes []string
	matched := map[int]bool{}
	for _, s := range stuck {
		slack := int64(WedgeSlack(time.Duration(api.Budgets[s.Op] * float64(time.Second))))
		found := -1
		for i, e := range api.Events {
			if e.Kind == agentapi.EventWedged && e.VM == s.VM && e.Reason != "" && e.MonoNs >= s.FromNs && e.MonoNs <= s.ToNs+slack {
				found = i
				break
			}
		}
		if found < 0 {
			ev = append(ev, s.String()+": no wedge event on the agent's API names it")
			continue
		}
		matched[found] = true
		notes = append(notes, fmt.Sprintf("%s: reported (%s)", s, api.Events[found].Reason))
	}
	if last == nil {
		ev = append(ev, "no metrics scrape: the wedge counter was not read, nothing proven")
	} else if n, ok := familySum(last, "nodeagent_wedged_total"); !ok && len(matched) > 0 {
		ev = append(ev, "nodeagent_wedged_total is missing from the last scrape: the wedge shows on no metric")
	} else if n < float64(len(matched)) {
		ev = append(ev, fmt.Sprintf("nodeagent_wedged_total is %g, fewer than the %d wedge event(s) that proved a stuck intent", n, len(matched)))
	}
	if len(ev) > 0 {
		return result(WedgeVisible, ev), true
	}
	return reports.Invariant{Name: WedgeVisible, OK: true, Evidence: strings.Join(notes, "; ")}, true
}

// familySum adds every series of a counter family in a sample; ok is false
// when the family has no series there.
func familySum(s *Sample, name string) (float64, bool) {
	var sum float64
	ok := false
	for k, v := range s.Values {
		if k == name || strings.HasPrefix(k, name+"{") {
			sum += v
			ok = true
		}
	}
	return sum, ok
}

// EvidenceLookupsInvariant: every hibernate-evidence lookup the agent made
// (agent.evidence.lookup, hit after the lookup was counted) is counted on
// nodeagent_hibernate_evidence_total (seed 001: the resume path's lookup was
// not counted at all). The lookups judged are those hit after the first
// scrape was read and before the last was sent, so each one's increment is
// inside the delta. asked is false when the case made no such lookup.
func EvidenceLookupsInvariant(in *Input, evs []failpoint.Event, samples []Sample) (inv reports.Invariant, asked bool) {
	const family = "nodeagent_hibernate_evidence_total"
	if g := traceGuard(in); g != nil {
		return result(EvidenceLookupsCounted, g), true
	}
	if len(samples) < 2 {
		return reports.Invariant{}, false
	}
	first, last := samples[0], samples[len(samples)-1]
	n := 0
	for _, e := range evs {
		if e.Point == "agent.evidence.lookup" && e.TsNs > first.TsNs && e.TsNs < last.StartNs {
			n++
		}
	}
	if n == 0 {
		return reports.Invariant{}, false
	}
	from, ok1 := familySum(&first, family)
	to, ok2 := familySum(&last, family)
	if !ok1 || !ok2 {
		return result(EvidenceLookupsCounted, []string{fmt.Sprintf("%s missing from the first (%v) or last (%v) scrape: %d lookup(s) unproven", family, ok1, ok2, n)}), true
	}
	if d := to - from; d < float64(n) {
		return result(EvidenceLookupsCounted, []string{fmt.Sprintf("%d evidence lookup(s) in the trace, %s went up by %g only", n, family, d)}), true
	}
	return reports.Invariant{Name: EvidenceLookupsCounted, OK: true,
		Evidence: fmt.Sprintf("%d lookup(s), counter delta %g", n, to-from)}, true
}
