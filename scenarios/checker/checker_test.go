package checker

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/scenarios/stack"
	"github.com/vmchaos/vmchaos/vmctl"
	"golang.org/x/sys/unix"
)

func evidence(t *testing.T, name string, in *Input, p *Poll) []string {
	t.Helper()
	for _, inv := range State {
		if inv.Name == name {
			return inv.Check(in, p)
		}
	}
	t.Fatalf("no invariant %s", name)
	return nil
}

func TestIntentGoalNamesWhatIsMissing(t *testing.T) {
	in := &Input{Goals: map[string]string{"a": GoalReady, "b": GoalHibernated, "c": GoalDeleted}}
	p := &Poll{
		Views: map[string]nodeagent.VMView{
			"a": {Name: "a", Status: nodeagent.Status{Lifecycle: "ready", VMID: "A1"}},
			"b": {Name: "b", Status: nodeagent.Status{Lifecycle: "failed", Message: "boom"}},
		},
		VMs:  []vmctl.VM{{ID: "A1", Name: "a", State: vmctl.StateRunning}},
		VMMs: map[string]stack.Proc{"A1": {PID: 1}},
	}
	ev := evidence(t, IntentGoal, in, p)
	if len(ev) != 1 || !strings.Contains(ev[0], "b: want hibernated, is failed: boom") {
		t.Fatalf("evidence = %q", ev)
	}
	// a ready intent whose VMM died is not at its goal
	p.VMMs = map[string]stack.Proc{}
	p.Views["b"] = nodeagent.VMView{Name: "b", Status: nodeagent.Status{Lifecycle: "hibernated"}}
	ev = evidence(t, IntentGoal, in, p)
	if len(ev) != 1 || !strings.Contains(ev[0], "a: ready but vm A1") {
		t.Fatalf("evidence = %q", ev)
	}
}

func TestHibernatedWithALiveVMIsNotTheGoal(t *testing.T) {
	in := &Input{Goals: map[string]string{"b": GoalHibernated}}
	p := &Poll{Views: map[string]nodeagent.VMView{"b": {Status: nodeagent.Status{Lifecycle: "hibernated"}}},
		VMs: []vmctl.VM{{ID: "B1", Name: "b", State: vmctl.StateRunning}}}
	if ev := evidence(t, IntentGoal, in, p); len(ev) != 1 || !strings.Contains(ev[0], "still exists") {
		t.Fatalf("evidence = %q", ev)
	}
}

// TestOrphanCreatingUsesRealLocks takes a real flock on a lock file and
// checks that the /proc/locks reading tells a held ops lock from a free one.
func TestOrphanCreatingUsesRealLocks(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "locks", "vm")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "C1.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in := &Input{Stack: &stack.Stack{Root: root}}
	p := &Poll{VMs: []vmctl.VM{{ID: "C1", Name: "c", State: vmctl.StateCreating}}}
	p.Held = heldInodes()
	if ev := evidence(t, NoOrphanCreating, in, p); len(ev) != 1 {
		t.Fatalf("free lock: evidence = %q", ev)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	p.Held = heldInodes()
	if ev := evidence(t, NoOrphanCreating, in, p); len(ev) != 0 {
		var st syscall.Stat_t
		_ = syscall.Stat(f.Name(), &st)
		t.Fatalf("held lock (inode %d): evidence = %q", st.Ino, ev)
	}
}

func TestIndexesConsistentFindsADanglingName(t *testing.T) {
	p := &Poll{
		VMIndex: rawIndex{Names: map[string]string{"a": "A1", "ghost": "G1"}, recNames: map[string]string{"A1": "a"}},
		SnapIx:  rawIndex{recNames: map[string]string{}},
	}
	ev := evidence(t, IndexesConsistent, &Input{}, p)
	if len(ev) != 1 || !strings.Contains(ev[0], `"ghost"`) {
		t.Fatalf("evidence = %q", ev)
	}
}

func TestEvaluateReportsEveryTableEntry(t *testing.T) {
	in := &Input{Stack: &stack.Stack{Root: t.TempDir()}, Goals: map[string]string{}}
	p := &Poll{Views: map[string]nodeagent.VMView{}, VMMs: map[string]stack.Proc{}}
	invs := Evaluate(in, p)
	if len(invs) != len(State) || !AllOK(invs) {
		t.Fatalf("empty stack: %+v", invs)
	}
}
