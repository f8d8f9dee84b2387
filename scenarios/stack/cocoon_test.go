package stack_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/internal/needs"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/manager"
	agentapi "github.com/vmchaos/vmchaos/nodeagent/api"
	"github.com/vmchaos/vmchaos/scenarios/stack"
	"github.com/vmchaos/vmchaos/stackbin"
)

// TestStackAgentOverCocoon: a case stack with Options.Cocoon runs its agent
// over the real cocoon (VMCHAOS_COCOON): the base snapshot is cocoon's, an
// intent created through the agent API is one running VM in cocoon's own
// list under the id the agent bound, with a CNI NIC whose guest answers the
// ledger's SSH and runs the workload writer inside its VM's netns (and not
// in the host's), and a DELETE removes it there; the teardown leaves no
// process of the case (issue 33 item 3, issue 32 item 3).
func TestStackAgentOverCocoon(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: end-to-end, real processes; run without -short")
	}
	cbin := needs.Binary(t, "VMCHAOS_COCOON", "cocoon",
		"build github.com/cocoonstack/cocoon beside the project and set VMCHAOS_COCOON to the binary (docs/manager.md)")
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatalf("stack binaries: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	run, err := stack.NewRun(ctx, stack.RunOptions{BinDir: bin, Supervisor: injector.KindBuiltin, Scale: 0.1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = run.Close() })
	s, err := run.New(ctx, stack.Options{CaseDir: t.TempDir(), RestartDelay: 100 * time.Millisecond, Cocoon: &stack.CocoonOptions{Bin: cbin}})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = s.Close(context.Background())
		}
	})
	if err := s.StartAgent(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Agent.Put(ctx, "web", agentapi.Intent{Snapshot: "base"}); err != nil {
		t.Fatal(err)
	}
	v := waitView(ctx, t, s, "web", func(v agentapi.VMView, err error) bool {
		return err == nil && v.Status.Lifecycle == agentapi.LifecycleReady
	})
	got := cocoonVMs(ctx, t, s, "web")
	if len(got) != 1 || got[0].ID != v.Status.VMID || got[0].State != manager.StateRunning {
		t.Fatalf("after create: cocoon lists %+v, agent bound %q", got, v.Status.VMID)
	}
	// the clone inherited base's CNI NIC: its guest answers over the
	// ledger's pinned SSH at the address IPAM gave it, inside its netns
	// (a loopback address inside the case's pool, never the host's)
	if got[0].Address == "" || got[0].Netns == "" || v.Status.Address != got[0].Address {
		t.Fatalf("after create: cocoon lists address %q netns %q, agent reports %q", got[0].Address, got[0].Netns, v.Status.Address)
	}
	if boot, err := s.GuestBootID(ctx, "web", got[0].Address); err != nil || boot == "" {
		t.Fatalf("guest of web at %s: boot id %q, %v", got[0].Address, boot, err)
	}
	// the guest workload writes and acks markers there too (the writer
	// runs over the same dial)
	wl, err := s.Ledger.StartWorkload(ctx, ledger.Guest{Name: "web", Addr: got[0].Address}, ledger.WorkloadOpts{Rate: 50})
	if err != nil {
		t.Fatalf("workload in web: %v", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	err = wl.WaitAcks(wctx, 5)
	wcancel()
	if st := wl.Stop(); err != nil || st.Acks < 5 {
		t.Fatalf("workload in web: %d acks (%+v), %v", st.Acks, st, err)
	}
	if c, err := net.DialTimeout("tcp", got[0].Address, time.Second); err == nil {
		c.Close()
		t.Fatalf("%s answers in the host's network namespace: the guest must live in its VM's", got[0].Address)
	}
	if err := s.Agent.Delete(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	waitView(ctx, t, s, "web", func(_ agentapi.VMView, err error) bool { return errors.Is(err, stack.ErrNotFound) })
	if got := cocoonVMs(ctx, t, s, "web"); len(got) != 0 {
		t.Fatalf("after delete: cocoon still lists %+v", got)
	}
	closed = true
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// waitView polls the agent's view of name until done holds.
func waitView(ctx context.Context, t *testing.T, s *stack.Stack, name string, done func(agentapi.VMView, error) bool) agentapi.VMView {
	t.Helper()
	var v agentapi.VMView
	var err error
	for ctx.Err() == nil {
		if v, err = s.Agent.Get(ctx, name); done(v, err) {
			return v
		}
		time.Sleep(50 * time.Millisecond)
	}
	log, _ := os.ReadFile(s.LogDir + "/nodeagent.log")
	t.Fatalf("%s: last view %+v, err %v\nagent log tail:\n%s", name, v, err, tail(string(log), 3000))
	return v
}

// cocoonVMs is cocoon's own list of the VMs named name.
func cocoonVMs(ctx context.Context, t *testing.T, s *stack.Stack, name string) []manager.VM {
	t.Helper()
	vms, err := s.Cocoon.VMs(ctx)
	if err != nil {
		t.Fatal(fmt.Errorf("cocoon vm list: %w", err))
	}
	var out []manager.VM
	for _, v := range vms {
		if v.Name == name {
			out = append(out, v)
		}
	}
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
