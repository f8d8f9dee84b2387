package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// TestVerdictTable is the verdict table of docs/scenarios.md, one row per
// situation: the verdict and the gate's exit code it leads to.
func TestVerdictTable(t *testing.T) {
	held := []reports.Invariant{{Name: "intent-goal", OK: true}, {Name: "fault-landed", OK: true}}
	violated := []reports.Invariant{{Name: "intent-goal", OK: false, Evidence: "vm-a failed"}, {Name: "fault-landed", OK: true}}
	crashLoop := append(append([]reports.Invariant{}, held...), reports.Invariant{Name: NoUnexpectedRestart, OK: false,
		Evidence: "the agent started 4 times after the fault(s), 1 expected from the injected faults"})
	untested := reports.Invariant{Name: "failed-left-by-itself", NotExercised: true, Evidence: "the transient failure never wrote failed"}
	goalMissed := productErr(GoalReached, fmt.Errorf("setup create vm-a: vm-a did not reach ready within 20s (last: failed boom)"))
	for _, tc := range []struct {
		name    string
		o       outcome
		verdict string
		exit    int
		reason  string
	}{
		{"every invariant held after a landed fault", outcome{Invariants: held, Converged: true}, reports.Pass, reports.GatePass, ""},
		{"an invariant violated", outcome{Invariants: violated}, reports.Fail, reports.GateFail, "violated: intent-goal (not converged"},
		{"an agent that crash-loops after its restart", outcome{Invariants: crashLoop, Converged: true}, reports.Fail, reports.GateFail, "violated: " + NoUnexpectedRestart},
		{"a goal the product did not reach (setup, act, after)", outcome{Err: goalMissed}, reports.Fail, reports.GateFail, "product: setup create vm-a"},
		{"the agent did not serve again after a restart", outcome{Err: productErr(ServedAfterRestart, errors.New("agent at x not answering"))}, reports.Fail, reports.GateFail, "product: agent at x not answering"},
		{"a fault fired after its window closed", outcome{NotLanded: []string{`sigkill-main landed in "agent.hibernate.saved": after its window agent.hibernate.dhcp-released..agent.hibernate.saved closed`}}, reports.Inconclusive, reports.GateInconclusive, "after its window agent.hibernate.dhcp-released..agent.hibernate.saved closed"},
		{"a window too short at the run's scale", outcome{Refusal: "window too short at time scale 0.05"}, reports.Inconclusive, reports.GateInconclusive, "window too short"},
		{"a fault that cannot be placed", outcome{Err: landingErr(errors.New("calibration calib-0: no a → b"))}, reports.Inconclusive, reports.GateInconclusive, "fault did not land as intended: calibration"},
		{"a host without a precondition", outcome{Err: &caseError{who: byPrecondition, err: errors.New("no /dev/kvm")}}, reports.Inconclusive, reports.GateInconclusive, "precondition: no /dev/kvm"},
		{"the harness broke", outcome{Err: harnessErr(errors.New("case stack: mkdir"))}, reports.Error, reports.GateInfra, "harness: case stack"},
		{"an unclassified error is the harness's", outcome{Err: errors.New("something")}, reports.Error, reports.GateInfra, "harness: something"},
		{"the run was interrupted", outcome{Err: productErr(GoalReached, fmt.Errorf("wait: %w", context.Canceled))}, reports.Error, reports.GateInfra, "harness:"},
		{"processes left behind after a pass", outcome{Invariants: held, Converged: true, TeardownErr: errors.New("pid 7 left")}, reports.Error, reports.GateInfra, "teardown: pid 7 left"},
		{"processes left behind do not hide a fail", outcome{Invariants: violated, TeardownErr: errors.New("pid 7 left")}, reports.Fail, reports.GateFail, "teardown: pid 7 left"},
		{"nothing checked is never a pass", outcome{Converged: true}, reports.Error, reports.GateInfra, "checked no invariant"},
		{"a landed fault whose failure never happened proves nothing", outcome{Invariants: append(append([]reports.Invariant{}, held...), untested), Converged: true}, reports.Inconclusive, reports.GateInconclusive, "path not exercised: failed-left-by-itself"},
		{"a path not exercised does not hide a fail", outcome{Invariants: append(append([]reports.Invariant{}, violated...), untested)}, reports.Fail, reports.GateFail, "violated: intent-goal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, reason := verdict(tc.o)
			if v != tc.verdict || !strings.Contains(reason, tc.reason) {
				t.Fatalf("verdict %s (%s), want %s containing %q", v, reason, tc.verdict, tc.reason)
			}
			g := reports.Gate(&reports.Results{Cases: []reports.Case{{ID: "c", Verdict: v, Reason: reason}}}, nil, reports.DefaultGateOptions())
			if g.Code != tc.exit {
				t.Fatalf("gate exit %d, want %d", g.Code, tc.exit)
			}
		})
	}
}

