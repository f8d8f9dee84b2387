package scenarios

import (
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
)

func kindNamed(t *testing.T, name string) MatrixKind {
	t.Helper()
	for _, k := range MatrixKinds {
		if k.Name == name {
			return k
		}
	}
	t.Fatalf("no matrix kind %s", name)
	return MatrixKind{}
}

func point(t *testing.T, name string) failpoint.Point {
	t.Helper()
	p, ok := failpoint.Lookup(name)
	if !ok {
		t.Fatalf("no point %s", name)
	}
	return p
}

// Each rule excludes exactly the class it names, and a cell no rule names
// stays applicable.
func TestMatrixExclusionRules(t *testing.T) {
	cell := func(op, pt, kind string, alive, indexed bool, child string) matrixCell {
		return matrixCell{Op: op, Point: point(t, pt), Kind: kindNamed(t, kind), VMMAlive: alive, Indexed: indexed, Child: child}
	}
	for _, tc := range []struct {
		name string
		c    matrixCell
		want string
	}{
		{"child at an agent point", cell(OpHibernate, "agent.hibernate.begin", "sigkill-child", true, true, ""), "no-child-in-flight"},
		{"child at a vmctl point", cell(OpSave, "snapshot.save.paused", "sigkill-child", true, true, "snapshot-save"), ""},
		{"vmm before launch", cell(OpCreate, "vm.clone.reserved", "sigkill-vmm", false, true, "vm-clone"), "no-vmm"},
		{"vmm double before launch", cell(OpCreate, "agent.create.begin", "vmm-kill-while-stopped", false, true, ""), "no-vmm"},
		{"vmm after launch", cell(OpCreate, "vm.clone.vmm-launched", "sigkill-vmm", true, true, "vm-clone"), ""},
		{"vmm of a tombstoned record", cell(OpDelete, "vm.rm.tombstoned", "sigkill-vmm", true, false, "vm-rm"), "record-tombstoned"},
		{"daemon at an agent point", cell(OpCreate, "agent.create.begin", "sigkill-daemon", false, true, ""), "daemon-at-vmctl-points"},
		{"daemon at a vmctl point", cell(OpCreate, "vm.clone.reserved", "sigkill-daemon", false, true, "vm-clone"), ""},
		{"park before an async VMM phase", matrixCell{Op: OpHibernate, Point: point(t, "ch.net.removed"), Kind: kindNamed(t, "stop"), VMMAlive: true, Indexed: true, AsyncNext: true}, "vmm-moves-on-async"},
		{"double at a vmctl point", cell(OpSave, "snapshot.save.paused", "vmm-kill-while-dead", true, true, "snapshot-save"), "double-at-agent-phases"},
		{"double at an agent point", cell(OpHibernate, "agent.hibernate.saved", "vmm-kill-while-frozen", true, true, ""), ""},
		{"restart in recovery at the goal", cell(OpCreate, "agent.create.ready", "restart-in-recovery", true, true, ""), "nothing-to-recover"},
		{"restart in recovery of a lifecycle write", cell(OpHibernate, "agent.hibernate.removed", "restart-in-recovery", false, false, ""), "nothing-to-recover"},
		{"restart in recovery of a save", cell(OpHibernate, "agent.hibernate.nic-dropped", "restart-in-recovery", true, true, ""), ""},
		{"vmm kill at the goal", cell(OpCreate, "agent.create.ready", "vmm-kill-while-dead", true, true, ""), ""},
		{"park hit earlier", matrixCell{Op: OpSave, Point: point(t, "ch.resume"), Kind: kindNamed(t, "stop"), VMMAlive: true, Indexed: true, HitInAct: true}, "park-hit-earlier"},
	} {
		if got := matrixExclusion(tc.c); got != tc.want {
			t.Errorf("%s: excluded by %q, want %q", tc.name, got, tc.want)
		}
	}
}

