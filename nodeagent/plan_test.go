package nodeagent

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/internal/needs"
	"github.com/vmchaos/vmchaos/manager"
)

// cocoonTable is the rows of cocoon 34c6c4a's table the agent uses, with
// the reasons its probe gives (docs/manager.md, capability table).
func cocoonTable() manager.Capabilities {
	return manager.Capabilities{Manager: "cocoon", Version: "34c6c4a", Items: []manager.Capability{
		{Name: "clone", Present: true, How: "cocoon vm clone"},
		{Name: string(manager.VerbRecoverStale), Reason: "cocoon has no verb for a `creating` record whose owner died"},
		{Name: manager.FeatureNIC, Reason: "vm net: not in `cocoon vm --help`"},
		{Name: manager.FeatureGuestExec, Reason: "vm exec: not in `cocoon vm --help`"},
		{Name: manager.FeatureCheck, Reason: "check: not in `cocoon --help`"},
	}}
}

func TestPlanFromCapabilities(t *testing.T) {
	p := newPlan(cocoonTable())
	var got []string
	for _, s := range p.Instead {
		got = append(got, s.Capability)
	}
	if want := "recover-stale nic-change guest-exec"; strings.Join(got, " ") != want {
		t.Errorf("cocoon plan replaces %q, want %q", got, want)
	}
	if ok, why := p.has(manager.FeatureNIC); ok || !strings.Contains(why, "vm net") {
		t.Errorf("nic-change: %v %q", ok, why)
	}
	// vmctl's own table (the default): nothing the agent uses is missing.
	a := &Agent{cfg: Config{VMCtl: "vmctl"}}
	c, err := manager.CapabilitiesOf(context.Background(), a.adapter())
	if err != nil {
		t.Fatal(err)
	}
	if v := newPlan(c); len(v.Instead) != 0 {
		t.Errorf("vmctl plan replaces steps: %+v", v.Instead)
	}
}

// recordingManager is a manager binary that logs its argv and fails.
func recordingManager(t *testing.T) (bin, log string) {
	dir := t.TempDir()
	bin, log = filepath.Join(dir, "mgr"), filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$*\" >>" + log + "\necho 'Error: boom' >&2\nexit 1\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, log
}

func planAgent(t *testing.T, p *Plan) (*Agent, string) {
	bin, calls := recordingManager(t)
	cfg := DefaultConfig()
	cfg.StateDir, cfg.VMCtl, cfg.ReadyBudget = t.TempDir(), bin, 0
	a, err := newAgent(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), 1)
	if err != nil {
		t.Fatal(err)
	}
	a.plan = p
	return a, calls
}

func callsOf(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestHibernateWithoutNICChange: without nic-change the hibernate keeps the
// NIC and releases no lease (no child at all); with vmctl's plan (nil) the
// same call runs the DHCP release through the manager.
func TestHibernateWithoutNICChange(t *testing.T) {
	ctx := context.Background()
	a, calls := planAgent(t, newPlan(cocoonTable()))
	if err := a.hibernateDetach(ctx, "w", "ID1", 0); err != nil {
		t.Fatalf("cocoon plan: %v", err)
	}
	if c := callsOf(t, calls); c != "" {
		t.Errorf("cocoon plan ran the manager: %q", c)
	}
	a, calls = planAgent(t, nil)
	if err := a.hibernateDetach(ctx, "w", "ID1", 0); err == nil {
		t.Fatal("vmctl plan: the failing DHCP release was not run")
	}
	if c := callsOf(t, calls); c != "vm exec ID1 -- dhclient -r" {
		t.Errorf("vmctl plan calls %q", c)
	}
}

// TestStaleCreateWithoutVerbFailsClosed: without recover-stale the agent
// runs nothing and fails with the manager's reason.
func TestStaleCreateWithoutVerbFailsClosed(t *testing.T) {
	ctx := context.Background()
	a, calls := planAgent(t, newPlan(cocoonTable()))
	_, err := a.reconcileStaleCreate(ctx, "w", "ID1")
	if err == nil || !strings.Contains(err.Error(), "failing closed") || !strings.Contains(err.Error(), "owner died") {
		t.Fatalf("cocoon plan: %v", err)
	}
	if c := callsOf(t, calls); c != "" {
		t.Errorf("cocoon plan ran the manager: %q", c)
	}
	a, calls = planAgent(t, nil)
	if _, err := a.reconcileStaleCreate(ctx, "w", "ID1"); err == nil || strings.Contains(err.Error(), "failing closed") {
		t.Fatalf("vmctl plan: %v", err)
	}
	if c := callsOf(t, calls); c != "vm reconcile-stale-create ID1 -o json" {
		t.Errorf("vmctl plan calls %q", c)
	}
}

// TestChildErrorCarriesTheRefusal: a real child's stderr reaches the agent
// as the adapter's typed refusal.
func TestChildErrorCarriesTheRefusal(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "mgr")
	script := "#!/bin/sh\necho 'Error: save snapshot: snapshot name \"w\" already in use by XY7T' >&2\nexit 1\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	a, _ := planAgent(t, nil)
	a.cfg.VMCtl = bin
	_, err := a.vmctl(context.Background(), "w", "snapshot", "save", "--name", "w", "ID1")
	h, ok := nameHolder(err, manager.ObjectSnapshot)
	if !ok || h.Holder != "XY7T" || !h.Pending {
		t.Fatalf("refusal of %v: %+v %v", err, h, ok)
	}
	if _, ok := nameHolder(err, manager.ObjectVM); ok {
		t.Error("a snapshot name refusal read as a VM name refusal")
	}
}

// readPlan runs the agent's start-time plan through its adapter and reads
// back what it wrote to the state dir.
func readPlan(t *testing.T, a *Agent) Plan {
	t.Helper()
	if _, err := a.managerPlan(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(a.cfg.StateDir, PlanFile))
	if err != nil {
		t.Fatal(err)
	}
	var p Plan
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestManagerPlanRecordedVMCtl: with vmctl nothing the agent uses is missing.
func TestManagerPlanRecordedVMCtl(t *testing.T) {
	a, _ := planAgent(t, nil)
	if p := readPlan(t, a); p.Manager != "vmctl" || len(p.Instead) != 0 {
		t.Errorf("vmctl plan: %+v", p)
	}
}

// TestManagerPlanRecordedCocoon: with a real cocoon (VMCHAOS_COCOON) the
// three rows docs/manager.md names are replaced, as its --help pages say.
func TestManagerPlanRecordedCocoon(t *testing.T) {
	a, _ := planAgent(t, nil)
	a.cfg.Manager, a.cfg.VMCtl = ManagerCocoon, needs.Binary(t, "VMCHAOS_COCOON", "cocoon", "build it as docs/manager.md says")
	p := readPlan(t, a)
	var got []string
	for _, s := range p.Instead {
		got = append(got, s.Capability)
	}
	if p.Manager != "cocoon" || strings.Join(got, " ") != "recover-stale nic-change guest-exec" {
		t.Errorf("cocoon plan: %+v", p)
	}
}
