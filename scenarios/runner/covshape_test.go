package runner

import (
	"testing"

	"github.com/vmchaos/vmchaos/scenarios"
)

// park POINT#N arms the N-th hit: the stack's spec passes the first N-1
// (a pass-through N* rule ahead of the pause; failpoint runs the first rule
// whose count is not spent), and a park of the first hit stays a bare
// pause. Before #N was honoured the spec was a bare pause either way, which
// parked the first hit: the create's resume instead of the save's.
func TestFailpointsParkNthHit(t *testing.T) {
	for _, c := range []struct{ trig, vm, want string }{
		{"park ch.resume#2", "", "ch.resume=1*sleep(0);ch.resume=pause"},
		{"park agent.hibernate.begin#3", "vm-a", "agent.hibernate.begin=2*sleep(0)@vm=vm-a;agent.hibernate.begin=pause@vm=vm-a"},
		{"park ch.pause", "", "ch.pause=pause"},
	} {
		s := scenarios.Scenario{ID: "t", Faults: []scenarios.Fault{{Kind: "sigkill-main", Trigger: c.trig, VM: c.vm}}}
		cr := &caseRun{r: &Runner{opts: Options{Scale: 1}}, s: &s, c: scenarios.Case{ID: "t", Scenario: &s}}
		if got := cr.failpoints(); got != c.want {
			t.Errorf("%s: spec %q, want %q", c.trig, got, c.want)
		}
	}
}

// The park's window opens at its point, whatever hit it parks.
func TestFaultWindowOfNthPark(t *testing.T) {
	s := scenarios.Scenario{Faults: []scenarios.Fault{{Kind: "stop", Trigger: "park ch.resume#2@vm=x"}}}
	cr := &caseRun{s: &s}
	if w := cr.faultWindow(0); w.Open != "ch.resume" {
		t.Errorf("window %+v, want it open at ch.resume", w)
	}
}

// sigkill-direct at a VMM point: the victim is the vmctl the harness
// started last (the verb waiting on the parked VMM), never an earlier one,
// and a vmctl gone before its pid was learnt is an error, not a guess.
func TestLastDirectIsTheVerbInFlight(t *testing.T) {
	cr := &caseRun{direct: map[string]*directProc{
		"direct-vm-clone-x": {pid: 1, self: 11, host: 21},
		"direct-vm-stop-x":  {pid: 2, self: 12, host: 22},
	}}
	if _, _, err := cr.lastDirectHost(); err == nil {
		t.Error("no vmctl started: want an error")
	}
	cr.lastDirect = "direct-vm-stop-x"
	if self, host, err := cr.lastDirectHost(); err != nil || self != 12 || host != 22 {
		t.Errorf("got %d %d %v, want the stop's 12 22", self, host, err)
	}
	cr.direct["direct-vm-stop-x"].self = -1
	if _, _, err := cr.lastDirectHost(); err == nil {
		t.Error("a vmctl gone before it was known: want an error")
	}
}
