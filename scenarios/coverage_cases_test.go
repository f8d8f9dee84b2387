package scenarios

import (
	"strings"
	"testing"
)

// Every cell of the denominator is either targeted by a catalogue case
// (generated coverage cases included) or listed as a gap with a reason,
// never both and never neither: nightly's reach is said cell by cell.
func TestCoverageCasesPartitionTheDenominator(t *testing.T) {
	targeted := coverTargets(Catalogue)
	gaps := map[cellKeyS]string{}
	for _, g := range CoverageGaps() {
		if g.Why == "" {
			t.Errorf("gap %+v without a reason", g.Cell)
		}
		gaps[cellKeyS{g.Cell.Op, g.Cell.Point, g.Cell.Kind}] = g.Why
	}
	for _, c := range CoverageCells() {
		k := cellKeyS{c.Op, c.Point, c.Kind}
		switch why, gap := gaps[k]; {
		case targeted[k] && gap:
			t.Errorf("%+v both targeted and a gap (%s)", k, why)
		case !targeted[k] && !gap:
			t.Errorf("%+v neither targeted nor a gap", k)
		}
	}
}

// Each generated case targets exactly the cell it is named after, runs
// nightly only, and validates; none repeats a cell another case targets.
func TestCoverageCasesTargetTheirCell(t *testing.T) {
	var gen []Scenario
	for _, s := range Catalogue {
		if s.SeedRef == "coverage" {
			gen = append(gen, s)
		}
	}
	if len(gen) == 0 {
		t.Fatal("no coverage case generated")
	}
	rest := map[cellKeyS]bool{}
	for _, s := range Catalogue {
		if s.SeedRef != "coverage" {
			for k := range coverTargets([]Scenario{s}) {
				rest[k] = true
			}
		}
	}
	for _, s := range gen {
		if s.Speed != "nightly" {
			t.Errorf("%s: speed %s, want nightly", s.ID, s.Speed)
		}
		got := coverTargets([]Scenario{s})
		if len(got) != 1 {
			t.Errorf("%s targets %v, want one cell", s.ID, got)
			continue
		}
		for k := range got {
			want := "cov-" + k.Op + "-" + strings.ReplaceAll(k.Point, ".", "-") + "-" + k.Kind
			// the op is the cell's, or an agent operation whose landing
			// there falls back to the cell's context (viaOp)
			if s.ID != want || (s.Op != k.Op && viaOp[k.Point].Op != s.Op) {
				t.Errorf("%s (op %s) targets %+v, want id %s", s.ID, s.Op, k, want)
			}
			if rest[k] {
				t.Errorf("%s repeats %+v, which another case already targets", s.ID, k)
			}
		}
	}
}

// A failpoint coverage case fires once across processes (once=), and a
// VMM point of a save that the armed act's create hits first is parked (or
// acted on) at its second hit, never crediting the create's hit to the save.
func TestCoverageCaseShapes(t *testing.T) {
	s, why := coverageScenario(CoverageCell{Op: OpWake, Point: "vm.clone.reserved", Proc: "vmctl", Kind: CovFailpointKill})
	if why != "" || !strings.Contains(s.Env.Failpoints, "once=") || s.Faults[0].Kind != "failpoint" {
		t.Errorf("wake failpoint case: %q %+v", why, s)
	}
	if p, k := FailpointAction(&s); p != "vm.clone.reserved" || k != CovFailpointKill {
		t.Errorf("its action reads as %s × %s", p, k)
	}
	// the save's ch.resume is its VMM's second hit (the armed act's create
	// resumed it first): the action passes the first, the park holds the
	// second
	s, why = coverageScenario(CoverageCell{Op: OpSave, Point: "ch.resume", Proc: "fakech", Kind: CovFailpointKill})
	if why != "" || !strings.HasPrefix(s.Env.Failpoints, "ch.resume=1*sleep(0);ch.resume=kill(") || s.Faults[0].Trigger != "at ch.resume#2" {
		t.Errorf("save ch.resume failpoint case: %q %+v", why, s)
	}
	if p, k := FailpointAction(&s); p != "ch.resume" || k != CovFailpointKill {
		t.Errorf("its action reads as %s × %s", p, k)
	}
	for _, k := range []string{"sigkill-child", FaultPowerCut} {
		s, why = coverageScenario(CoverageCell{Op: OpSave, Point: "ch.resume", Proc: "fakech", Kind: k})
		if why != "" || s.Faults[0].Trigger != "park ch.resume#2" || len(s.Act) != len(armedHibernate) {
			t.Errorf("save ch.resume %s: %q %+v (want the armed act parked at the second hit)", k, why, s)
		}
	}
	s, why = coverageScenario(CoverageCell{Op: OpHibernate, Point: "ch.eject.acked", Proc: "fakech", Kind: FaultPowerCut})
	if why != "" || len(s.Act) != len(armedHibernate) || s.Faults[0].Trigger != "park ch.eject.acked" {
		t.Errorf("hibernate VMM point power cut: %q %+v (want the armed act)", why, s)
	}
	s, why = coverageScenario(CoverageCell{Op: OpClone, Point: "vm.clone.files-copied", Proc: "vmctl", Kind: "sigkill-daemon"})
	if why != "" || s.Act[0].Kind != StepDirectVmctl || s.Act[0].Args[1] != "clone" || !s.Env.Daemon || s.Faults[0].Unit != "daemon" {
		t.Errorf("clone daemon case: %q %+v", why, s)
	}
	if len(s.Setup) == 0 || s.Setup[0].Kind != StepCreate || s.Setup[0].VM != vmA {
		t.Errorf("clone case setup %+v: want the agent's bystander VM first (intent-goal's evidence)", s.Setup)
	}
}