// TestJudgeLandingTable is the one landing judgement, for every kind of
// window a trigger has.
func TestJudgeLandingTable(t *testing.T) {
	ev := func(ts int64, pid int, point string) failpoint.Event {
		return failpoint.Event{TsNs: ts * int64(time.Millisecond), Pid: pid, Point: point}
	}
	evs := []failpoint.Event{
		ev(10, 1, "agent.started"),
		ev(100, 1, "agent.hibernate.begin"),
		ev(110, 1, "agent.hibernate.dhcp-released"),
		ev(115, 1, "agent.child.exec"), // bookkeeping: never a phase
		ev(120, 2, "snapshot.save.locked"),
		ev(150, 2, "snapshot.save.paused"),
		ev(160, 2, failpoint.SignalPoint), // an in-victim fault's announcement: never a phase
		ev(190, 2, "snapshot.save.finalized"),
		ev(200, 1, "agent.hibernate.saved"),
		ev(260, 1, "agent.hibernate.done"),
	}
	msNs := func(m int64) int64 { return m * int64(time.Millisecond) }
	save := phaseWindow{Open: "agent.hibernate.dhcp-released", Close: "agent.hibernate.saved"}
	for _, tc := range []struct {
		name   string
		w      phaseWindow
		from   int64
		fault  int64
		pid    int
		landed bool
		phase  string
		why    string
	}{
		{"inside a closed window", save, 110, 160, 0, true, "snapshot.save.paused", ""},
		{"after its window closed names the phase it hit", save, 110, 203, 0, false, "agent.hibernate.saved", "after its window agent.hibernate.dhcp-released..agent.hibernate.saved closed: the operation had reached agent.hibernate.saved 3.0ms before the fault"},
		{"before its window opened", phaseWindow{Open: "agent.hibernate.saved", Close: "agent.hibernate.pushed"}, 100, 195, 0, false, "snapshot.save.finalized", "before its window agent.hibernate.saved..agent.hibernate.pushed opened"},
		{"a parked process that had not moved on", phaseWindow{Open: "snapshot.save.paused"}, 150, 170, 2, true, "snapshot.save.paused", ""},
		{"a parked process that had moved on", phaseWindow{Open: "snapshot.save.paused"}, 150, 195, 2, false, "snapshot.save.finalized", "moved on to snapshot.save.finalized"},
		{"steady state with nothing in flight", phaseWindow{Steady: true}, 20, 90, 0, true, SteadyState, ""},
		{"steady state after an operation began", phaseWindow{Steady: true}, 20, 130, 0, false, "snapshot.save.locked", "meant for steady state, but agent.hibernate.begin began"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := judgeLanding(evs, tc.w, msNs(tc.from), msNs(tc.fault), tc.pid)
			if l.Landed != tc.landed || l.Phase != tc.phase || !strings.Contains(l.Why, tc.why) || (tc.landed && l.Why != "") {
				t.Fatalf("landed %v in %q (%s), want %v in %q (%q)", l.Landed, l.Phase, l.Why, tc.landed, tc.phase, tc.why)
			}
		})
	}
}

// TestParkedAgentReportedWedgedHasNotMovedOn: an agent parked at its own
// point past the wedge budget reports agent.wedged from its detector; the
// parked operation is still where it was parked.
func TestParkedAgentReportedWedgedHasNotMovedOn(t *testing.T) {
	ms := int64(time.Millisecond)
	evs := []failpoint.Event{
		{TsNs: 10 * ms, Pid: 1, Point: "agent.started"},
		{TsNs: 100 * ms, Pid: 1, Point: "agent.hibernate.begin"},
		{TsNs: 9100 * ms, Pid: 1, Point: "agent.wedged"},
	}
	l := judgeLanding(evs, phaseWindow{Open: "agent.hibernate.begin"}, 50*ms, 9500*ms, 1)
	if !l.Landed || l.Phase != "agent.hibernate.begin" {
		t.Fatalf("landed %v in %q (%s), want landed at the park agent.hibernate.begin", l.Landed, l.Phase, l.Why)
	}
}

