package controlplane

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMigrationHoldsTheTargetUntilTheSourceReleases: a moved placement
// names the old node as Source until that node (and only it) releases.
func TestMigrationHoldsTheTargetUntilTheSourceReleases(t *testing.T) {
	s := New()
	var events []string
	s.Observe = func(e Event) { events = append(events, e.Kind+":"+e.VM.Node+"<"+e.From) }
	if _, err := s.Place("vm-a", Placement{Snapshot: "base", Node: "a"}); err != nil {
		t.Fatal(err)
	}
	v, err := s.Place("vm-a", Placement{Snapshot: "base", Node: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if v.Source != "a" || v.Node != "b" || v.Generation != 2 {
		t.Fatalf("after the move: %+v, want source a, node b, generation 2", v)
	}
	if _, err := s.Release("vm-a", "b"); !errors.Is(err, ErrNotSource) {
		t.Fatalf("release by the target: %v, want ErrNotSource", err)
	}
	if v, err = s.Release("vm-a", "a"); err != nil || v.Source != "" {
		t.Fatalf("release by the source: %+v %v", v, err)
	}
	// repeated by a source that died before it acted on the answer
	if _, err = s.Release("vm-a", "a"); err != nil {
		t.Fatalf("repeated release: %v", err)
	}
	want := "placed:a<,moved:b<a,released:b<a"
	if got := strings.Join(events, ","); got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
}

// TestMoveBackBeforeReleaseKeepsTheSource: moved away and back before the
// source released, the VM never left its node.
func TestMoveBackBeforeReleaseKeepsTheSource(t *testing.T) {
	s := New()
	for _, n := range []string{"a", "b", "a"} {
		if _, err := s.Place("vm-a", Placement{Snapshot: "base", Node: n}); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := s.Get("vm-a"); v.Source != "" || v.Node != "a" {
		t.Fatalf("%+v, want node a, no source", v)
	}
}

func TestPlaceRejectsBadInput(t *testing.T) {
	s := New()
	for _, tc := range []struct{ name, node, snap string }{{"", "a", "base"}, {"vm", "", "base"}, {"vm", "a", ""}, {"VM!", "a", "base"}} {
		if _, err := s.Place(tc.name, Placement{Snapshot: tc.snap, Node: tc.node}); err == nil {
			t.Errorf("Place(%q, %q, %q) accepted", tc.name, tc.node, tc.snap)
		}
	}
}

// TestClientOverSocket: the agent's and the harness's view, over HTTP.
func TestClientOverSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cp.sock")
	srv, err := Serve(New(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := NewClient(sock, 5*time.Second)
	if _, err := c.Place(ctx, "vm-a", Placement{Snapshot: "base", Node: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Place(ctx, "vm-a", Placement{Snapshot: "base", Node: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "vm-a", "b"); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("release by the target over HTTP: %v, want a 409", err)
	}
	vms, err := c.List(ctx)
	if err != nil || len(vms) != 1 || vms[0].Source != "a" {
		t.Fatalf("list: %+v %v", vms, err)
	}
}

// TestOpenKeepsEveryAnswerAcrossARestart: a control plane reopened from its
// state file (what a SIGKILLed one restarts with) holds every placement and
// the migration in flight it answered, and a release after the restart is
// made durable too.
func TestOpenKeepsEveryAnswerAcrossARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Place("vm-a", Placement{Snapshot: "base", Node: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Place("vm-a", Placement{Snapshot: "base", Node: "b"}); err != nil {
		t.Fatal(err)
	}
	// no Close: the first process dies with nothing flushed but the file
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	v, ok := r.Get("vm-a")
	if !ok || v.Node != "b" || v.Source != "a" || v.Generation != 2 {
		t.Fatalf("after the restart: %+v (%v), want node b, source a, generation 2", v, ok)
	}
	if _, err := r.Release("vm-a", "a"); err != nil {
		t.Fatal(err)
	}
	again, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := again.Get("vm-a"); v.Source != "" || v.Node != "b" {
		t.Fatalf("the release did not survive a second restart: %+v", v)
	}
}

// TestAChangeThatCannotBeMadeDurableIsNotMade: with the state file's dir
// gone, a placement is refused (ErrNotDurable, answered 500) and the
// control plane still holds what it held before.
func TestAChangeThatCannotBeMadeDurableIsNotMade(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "sub", "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Place("vm-a", Placement{Snapshot: "base", Node: "a"})
	if !errors.Is(err, ErrNotDurable) {
		t.Fatalf("place with no dir for the state: %v, want ErrNotDurable", err)
	}
	if _, ok := s.Get("vm-a"); ok {
		t.Fatal("a placement that was never durable is held")
	}
	if got := errStatus(err, 400); got != 500 {
		t.Fatalf("status %d for a change not made durable, want 500", got)
	}
}