// The shapes that closed gaps: the daemon's own context (its failpoints
// its alone, a repair to commit), sigkill-direct at a VMM point (a park of
// the VMM the harness's verb waits on; the save's in an armed act), the
// wedge of a create parked past its budget until the operator's retry.
func TestCoverageGapShapes(t *testing.T) {
	s, why := coverageScenario(CoverageCell{Op: "daemon", Point: "store.commit.before-rename", Proc: "vmctl", Kind: "sigkill-daemon"})
	if why != "" || !s.Env.DaemonArmed || !s.Env.Daemon || s.Faults[0].Trigger != "park store.commit.before-rename" ||
		s.Faults[0].Unit != "daemon" || s.Setup[len(s.Setup)-1].Kind != StepKillVMM || len(s.Targets) != 1 {
		t.Errorf("daemon commit case: %q %+v", why, s)
	}
	s, why = coverageScenario(CoverageCell{Op: "daemon", Point: "daemon.pass", Proc: "vmctl", Kind: CovFailpointExit})
	if why != "" || !s.Env.DaemonArmed || !strings.HasPrefix(s.Env.Failpoints, "daemon.pass=exit(3,once=") {
		t.Errorf("daemon pass action case: %q %+v", why, s)
	}
	s, why = coverageScenario(CoverageCell{Op: OpClone, Point: "ch.restore.begin", Proc: "fakech", Kind: FaultSigkillDirect})
	if why != "" || s.Faults[0].Kind != FaultSigkillDirect || s.Faults[0].Trigger != "park ch.restore.begin" || s.Act[len(s.Act)-1].Kind != StepDirectVmctl {
		t.Errorf("clone VMM point sigkill-direct: %q %+v", why, s)
	}
	for point, trig := range map[string]string{"ch.pause": "park ch.pause", "ch.resume": "park ch.resume#2"} {
		s, why = coverageScenario(CoverageCell{Op: OpSave, Point: point, Proc: "fakech", Kind: FaultSigkillDirect})
		if why != "" || s.Faults[0].Trigger != trig || len(s.Setup) != 0 || s.Act[0].Kind != StepCreate || s.Act[len(s.Act)-1].Kind != StepDirectSave {
			t.Errorf("save %s sigkill-direct: %q %+v (want the armed act, the operator's save last)", point, why, s)
		}
	}
	// the eject points: fakech tells the guest after them, so a park
	// holds the ack (the matrix leaves them to these cases)
	s, why = coverageScenario(CoverageCell{Op: OpHibernate, Point: "ch.eject.requested", Proc: "fakech", Kind: "sigkill-main"})
	if why != "" || s.Faults[0].Trigger != "park ch.eject.requested" || len(s.Act) != len(armedHibernate) {
		t.Errorf("hibernate eject park: %q %+v", why, s)
	}
	s, why = coverageScenario(CoverageCell{Op: "net", Point: "ch.net.removed", Proc: "fakech", Kind: FaultPowerCut})
	if why != "" || s.Faults[0].Kind != FaultPowerCut || s.Faults[0].Trigger != "park ch.net.removed" {
		t.Errorf("vm net eject power cut: %q %+v", why, s)
	}
	s, why = coverageScenario(CoverageCell{Op: "agent", Point: "agent.wedged", Proc: "nodeagent", Kind: "stop"})
	if why != "" || s.Op != OpCreate || len(s.After) != 1 || s.After[0].Kind != StepOperatorRetry || !s.Expect.FailedOK ||
		s.Faults[0].Trigger != "park agent.wedged" || s.Faults[0].VM != vmA {
		t.Errorf("agent.wedged case: %q %+v", why, s)
	}
}

