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
