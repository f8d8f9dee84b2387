package runner

import (
	"testing"

	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/stack"
)

// A real guest's clock is not the trace clock: the real backend is judged
// by the host's receipt times, the fake one by the guest's ack times.
func TestOnlyTheFakeGuestClockIsTheTraceClock(t *testing.T) {
	for backend, want := range map[string]bool{stack.BackendFake: true, "": true, stack.BackendReal: false} {
		if got := guestClockOn(backend); got != want {
			t.Errorf("backend %q: guest clock %v, want %v", backend, got, want)
		}
	}
	acks := []ledger.WorkloadAck{{Seq: 9, HostNs: 50}, {Seq: 10, HostNs: 120}, {Seq: 11, HostNs: 130}, {Seq: 12, HostNs: 140}}
	// resume at 100, the clone's cut at 10: seq 10 arrived late but is
	// inside the cut, 11 and 12 are the source going on
	if n := wentOnPast(acks, 100, 10); n != 2 {
		t.Fatalf("went on past the cut: %d, want 2", n)
	}
	if n := wentOnPast(acks, 200, 10); n != 0 {
		t.Fatalf("nothing was received after the resume, got %d", n)
	}
}

// The way the real backend is judged (no guest clock) passes a consistent
// save on the fake stack: the cut is judged by host receipt times and the
// source's going on by its acks past the cut.
func TestConsistentSavePassesWithoutTheGuestClock(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts the whole stack; run without -short")
	}
	old := guestClockOn
	t.Cleanup(func() { guestClockOn = old })
	guestClockOn = func(string) bool { return false }
	c, err := scenarios.CaseFor("wl-save-held-captured", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	rc := runOneCase(t, c)
	inv, ok := cutInvariant(rc)
	if rc.Verdict != reports.Pass || !ok || !inv.OK || rc.Workload == nil || len(rc.Workload.Cuts) != 1 {
		t.Fatalf("%s (%s), cut invariant %+v", rc.Verdict, rc.Reason, inv)
	}
	cut := rc.Workload.Cuts[0]
	if cut.AckedBeforePause == 0 || cut.Judged == 0 {
		t.Fatalf("nothing judged: %+v", cut)
	}
	t.Logf("host clock: %s; %s", inv.Evidence, cut.Message)
}