// Nightly reaches every cell of the denominator: no gap is left. A cell
// that loses its case (or a new cell with no shape) fails here naming its
// reason; only a cell the host cannot run is marked (by the runner's
// preflight, CoverageSpec), never listed as a gap.
func TestCoverageNoGaps(t *testing.T) {
	for _, g := range CoverageGaps() {
		t.Errorf("gap %s %s × %s: %s", g.Cell.Op, g.Cell.Point, g.Cell.Kind, g.Why)
	}
}

// The shapes that closed the last gaps: the control plane sync's cells on
// the migration's source, the ledger's on the harness's own writer, and a
// guest that never acks an eject, whose cases expect the product's refusal.
func TestCoverageLastGapShapes(t *testing.T) {
	for _, kind := range []string{"stop", "restart-in-recovery", FaultPowerCut, CovFailpointKill} {
		s, why := coverageScenario(CoverageCell{Op: OpMigrate, Point: "agent.migrate.released", Proc: "nodeagent", Kind: kind})
		if why != "" || s.Env.Nodes != 2 || s.Faults[0].Node != "" || len(s.After) != 1 || s.After[0].Kind != StepAwaitMigrated ||
			s.After[0].Node != NodeB || s.Act[0].Kind != StepMigrate || s.Speed != "nightly" {
			t.Errorf("migrate %s: %q %+v (want node A's fault, the migration awaited on node B)", kind, why, s)
			continue
		}
		if got := CoverageKind(&s); got != kind {
			t.Errorf("migrate %s: coverage kind %q", kind, got)
		}
	}
	s, _ := coverageScenario(CoverageCell{Op: OpMigrate, Point: "agent.migrate.applied", Proc: "nodeagent", Kind: CovFailpointExit})
	if !strings.HasPrefix(s.Env.Failpoints, "agent.migrate.applied=exit(3,once=") || !strings.HasSuffix(s.Env.Failpoints, "@vm="+vmA) {
		t.Errorf("migrate action: %q (want the one-shot action for vm-a)", s.Env.Failpoints)
	}
	for _, kind := range []string{"sigkill-vmm", FaultPowerCut} {
		s, why := coverageScenario(CoverageCell{Op: "ledger", Point: "ledger.marker.written", Proc: "vmchaos", Kind: kind})
		if why != "" || s.Op != "ledger" || s.Faults[0].Trigger != "park ledger.marker.written" || !s.Expect.Ledger ||
			len(s.Act) != 1 || s.Act[0].Kind != StepLedgerWrite || len(s.Setup) == 0 || s.Setup[len(s.Setup)-1].Kind != StepLedgerWrite {
			t.Errorf("ledger %s: %q %+v (want a marker acked in the setup, the act's write parked, the ledger verified)", kind, why, s)
		}
	}
	s, why := coverageScenario(CoverageCell{Op: OpHibernate, Point: "ch.eject.acked", Proc: "fakech", Kind: CovFailpointError})
	if why != "" || len(s.Act) != len(armedHibernate) || s.After[0].Kind != StepExpectParked || s.After[0].Refused == "" || !s.Expect.FailedOK {
		t.Errorf("hibernate eject error: %q %+v (want the armed act and the refusal expected)", why, s)
	}
	s, why = coverageScenario(CoverageCell{Op: "net", Point: "ch.eject.acked", Proc: "fakech", Kind: CovFailpointError})
	if why != "" || s.Act[len(s.Act)-1].Refused == "" || !s.Act[len(s.Act)-1].Wait || s.Act[0].Args[1] != "clone" {
		t.Errorf("net eject error: %q %+v (want the VMM cloned armed, vm net's refusal expected)", why, s)
	}
}
