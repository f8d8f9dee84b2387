package scenarios

import (
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
)

func hasCell(op, point, kind string) bool {
	for _, c := range CoverageCells() {
		if c.Op == op && c.Point == point && c.Kind == kind {
			return true
		}
	}
	return false
}

// The applies rule, cell by cell: which kinds apply where.
func TestCoverageApplies(t *testing.T) {
	for _, tc := range []struct {
		op, point, kind string
		applies         bool
	}{
		{OpCreate, "vm.clone.vmm-launched", "sigkill-vmm", true},    // the VMM exists from its launch
		{OpCreate, "vm.clone.files-copied", "sigkill-vmm", false},   // not yet launched
		{OpDelete, "vm.rm.done", "sigkill-vmm", false},              // stopped and tombstoned
		{OpHibernate, "agent.hibernate.begin", "sigkill-vmm", true}, // running VM
		{OpCreate, "vm.clone.reserved", "sigkill-child", true},      // the agent's clone child in flight
		{OpCreate, "agent.create.begin", "sigkill-child", false},    // between children
		{OpClone, "vm.clone.reserved", "sigkill-child", false},      // a harness-run clone: no agent child
		{OpClone, "vm.clone.reserved", FaultSigkillDirect, true},    // ... but the harness's own vmctl
		{OpCreate, "vm.clone.reserved", FaultSigkillDirect, false},  // the agent's child is not harness-run
		{OpSave, "snapshot.save.paused", FaultSigkillDirect, true},  // save: hibernate's and the harness's
		{OpClone, "vm.clone.reserved", "sigkill-main", false},       // no agent operation in flight
		{"agent", "agent.startup.reconciled", "sigkill-main", true},
		{"vm-create", "vm.create.reserved", FaultPowerCut, true}, // power cut everywhere
		{"stop", "vm.stop.vmm-stopped", FaultPowerCut, true},
		{"ledger", "ledger.marker.written", FaultPowerCut, true},
		{"ledger", "ledger.marker.written", CovFailpointKill, false}, // the harness's point, no product action
		{OpCreate, "agent.create.begin", CovFailpointError, true},    // failpoint actions at the point itself
		{"stop", "ch.shutdown", CovFailpointExit, true},
		{OpCreate, "vm.clone.reserved", "sigkill-daemon", true},
		{OpCreate, "agent.create.begin", "sigkill-daemon", false},
		{OpCreate, "vm.clone.reserved", "vmm-kill-while-dead", false}, // doubles at agent phases
		{OpHibernate, "agent.hibernate.begin", "vmm-kill-while-dead", true},
		// a park cannot single these out (matrix rules), a timed fault can:
		// they are in the denominator
		{OpHibernate, "ch.eject.requested", "sigkill-child", true},
	} {
		if got := hasCell(tc.op, tc.point, tc.kind); got != tc.applies {
			t.Errorf("(%s, %s, %s) in the denominator: %v, want %v", tc.op, tc.point, tc.kind, got, tc.applies)
		}
	}
}

// Every failpoint of the catalogue is in the denominator, every column has
// cells, and every kind has a victim rule.
func TestCoverageDenominatorSpansTheCatalogue(t *testing.T) {
	points, kinds := map[string]bool{}, map[string]bool{}
	for _, c := range CoverageCells() {
		points[c.Point], kinds[c.Kind] = true, true
	}
	for _, p := range failpoint.Catalogue {
		if !points[p.Name] {
			t.Errorf("failpoint %s is in no cell", p.Name)
		}
	}
	victims := CoverageVictimProc()
	for _, k := range CoverageKindNames() {
		if !kinds[k] {
			t.Errorf("kind %s has no cell", k)
		}
		if _, ok := victims[k]; !ok && k != FaultPowerCut && k != CovFailpointKill && k != CovFailpointExit && k != CovFailpointError {
			t.Errorf("kind %s: no victim process", k)
		}
	}
	for _, pair := range MatrixPairs() {
		found := false
		for _, c := range CoverageCells() {
			found = found || (c.Point == pair.Point && c.Kind == pair.Kind)
		}
		if !found {
			t.Errorf("matrix pair %s × %s is not in the denominator", pair.Point, pair.Kind)
		}
	}
}

func TestFailpointActionAndCoverageKind(t *testing.T) {
	for _, tc := range []struct{ env, point, kind string }{
		{"agent.hibernate.dhcp-released=1*error(transient blip)@vm=a", "agent.hibernate.dhcp-released", CovFailpointError},
		{"vm.clone.reserved=pause;vm.clone.committed=exit(3)", "vm.clone.committed", CovFailpointExit},
		{"snapshot.save.paused=kill", "snapshot.save.paused", CovFailpointKill},
		{"vm.clone.reserved=sleep(5)", "", ""},
	} {
		s := &Scenario{Env: Env{Failpoints: tc.env}, Faults: []Fault{{Kind: "failpoint", Trigger: "at agent.failed"}}}
		p, k := FailpointAction(s)
		if p != tc.point || k != tc.kind || CoverageKind(s) != tc.kind {
			t.Errorf("%q: %s %s (coverage kind %q), want %s %s", tc.env, p, k, CoverageKind(s), tc.point, tc.kind)
		}
	}
	for kind, want := range map[string]string{FaultSigkillDirect: FaultSigkillDirect, FaultPowerCut: FaultPowerCut} {
		if got := CoverageKind(&Scenario{Faults: []Fault{{Kind: kind, Trigger: "park vm.clone.reserved"}}}); got != want {
			t.Errorf("%s: coverage kind %q", kind, got)
		}
	}
}
