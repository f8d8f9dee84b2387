package nodeagent_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/controlplane"
	"github.com/vmchaos/vmchaos/internal/registrytest"
	"github.com/vmchaos/vmchaos/nodeagent"
)

// TestMigrationThroughControlPlane: two agents on one real registry sync
// against a control plane. Placed on A, the VM runs there; moved to B, A
// hibernates it (the snapshot committed under :hibernate) and releases it,
// and only then does B wake it from the registry with its RAM. B never
// holds a VM of the name while A still does. With the control plane gone,
// B keeps what it runs.
func TestMigrationThroughControlPlane(t *testing.T) {
	a, b := newStack(t), newStack(t)
	reg := registrytest.Start(t)
	cp := controlplane.New()
	var (
		mu       sync.Mutex
		released []string
	)
	seen := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(released, "; ")
	}
	cp.Observe = func(e controlplane.Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Kind == controlplane.EventReleased {
			// the release comes only once A's VM is gone and the
			// snapshot is durable in the registry
			if vm := a.vmByName("web"); vm != nil {
				released = append(released, "A still holds "+vm.ID)
			}
			if resp, err := http.Get(reg.URL + "/v2/web/tags/list"); err != nil || resp.StatusCode != http.StatusOK {
				released = append(released, fmt.Sprintf("no web:hibernate in the registry (%v)", err))
			} else {
				resp.Body.Close()
			}
			released = append(released, "released by "+e.From)
		}
	}
	sock := filepath.Join(t.TempDir(), "cp.sock")
	srv, err := controlplane.Serve(cp, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	// one cluster, one SSH identity: the migrated guest's memory holds
	// A's key (later entries of an environment win)
	for _, e := range a.env {
		if strings.HasPrefix(e, "VMCTL_SSH_KEY=") || strings.HasPrefix(e, "VMCTL_SEED_PUBKEY=") {
			b.env = append(b.env, e)
		}
	}
	for _, n := range []struct {
		s    *stack
		name string
	}{{a, "node-a"}, {b, "node-b"}} {
		n.s.startAgent(nil, "--registry", reg.URL, "--control-plane", sock, "--node", n.name, "--control-plane-tick", "1s")
		n.s.waitAPI()
	}
	if a.base != b.base {
		t.Fatalf("the two nodes' base snapshots differ: %s, %s", a.base, b.base)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := controlplane.NewClient(sock, 10*time.Second)
	if _, err := c.Place(ctx, "web", controlplane.Placement{Snapshot: a.base, Node: "node-a"}); err != nil {
		t.Fatal(err)
	}
	v := a.waitGoal("web", nodeagent.LifecycleReady, time.Minute)
	if _, err := a.guest(v.Status.VMID, "touch", "/run/marker"); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.get("web"); ok {
		t.Fatal("node B took up a VM placed on node A")
	}

	if _, err := c.Place(ctx, "web", controlplane.Placement{Snapshot: a.base, Node: "node-b"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if got := seen(); got != "" && got != "released by node-a" {
			t.Fatalf("released too early: %s", got)
		}
		aVM, bVM := a.vmByName("web"), b.vmByName("web")
		if aVM != nil && bVM != nil {
			t.Fatalf("two VMs of web at once: A %s (%s), B %s (%s)", aVM.ID, aVM.State, bVM.ID, bVM.State)
		}
		v, ok := b.get("web")
		_, onA := a.get("web")
		if ok && !onA && v.Status.Lifecycle == nodeagent.LifecycleReady && v.Status.ObservedGeneration == v.Generation && v.Op == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not migrated within a minute: B %+v (known %v), A still knows it: %v", v.Status, ok, onA)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := seen(); got != "released by node-a" {
		t.Fatalf("releases seen: %q, want exactly one by node-a with its VM gone", got)
	}
	v, _ = b.get("web")
	if out, err := b.guest(v.Status.VMID, "ls", "/run"); err != nil || !strings.Contains(out, "marker") {
		t.Fatalf("RAM marker lost on B: the target booted fresh: %q %v", out, err)
	}
	if sn := a.snapshots(); len(sn) != 1 || sn[0].Name != a.base {
		t.Fatalf("node A kept snapshots after the release: %+v", sn)
	}

	_ = srv.Close() // the control plane gone: B keeps the VM running
	time.Sleep(300 * time.Millisecond)
	if v2, ok := b.get("web"); !ok || v2.Status.VMID != v.Status.VMID || v2.Status.Lifecycle != nodeagent.LifecycleReady {
		t.Fatalf("node B changed the VM with its control plane unreachable: %+v (known %v)", v2.Status, ok)
	}
}