// The facts the rules read are derived from the paths: the VMM lives from
// vm.clone.vmm-launched to vm.rm.vmm-stopped, the child of a VMM point is
// the next vmctl verb, and an armed act's create hits ch.resume first.
func TestMatrixCellFacts(t *testing.T) {
	facts := map[string]matrixCell{}
	for _, c := range matrixCells() {
		facts[c.Op+" "+c.Point.Name] = c
	}
	for _, tc := range []struct {
		key            string
		alive, indexed bool
		child          string
		hit, async     bool
	}{
		{"create vm.clone.files-copied", false, true, "vm-clone", false, false},
		{"create ch.restore.begin", true, true, "vm-clone", false, false},
		{"save ch.snapshot.begin", true, true, "snapshot-save", false, false},
		{"save ch.resume", true, true, "snapshot-save", true, false},
		{"hibernate ch.eject.requested", true, true, "vm-net", false, true},
		{"hibernate ch.net.removed", true, true, "vm-net", false, true},
		{"hibernate ch.eject.acked", true, true, "vm-net", false, false},
		{"hibernate vm.rm.tombstoned", true, false, "vm-rm", false, false},
		{"hibernate agent.hibernate.removed", false, false, "", false, false},
		{"delete agent.delete.begin", true, true, "", false, false},
		{"wake agent.wake.pulled", false, true, "", false, false},
	} {
		c, ok := facts[tc.key]
		if !ok {
			t.Errorf("%s: not in the matrix", tc.key)
			continue
		}
		if c.VMMAlive != tc.alive || c.Indexed != tc.indexed || c.Child != tc.child || c.HitInAct != tc.hit || c.AsyncNext != tc.async {
			t.Errorf("%s: alive=%v indexed=%v child=%q hit=%v async=%v, want %v %v %q %v %v", tc.key, c.VMMAlive, c.Indexed, c.Child, c.HitInAct, c.AsyncNext,
				tc.alive, tc.indexed, tc.child, tc.hit, tc.async)
		}
	}
}

// Every applicable pair has a case (its own or the hand case it was folded
// into), every generated case is labelled matrix with a speed, and no
// excluded combination was generated.
func TestMatrixCoversEveryApplicablePair(t *testing.T) {
	byID := map[string]*Scenario{}
	for i := range Catalogue {
		byID[Catalogue[i].ID] = &Catalogue[i]
	}
	covered := map[MatrixPair]bool{}
	for _, s := range generated.scenarios {
		if !contains(s.Labels, "matrix") || (s.Speed != "slow" && s.Speed != "nightly") {
			t.Errorf("%s: labels %v speed %q", s.ID, s.Labels, s.Speed)
		}
		if byID[s.ID] == nil {
			t.Errorf("%s: generated but not in the catalogue", s.ID)
		}
		p, _, _ := strings.Cut(strings.TrimPrefix(s.Faults[0].Trigger, "park "), "@")
		fp, _ := failpoint.Lookup(p)
		covered[MatrixPair{Point: p, Proc: fp.Proc, Kind: CoverageKind(&s)}] = true
	}
	for _, f := range generated.folds {
		into := byID[f.Into]
		if into == nil {
			t.Errorf("%s folded into %s, which is not in the catalogue", f.Case, f.Into)
			continue
		}
		if foldKey(into) != f.Key {
			t.Errorf("%s folded into %s: keys %q and %q differ", f.Case, f.Into, f.Key, foldKey(into))
		}
		p, _, _ := strings.Cut(f.Key, " × ")
		fp, _ := failpoint.Lookup(p)
		covered[MatrixPair{Point: p, Proc: fp.Proc, Kind: CoverageKind(into)}] = true
	}
	if len(generated.pairs) < 300 {
		t.Errorf("only %d applicable pairs", len(generated.pairs))
	}
	for _, p := range generated.pairs {
		if !covered[p] {
			t.Errorf("applicable pair %v has no case", p)
		}
	}
	for p := range covered {
		for _, c := range matrixCells() {
			if c.Point.Name == p.Point && c.Kind.Name == p.Kind && matrixExclusion(c) == "" {
				goto ok
			}
		}
		t.Errorf("pair %v has a case but no applicable cell", p)
	ok:
	}
}

func TestCoverageKindOfHandCases(t *testing.T) {
	for id, want := range map[string]string{
		"s001-2-stop-in-pause-window":   "stop",
		"ch-kill9-mid-snapshot":         "sigkill-vmm",
		"s001-h-double-restart":         "", // restart + restart: no matrix kind
		"s001-3-pending-holder":         "", // two faults at one park
		"park-vm-clone-reserved-stop":   "stop",
		"s001-h-create-restart":         "restart",
		"s002-clone-sigkill-59ms-agent": "",
	} {
		s, ok := Lookup(id)
		if !ok {
			t.Fatalf("no scenario %s", id)
		}
		if got := CoverageKind(s); got != want {
			t.Errorf("%s: coverage kind %q, want %q", id, got, want)
		}
	}
	s, _ := Lookup("mx-hibernate-agent-hibernate-begin-vmm-kill-while-dead")
	if s == nil || CoverageKind(s) != "vmm-kill-while-dead" {
		t.Errorf("double fault case: %v", s)
	}
}

// A handful of matrix cases at most in the fast subset (CI time).
func TestMatrixStaysOutOfTheFastSubset(t *testing.T) {
	cases, err := Expand("fake")
	if err != nil {
		t.Fatal(err)
	}
	fast, _ := Filter(cases, "speed:fast && matrix")
	if len(fast) > 5 {
		t.Errorf("%d matrix cases in speed:fast", len(fast))
	}
}