// TestCrashLoopingAgentIsCounted: the agent starts the faults explain pass;
// one more (a crash loop after the restart) is the violation the verdict
// table turns into fail, exit 1.
func TestCrashLoopingAgentIsCounted(t *testing.T) {
	started := func(ts int64, pid int) failpoint.Event {
		return failpoint.Event{TsNs: ts, Pid: pid, Point: "agent.started"}
	}
	kill := []scenarios.Fault{{Kind: "sigkill-main"}, {Kind: "sigkill-child"}}
	once := []failpoint.Event{started(5, 1), started(50, 2)} // the armed agent (before armNs), its restart
	if s, want := unexpectedStarts(once, kill, 10, 40); len(s) != 1 || want != 1 {
		t.Errorf("one restart for one kill: %v of %d", s, want)
	}
	loop := append(once, started(60, 3), started(70, 4))
	if s, want := unexpectedStarts(loop, kill, 10, 40); len(s) != 3 || want != 1 {
		t.Errorf("crash loop: %v of %d, want 3 starts of 1 expected", s, want)
	}
	if _, want := unexpectedStarts(nil, []scenarios.Fault{{Kind: "restart"}, {Kind: "restart"}, {Kind: "stop", Unit: "daemon"}}, 0, 0); want != 2 {
		t.Errorf("two agent restarts and a daemon stop explain %d agent starts, want 2", want)
	}
}

// TestVerdictNamesItsCulprit: every verdict but a pass says who it blames
// (reports.Case.Culprit), and an invariant that failed only because the
// harness's own read failed is a harness error, never a pass, while a
// product violation beside it still fails the case.
func TestVerdictNamesItsCulprit(t *testing.T) {
	unread := reports.Invariant{Name: "ledger-clean", Evidence: "journal missing", HarnessError: true}
	broken := reports.Invariant{Name: "intent-goal", Evidence: "vm-a failed"}
	held := reports.Invariant{Name: "fault-landed", OK: true}
	stall := productErr(OperationProgressed, errors.New("the operation never reached park agent.create.cloned within 20s"))
	for _, tc := range []struct {
		name                 string
		o                    outcome
		verdict, who, reason string
	}{
		{"a pass blames nobody", outcome{Invariants: []reports.Invariant{held}, Converged: true}, reports.Pass, "", ""},
		{"a stalled operation off its goal", outcome{Err: stall, NotLanded: []string{"fault [0]: deadline"}}, reports.Fail, "product", "never reached park agent.create.cloned"},
		{"a fault that missed its window", outcome{NotLanded: []string{"late"}}, reports.Inconclusive, "landing", "late"},
		{"only the harness's own read failed", outcome{Invariants: []reports.Invariant{held, unread}, Converged: true}, reports.Error, "harness", "could not read the evidence of ledger-clean"},
		{"a product violation beside an unread one", outcome{Invariants: []reports.Invariant{unread, broken}, Converged: true}, reports.Fail, "product", "violated: intent-goal; unread: ledger-clean"},
		{"teardown left processes", outcome{Invariants: []reports.Invariant{held}, TeardownErr: errors.New("pid 7")}, reports.Error, "harness", "teardown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, reason, who := verdictOf(tc.o)
			if v != tc.verdict || who != tc.who || !strings.Contains(reason, tc.reason) {
				t.Fatalf("%s [%s] (%s), want %s [%s] containing %q", v, who, reason, tc.verdict, tc.who, tc.reason)
			}
		})
	}
}

// A failpoint kill or exit at one of the agent's own points is one expected
// agent start (the unit restarts it); at a vmctl or VMM point, or an error
// action, none.
func TestFailpointActionRestartsTheAgentOnce(t *testing.T) {
	for id, want := range map[string]int{
		"cov-create-agent-create-begin-failpoint-kill":  1,
		"cov-create-agent-create-begin-failpoint-exit":  1,
		"cov-create-agent-create-begin-failpoint-error": 0,
		"cov-create-vm-clone-reserved-failpoint-kill":   0,
		"cov-save-ch-pause-failpoint-kill":              0,
	} {
		s, ok := scenarios.Lookup(id)
		if !ok {
			t.Fatalf("no scenario %s", id)
		}
		if got := actionRestarts(s); got != want {
			t.Errorf("%s: %d expected agent starts, want %d", id, got, want)
		}
	}
}
