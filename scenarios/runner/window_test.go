package runner

import (
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/scenarios"
)

func TestWindowNsTakesOneVMsFirstCompleteWindow(t *testing.T) {
	w := [2]string{"agent.create.begin", "agent.create.ready"}
	evs := []failpoint.Event{
		{TsNs: 100, Point: "agent.create.ready", VM: "calib-0"}, // before any begin: ignored
		{TsNs: 200, Point: "agent.create.begin", VM: "calib-0"},
		{TsNs: 250, Point: "agent.create.begin", VM: "other"},
		{TsNs: 300, Point: "agent.create.ready", VM: "other"},
		{TsNs: 1200, Point: "agent.create.ready", VM: "calib-0"},
	}
	if ns, _ := windowNs(evs, w, "calib-0"); ns != 1000 {
		t.Errorf("calib-0 window = %d, want 1000", ns)
	}
	if ns, _ := windowNs(evs, w, ""); ns != 50 {
		t.Errorf("any-VM window = %d, want 50 (other's, complete first)", ns)
	}
	if ns, _ := windowNs(evs, w, "vm-a"); ns != 0 {
		t.Errorf("vm-a window = %d, want 0 (none)", ns)
	}
}

func TestReproOfFractionCase(t *testing.T) {
	r := &Runner{opts: Options{Scale: 0.05, Seed: 1, Backend: "fake"}}
	c, err := scenarios.CaseForFrac("sweep-save-stop", 0.35, "fake")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Repro(c), "vmchaos repro --scenario sweep-save-stop --offset 35% --seed 1 --time-scale 0.05 --backend fake"; got != want {
		t.Errorf("unresolved repro = %q, want %q", got, want)
	}
	// resolved as resolveFrac does: the absolute offset, unscaled
	c.Offset, c.HasOff = 952_000_000, true
	if got, want := r.Repro(c), "vmchaos repro --scenario sweep-save-stop --offset 952ms --seed 1 --time-scale 0.05 --backend fake"; got != want {
		t.Errorf("resolved repro = %q, want %q", got, want)
	}
	if got, want := r.triggerString(c, 0), "at agent.hibernate.dhcp-released@vm=vm-a + 47.6ms"; got != want {
		t.Errorf("trigger = %q, want %q", got, want)
	}
}
