package nodeagent

import (
	"context"
	"strings"
	"testing"
)

// TestAdapterArgvIsVMCtlsOwn: the verbs the agent runs through the adapter
// (manager.Manager.Command) are, over vmctl, the argv it ran before issue
// 33, so the agent.child.exec/exit trace the injector and checkers read is
// unchanged.
func TestAdapterArgvIsVMCtlsOwn(t *testing.T) {
	ctx := context.Background()
	a, calls := planAgent(t, nil)
	if _, err := a.saveSnapshot(ctx, "w", "ID1"); err == nil {
		t.Fatal("save through a failing manager succeeded")
	}
	if err := a.removeSnapshot(ctx, "w", "SNAP1", false); err == nil {
		t.Fatal("rm through a failing manager succeeded")
	}
	if _, err := a.reconcileStaleCreate(ctx, "w", "ID2"); err == nil {
		t.Fatal("reconcile through a failing manager succeeded")
	}
	want := strings.Join([]string{
		"snapshot save --name w ID1",
		"snapshot rm SNAP1",
		"vm reconcile-stale-create ID2 -o json",
	}, "\n")
	if got := callsOf(t, calls); got != want {
		t.Errorf("argv:\n%s\nwant:\n%s", got, want)
	}
}
