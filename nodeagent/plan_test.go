package nodeagent

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/internal/needs"
	"github.com/vmchaos/vmchaos/manager"
)

// cocoonTable is the rows of cocoon 34c6c4a's table the agent uses, with
// the reasons its probe gives (docs/manager.md, capability table).
func cocoonTable() manager.Capabilities {
	return manager.Capabilities{Manager: "cocoon", Version: "34c6c4a", Items: []manager.Capability{
		{Name: "clone", Present: true, How: "cocoon vm clone"},
		{Name: "snapshot-save", Present: true}, {Name: "snapshot-rm", Present: true}, {Name: "start", Present: true},
		{Name: "rm", Present: true}, {Name: manager.FeatureInspect, Present: true}, {Name: manager.FeatureListJSON, Present: true},
		{Name: manager.FeatureEvents, Present: true}, {Name: manager.FeatureExport, Present: true}, {Name: manager.FeatureImport, Present: true},
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

// fakeCocoon is a manager binary that answers `cocoon PATH --help` and
// `cocoon version` with the recorded pages of cocoon 34c6c4a
// (manager/cocoon/testdata/help/head), less the commands in drop (removed
// from `cocoon vm --help`), and fails every other verb.
func fakeCocoon(t *testing.T, drop ...string) string {
	t.Helper()
	src := filepath.Join("..", "manager", "cocoon", "testdata", "help", "head")
	dir := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == "vm.txt" {
			var keep []string
			for _, line := range strings.Split(string(b), "\n") {
				f := strings.Fields(line)
				if len(f) > 0 && slices.Contains(drop, f[0]) && strings.HasPrefix(line, "  ") {
					continue
				}
				keep = append(keep, line)
			}
			b = []byte(strings.Join(keep, "\n"))
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "cocoon")
	script := `#!/bin/sh
d=$(dirname "$0")
if [ "$1" = version ]; then exec cat "$d/version.txt"; fi
p=""
for w in "$@"; do
  if [ "$w" = --help ]; then f="${p:-root}"; exec cat "$d/$f.txt"; fi
  p="${p:+$p-}$w"
done
echo 'Error: boom' >&2
exit 1
`
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestCocoonPlanStarts: over cocoon 34c6c4a (its recorded --help pages
// behind a fake binary) every verb the agent needs is present or planned
// around, so the agent starts: the plan replaces the three rows cocoon
// lacks and refuses nothing.
func TestCocoonPlanStarts(t *testing.T) {
	a, _ := planAgent(t, nil)
	a.cfg.Manager, a.cfg.VMCtl, a.cfg.RegistryDir = ManagerCocoon, fakeCocoon(t), t.TempDir()
	if err := a.cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	p := readPlan(t, a)
	var got []string
	for _, s := range p.Instead {
		got = append(got, s.Capability)
	}
	if p.Manager != "cocoon" || strings.Join(got, " ") != "recover-stale nic-change guest-exec" || len(p.Refused) != 0 {
		t.Errorf("cocoon plan: %+v", p)
	}
}

// TestCocoonWithoutNeededVerbIsRefused: a cocoon without `vm inspect` has
// no plan (the agent reads every VM through it), so the agent refuses to
// start and says why, in its error and in the plan file.
func TestCocoonWithoutNeededVerbIsRefused(t *testing.T) {
	cfg := DefaultConfig()
	cfg.StateDir, cfg.RegistryDir, cfg.Manager, cfg.VMCtl = t.TempDir(), t.TempDir(), ManagerCocoon, fakeCocoon(t, "inspect")
	// The deadline is a safety net: an agent that starts runs until it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "no plan replaces it") || !strings.Contains(err.Error(), "vm inspect: not in `cocoon vm --help`") {
		t.Fatalf("Run: %v", err)
	}
	b, rerr := os.ReadFile(filepath.Join(cfg.StateDir, PlanFile))
	if rerr != nil || !strings.Contains(string(b), `"refused"`) || !strings.Contains(string(b), "vm inspect: not in") {
		t.Fatalf("plan file: %v %s", rerr, b)
	}
}

// TestReadinessWithoutGuestExec: without guest-exec the readiness check is
// the manager's own state (one inspect, no `vm exec`): a running VM is
// ready, a stopped one is not; with vmctl's plan the guest is asked.
func TestReadinessWithoutGuestExec(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		state string
		ok    bool
	}{{"running", true}, {"stopped", false}} {
		a, _ := planAgent(t, newPlan(cocoonTable()))
		dir := t.TempDir()
		bin, calls := filepath.Join(dir, "mgr"), filepath.Join(dir, "calls")
		script := "#!/bin/sh\necho \"$*\" >>" + calls + "\n" +
			"case \"$1 $2\" in 'vm inspect') echo '{\"id\":\"ID1\",\"name\":\"w\",\"state\":\"" + tc.state + "\"}'; exit 0;; esac\n" +
			"echo 'Error: boom' >&2\nexit 1\n"
		if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		a.cfg.VMCtl = bin
		err := a.waitReady(ctx, "w", "ID1")
		if (err == nil) != tc.ok {
			t.Errorf("%s: waitReady = %v", tc.state, err)
		}
		if c := callsOf(t, calls); c != "vm inspect ID1 -o json" {
			t.Errorf("%s: calls %q", tc.state, c)
		}
	}
	a, calls := planAgent(t, nil)
	if err := a.waitReady(ctx, "w", "ID1"); err == nil {
		t.Fatal("vmctl plan: the failing guest exec was not run")
	}
	if c := callsOf(t, calls); c != "vm exec ID1 -- hostname" {
		t.Errorf("vmctl plan calls %q", c)
	}
}
