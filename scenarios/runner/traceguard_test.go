package runner

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/reports"
)

// seqEv is a datagram of (proc, pid) numbered seq at ts ms.
func seqEv(ts int64, proc string, pid int, seq uint64, point string) failpoint.Event {
	return failpoint.Event{TsNs: ts * int64(time.Millisecond), Proc: proc, Pid: pid, Seq: seq, Point: point}
}

func msNs(m int64) int64 { return m * int64(time.Millisecond) }

// TestJudgeLandingRefusesLossInItsWindow: a fault judged against a trace
// that lost a datagram between the arming and the fault is not landed (the
// lost one may be the opener, the closer or an operation's start), with the
// loss as the reason; a loss before the arming, or none, leaves the
// judgement as it was.
func TestJudgeLandingRefusesLossInItsWindow(t *testing.T) {
	save := phaseWindow{Open: "snapshot.save.locked", Close: "snapshot.save.finalized"}
	for _, tc := range []struct {
		name   string
		evs    []failpoint.Event
		w      phaseWindow
		landed bool
		why    string
	}{
		{"complete", []failpoint.Event{
			seqEv(100, "vmctl", 2, 1, "snapshot.save.locked"), seqEv(150, "vmctl", 2, 2, "snapshot.save.paused"),
			seqEv(300, "vmctl", 2, 3, "snapshot.save.finalized")}, save, true, ""},
		// #2 (sent between 100 and 250 ms) never arrived: it may have been
		// the closer, before the fault at 200 ms
		{"a gap in the window", []failpoint.Event{
			seqEv(100, "vmctl", 2, 1, "snapshot.save.locked"),
			seqEv(250, "vmctl", 2, 3, "snapshot.save.finalized")}, save, false, "vmctl pid 2: datagram #2 lost"},
		{"a gap before the arming", []failpoint.Event{
			seqEv(10, "nodeagent", 1, 1, "agent.started"), seqEv(40, "nodeagent", 1, 3, "agent.startup.reconciled"),
			seqEv(100, "vmctl", 2, 1, "snapshot.save.locked"), seqEv(300, "vmctl", 2, 2, "snapshot.save.finalized")}, save, true, ""},
		// the lost #1..#2 of pid 3 may be an operation's start before the fault
		{"steady state with a gap in the window", []failpoint.Event{
			seqEv(10, "nodeagent", 1, 1, "agent.started"),
			seqEv(180, "vmctl", 3, 3, "store.commit.after-rename")}, phaseWindow{Steady: true}, false, "vmctl pid 3: datagrams #1..#2 lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := guardedLanding(tc.evs, tc.evs, tc.w, msNs(50), msNs(200), 0)
			if l.Landed != tc.landed || !strings.Contains(l.Why, tc.why) {
				t.Fatalf("landed %v (%s), want %v (%q)", l.Landed, l.Why, tc.landed, tc.why)
			}
			if !tc.landed && !strings.Contains(l.Why, "not proven") {
				t.Fatalf("a loss must read as nothing proven: %s", l.Why)
			}
		})
	}
}

// TestWhileDownRefusesLossInItsWindow: "no agent started between the first
// fault and the second" read from a trace that lost a datagram in between
// proves nothing — the lost one may be that start — so the second fault
// does not land; a start that did arrive is the ordinary miss.
func TestWhileDownRefusesLossInItsWindow(t *testing.T) {
	first := reports.Injection{Fault: "sigkill-main", ActualNs: msNs(100), Landed: true}
	running := func(int) byte { return 'S' }
	for _, tc := range []struct {
		name  string
		evs   []failpoint.Event
		phase string
		why   string
	}{
		{"complete and down", []failpoint.Event{
			seqEv(10, "nodeagent", 1, 1, "agent.started"), seqEv(90, "nodeagent", 1, 2, "agent.hibernate.begin"),
			seqEv(300, "nodeagent", 5, 1, "agent.started")}, agentDown, ""},
		{"the agent came back", []failpoint.Event{
			seqEv(10, "nodeagent", 1, 1, "agent.started"), seqEv(150, "nodeagent", 5, 1, "agent.started")}, "agent up", "agent pid 5 started"},
		// pid 5's #1 (its agent.started, sent before 180 ms) never arrived
		{"a gap in the window", []failpoint.Event{
			seqEv(10, "nodeagent", 1, 1, "agent.started"),
			seqEv(180, "nodeagent", 5, 2, "agent.startup.reconciled")}, agentDown, "not proven"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			phase, why := judgeWhileDown(tc.evs, first, msNs(200), running)
			if phase != tc.phase || (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
				t.Fatalf("phase %q (%s), want %q (%q)", phase, why, tc.phase, tc.why)
			}
		})
	}
}

// TestNoUnexpectedRestartRefusesLossSinceArming: the count of agent starts
// after the arming is not judged from a trace that lost a datagram since
// then (the lost one may be a crash loop's start): the invariant does not
// pass and says nothing is proven. A loss before the arming, or none, leaves
// it to the count.
func TestNoUnexpectedRestartRefusesLossSinceArming(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "trace.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	armNs := msNs(50)
	for _, tc := range []struct {
		name    string
		evs     []failpoint.Event
		guarded bool
	}{
		{"complete", []failpoint.Event{seqEv(10, "nodeagent", 1, 1, "agent.started"), seqEv(60, "nodeagent", 1, 2, "agent.create.begin")}, false},
		{"a gap before the arming", []failpoint.Event{seqEv(10, "nodeagent", 1, 1, "agent.started"), seqEv(40, "nodeagent", 1, 3, "agent.create.begin")}, false},
		// pid 7's #1 (its agent.started) never arrived
		{"a gap after the arming", []failpoint.Event{seqEv(10, "nodeagent", 1, 1, "agent.started"), seqEv(90, "nodeagent", 7, 2, "agent.startup.reconciled")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, guarded := restartsGuard(tc.evs, sock, 0, "", armNs)
			if guarded != tc.guarded {
				t.Fatalf("guarded %v (%+v), want %v", guarded, inv, tc.guarded)
			}
			if guarded && (inv.OK || inv.Name != NoUnexpectedRestart || !strings.Contains(inv.Evidence, "nothing proven") ||
				!strings.Contains(inv.Evidence, "nodeagent pid 7: datagram #1 lost")) {
				t.Fatalf("guarded invariant %+v", inv)
			}
		})
	}
}

// TestGuardReadsArrivalOrder: a failpoint.signal datagram is stamped when
// its timer fired, before it took its number, so in stamp order it can come
// before a datagram numbered earlier. The guard reads the arrival order, in
// which the numbers of a process never go back: no loss, the fault lands.
func TestGuardReadsArrivalOrder(t *testing.T) {
	arrival := []failpoint.Event{
		seqEv(100, "vmctl", 2, 1, "snapshot.save.locked"),
		seqEv(160, "vmctl", 2, 2, "snapshot.save.paused"),
		seqEv(150, "vmctl", 2, 3, failpoint.SignalPoint),
		seqEv(300, "vmctl", 2, 4, "snapshot.save.finalized"),
	}
	sorted := []failpoint.Event{arrival[0], arrival[2], arrival[1], arrival[3]}
	w := phaseWindow{Open: "snapshot.save.locked", Close: "snapshot.save.finalized"}
	if l := guardedLanding(arrival, sorted, w, msNs(50), msNs(200), 0); !l.Landed {
		t.Fatalf("not landed: %s", l.Why)
	}
	if lost := traceLost(sorted, msNs(50), msNs(200)); lost == "" {
		t.Fatal("stamp order should read as a gap (why the guard must not use it)")
	}
}
