package checker

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	agentapi "github.com/vmchaos/vmchaos/nodeagent/api"
)

const sec = int64(time.Second)

func agentEv(ts int64, point, vm string) failpoint.Event {
	return failpoint.Event{TsNs: ts, Proc: "nodeagent", Point: point, VM: vm}
}

// a create that failed at 1 s and made no progress until 10 s: 9 s stuck,
// past a 3 s budget plus its slack.
var wedgedTrace = []failpoint.Event{
	agentEv(0, "agent.create.begin", "a"),
	agentEv(1*sec, "agent.failed", "a"),
	agentEv(10*sec, "agent.create.ready", "a"),
}

var budgets = map[string]float64{"create": 3, "wake": 3, "hibernate": 4, "delete": 2}

func TestStuckIntervalsFindOnlyStretchesPastTheBudget(t *testing.T) {
	cases := []struct {
		name string
		evs  []failpoint.Event
		end  int64
		want []string
	}{
		{"stuck between two phase points", wedgedTrace, 20 * sec, []string{"a: create without a phase point for 9s"}},
		{"within the budget and its slack", []failpoint.Event{agentEv(0, "agent.create.begin", "a"), agentEv(4*sec, "agent.create.ready", "a")}, 20 * sec, nil},
		{"still in flight at the end", []failpoint.Event{agentEv(0, "agent.hibernate.begin", "b")}, 9 * sec, []string{"b: hibernate without a phase point for 9s (until the end of the case)"}},
		{"an agent start resets the clock", []failpoint.Event{agentEv(0, "agent.create.begin", "a"), {TsNs: 5 * sec, Proc: "nodeagent", Point: "agent.started"},
			agentEv(8*sec, "agent.create.ready", "a")}, 20 * sec, nil},
		{"child execs are no progress", []failpoint.Event{agentEv(0, "agent.create.begin", "a"), agentEv(2*sec, "agent.child.exec", "a"),
			agentEv(7*sec, "agent.child.exec", "a")}, 9 * sec, []string{"a: create without a phase point for 9s"}},
		{"nothing in flight after a terminal point", []failpoint.Event{agentEv(0, "agent.create.ready", "a")}, 60 * sec, nil},
	}
	for _, c := range cases {
		got := StuckIntervals(c.evs, budgets, c.end)
		if len(got) != len(c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
			continue
		}
		for i := range got {
			if !strings.Contains(got[i].String(), c.want[i]) {
				t.Errorf("%s: got %q, want it to contain %q", c.name, got[i], c.want[i])
			}
		}
	}
}

func TestWedgeVisibleInvariant(t *testing.T) {
	event := agentapi.Event{Kind: agentapi.EventWedged, MonoNs: 5 * sec, VM: "a", Op: "create", Reason: "clone"}
	counted := &Sample{Values: map[string]float64{`nodeagent_wedged_total{op="create",reason="clone"}`: 1}}
	cases := []struct {
		name   string
		in     *Input
		api    agentapi.Events
		apiErr error
		last   *Sample
		ok     bool
		want   string
	}{
		{"reported and counted", &Input{}, agentapi.Events{Budgets: budgets, Events: []agentapi.Event{event}}, nil, counted, true, "reported (clone)"},
		{"no event names it", &Input{}, agentapi.Events{Budgets: budgets}, nil, counted, false, "no wedge event on the agent's API names it"},
		{"an event of another VM", &Input{}, agentapi.Events{Budgets: budgets, Events: []agentapi.Event{{Kind: agentapi.EventWedged, MonoNs: 5 * sec, VM: "x", Reason: "r"}}}, nil, counted, false, "no wedge event"},
		{"an event without a reason", &Input{}, agentapi.Events{Budgets: budgets, Events: []agentapi.Event{{Kind: agentapi.EventWedged, MonoNs: 5 * sec, VM: "a"}}}, nil, counted, false, "no wedge event"},
		{"an event before the stretch", &Input{}, agentapi.Events{Budgets: budgets, Events: []agentapi.Event{{Kind: agentapi.EventWedged, MonoNs: 0, VM: "a", Reason: "r"}}}, nil, counted, false, "no wedge event"},
		{"no metric", &Input{}, agentapi.Events{Budgets: budgets, Events: []agentapi.Event{event}}, nil, &Sample{Values: map[string]float64{}}, false, "missing from the last scrape"},
		{"no scrape", &Input{}, agentapi.Events{Budgets: budgets, Events: []agentapi.Event{event}}, nil, nil, false, "no metrics scrape"},
		{"events unreadable", &Input{}, agentapi.Events{}, errors.New("connection refused"), counted, false, "data source failed"},
		{"trace incomplete", &Input{TraceLoss: errors.New("3 datagram(s) lost")}, agentapi.Events{Budgets: budgets, Events: []agentapi.Event{event}}, nil, counted, false, "trace, which is incomplete"},
	}
	for _, c := range cases {
		inv, asked := WedgeVisibleInvariant(c.in, wedgedTrace, c.api, c.apiErr, c.last, 20*sec)
		if !asked || inv.Name != WedgeVisible || inv.OK != c.ok || !strings.Contains(inv.Evidence, c.want) {
			t.Errorf("%s: asked %v %+v, want ok=%v with %q", c.name, asked, inv, c.ok, c.want)
		}
	}
	// nothing stuck: nothing claimed
	if inv, asked := WedgeVisibleInvariant(&Input{}, wedgedTrace[:1], agentapi.Events{Budgets: budgets}, nil, counted, 2*sec); asked {
		t.Errorf("nothing stuck, yet judged: %+v", inv)
	}
}

func TestEvidenceLookupsInvariant(t *testing.T) {
	lookup := failpoint.Event{TsNs: 5, Point: "agent.evidence.lookup", VM: "a"}
	smp := func(start, ts int64, v float64) Sample {
		return Sample{StartNs: start, TsNs: ts, Values: map[string]float64{`nodeagent_hibernate_evidence_total{verdict="none"}`: v, `nodeagent_hibernate_evidence_total{verdict="registry"}`: 0}}
	}
	cases := []struct {
		name    string
		samples []Sample
		ok      bool
		want    string
	}{
		{"counted", []Sample{smp(0, 1, 2), smp(9, 10, 3)}, true, "1 lookup(s), counter delta 1"},
		{"not counted", []Sample{smp(0, 1, 2), smp(9, 10, 2)}, false, "went up by 0 only"},
		{"family missing", []Sample{smp(0, 1, 2), {StartNs: 9, TsNs: 10, Values: map[string]float64{}}}, false, "missing from the first (true) or last (false)"},
	}
	for _, c := range cases {
		inv, asked := EvidenceLookupsInvariant(&Input{}, []failpoint.Event{lookup}, c.samples)
		if !asked || inv.OK != c.ok || !strings.Contains(inv.Evidence, c.want) {
			t.Errorf("%s: asked %v %+v, want ok=%v with %q", c.name, asked, inv, c.ok, c.want)
		}
	}
	// a lookup before the first scrape was read is the setup's: not judged
	if inv, asked := EvidenceLookupsInvariant(&Input{}, []failpoint.Event{lookup}, []Sample{smp(0, 6, 2), smp(9, 10, 2)}); asked {
		t.Errorf("a lookup before the baseline was judged: %+v", inv)
	}
	if inv, asked := EvidenceLookupsInvariant(&Input{TraceLoss: errors.New("lost")}, []failpoint.Event{lookup}, []Sample{smp(0, 1, 2), smp(9, 10, 3)}); !asked || inv.OK {
		t.Errorf("an incomplete trace passed: %+v", inv)
	}
}
