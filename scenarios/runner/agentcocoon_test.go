package runner

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/internal/needs"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/stack"
	"github.com/vmchaos/vmchaos/stackbin"
)

// TestCocoonAgentCasesListsTheRest: every agent case a filter selects is
// either kept for the agent over cocoon or listed under not_supported with
// its reason, exactly once (never dropped silently): a trigger on vmctl's
// point, a power cut and a child kill at vmctl's point are listed, an
// agent-only case is kept.
func TestCocoonAgentCasesListsTheRest(t *testing.T) {
	all, err := scenarios.Expand("fake")
	if err != nil {
		t.Fatal(err)
	}
	cases, err := scenarios.Filter(all, "speed:fast && op:create")
	if err != nil {
		t.Fatal(err)
	}
	r := &Runner{opts: Options{Scale: 1}, res: &reports.Results{}}
	kept := map[string]bool{}
	for _, c := range r.CocoonAgentCases(cases) {
		kept[c.ID] = true
	}
	listed := map[string]string{}
	for _, ns := range r.res.NotSupported {
		if _, dup := listed[ns.Case]; dup || kept[ns.Case] || ns.Kind != reports.MissingManagerVerb {
			t.Errorf("not_supported row %+v: listed twice, also kept, or of another kind", ns)
		}
		listed[ns.Case] = ns.Reason
	}
	for _, c := range cases {
		if !kept[c.ID] && listed[c.ID] == "" {
			t.Errorf("%s: neither run nor listed", c.ID)
		}
	}
	for id, want := range map[string]string{"s001-1-busy-create-orphan": "vm.clone.reserved",
		"powercut-create-agent-create-begin": "power-cut", "s002-clone-sigkill-59ms-agent@59ms": "vm.clone.reserved"} {
		if !strings.Contains(listed[id], want) {
			t.Errorf("%s: not_supported reason %q, want it to name %s", id, listed[id], want)
		}
	}
	if !kept["s001-obs-evidence-resumed"] {
		t.Errorf("s001-obs-evidence-resumed (agent points only) not kept: %s", listed["s001-obs-evidence-resumed"])
	}
}

// TestAgentCaseOverCocoon runs one agent case through the runner with its
// agent over a real cocoon (VMCHAOS_COCOON): the fault lands, the intent
// reaches ready and its guest answers over SSH on its CNI NIC (inside its
// VM's netns), the metric expectation holds, and the invariants cocoon
// exposes no lock or dir for are judged on its store: the owners from the
// verbs in flight (none at the end), the captured trees from its snapshot
// data dirs. Before the CNI NIC, intent-goal failed (no guest address);
// before InFlight and SnapshotDir, these four failed "nothing proven".
func TestAgentCaseOverCocoon(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: end-to-end, real processes; run without -short")
	}
	cbin := needs.Binary(t, EnvCocoon, "cocoon",
		"build cocoon beside the project (go build in a checkout of github.com/cocoonstack/cocoon) and export "+EnvCocoon+"=/path/to/cocoon, or put it on PATH")
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := New(ctx, Options{ReportDir: t.TempDir(), Scale: 0.1, Seed: 1, BinDir: bin, Supervisor: "builtin", AgentCocoon: cbin})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	all, err := scenarios.Expand("fake")
	if err != nil {
		t.Fatal(err)
	}
	var cs []scenarios.Case
	for _, c := range all {
		if c.ID == "s001-obs-evidence-resumed" {
			cs = append(cs, c)
		}
	}
	if len(cs) != 1 {
		t.Fatalf("cases: %d", len(cs))
	}
	if kept := r.CocoonAgentCases(cs); len(kept) != 1 {
		t.Fatalf("case not kept for cocoon: %+v", r.res.NotSupported)
	}
	rc := r.RunCase(ctx, cs[0])
	t.Logf("%s: %s %s", rc.ID, rc.Verdict, rc.Reason)
	byName := map[string]reports.Invariant{}
	for _, inv := range rc.Invariants {
		byName[inv.Name] = inv
	}
	for _, name := range []string{"fault-landed", "one-vm-per-name", "metric-expectations"} {
		if inv, ok := byName[name]; !ok || !inv.OK {
			t.Errorf("%s: %+v (present %v), want held", name, inv, ok)
		}
	}
	for _, name := range []string{"intent-goal", "no-orphan-creating", "no-orphan-vmm", "no-pending-without-lease", "device-tree-consistent"} {
		if inv, ok := byName[name]; !ok || !inv.OK {
			t.Errorf("%s: %+v (present %v), want held on cocoon's store", name, inv, ok)
		}
	}
	if rc.Verdict != reports.Pass {
		t.Errorf("verdict %s (%s), want pass", rc.Verdict, rc.Reason)
	}
}

// TestCocoonWithoutCNIPluginsIsInconclusive: on a host without
// containernetworking-plugins, an agent case over cocoon is inconclusive
// with the preflight's reason naming the package (and results.json's
// not_run says what is missing), nothing is started, and it never runs
// over a silent --nics 0. The preflight itself: the missing plugin named,
// from a plugin dir without it (stack.CocoonNetPreflight, as root).
func TestCocoonWithoutCNIPluginsIsInconclusive(t *testing.T) {
	oldPF, oldDir := cocoonNetPreflight, stack.CNIPluginDir
	t.Cleanup(func() { cocoonNetPreflight, stack.CNIPluginDir = oldPF, oldDir })
	stack.CNIPluginDir = t.TempDir() // no plugin in it
	why, capability := stack.CocoonNetPreflight()
	if os.Geteuid() == 0 && (capability || !strings.Contains(why, "bridge") || !strings.Contains(why, stack.CNIPackage)) {
		t.Fatalf("preflight without plugins: %q (capability %v), want the bridge plugin and %s named", why, capability, stack.CNIPackage)
	}
	if os.Geteuid() != 0 && (!capability || !strings.Contains(why, "root")) {
		t.Fatalf("preflight as a user: %q (capability %v), want root named", why, capability)
	}
	cocoonNetPreflight = func() (string, bool) { return why, capability }
	r, err := New(context.Background(), Options{ReportDir: t.TempDir(), Scale: 0.1, AgentCocoon: "/nonexistent/cocoon"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.run != nil {
		t.Fatal("a stack run was built without the CNI plugins")
	}
	c, err := scenarios.CaseFor("s001-obs-evidence-resumed", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	rc := r.RunCase(context.Background(), c)
	if rc.Verdict != reports.Inconclusive || rc.Reason != "agent over cocoon: "+why {
		t.Fatalf("%s (%q), want inconclusive with the preflight's reason %q", rc.Verdict, rc.Reason, why)
	}
	nr, ok := r.notRunOf(rc)
	if !ok || (!capability && !strings.Contains(nr.Missing, stack.CNIPackage)) {
		t.Fatalf("not_run %+v (%v), want it to name %s", nr, ok, stack.CNIPackage)
	}
	if r.Results().Supervisor != "builtin ("+cocoonAutoNote+"), agent over cocoon /nonexistent/cocoon" {
		t.Errorf("run supervisor %q", r.Results().Supervisor)
	}
}

// TestCocoonSupervisor: auto is builtin with a note, sandbox refused.
func TestCocoonSupervisor(t *testing.T) {
	if k, note, err := cocoonSupervisor("auto"); k != injector.KindBuiltin || note != cocoonAutoNote || err != nil {
		t.Errorf("auto: %q %q %v", k, note, err)
	}
	if _, _, err := cocoonSupervisor(injector.KindSandbox); err == nil || !strings.Contains(err.Error(), "sandbox") {
		t.Errorf("sandbox: %v, want refused", err)
	}
	if _, err := New(context.Background(), Options{ReportDir: t.TempDir(), Supervisor: injector.KindSandbox, AgentCocoon: "/x"}); err == nil {
		t.Error("New with --supervisor sandbox over cocoon: no error")
	}
}

// TestCocoonRunsTheVMMPhasesItReaches: the matrix cells parked at a fakech
// point that cocoon's clone or snapshot save reaches (restore, the NIC swap,
// resume; pause, snapshot, resume) run over
// cocoon, the agent's cocoon child killed there included; a VMM phase its
// flow never reaches (ch.eject.acked during a hibernate: no NIC removed),
// a kill of the VMM or of every process of the unit stay listed.
func TestCocoonRunsTheVMMPhasesItReaches(t *testing.T) {
	r := &Runner{opts: Options{Scale: 1}, res: &reports.Results{}}
	for id, want := range map[string]string{
		"mx-create-ch-restore-begin-sigkill-child": "",
		"mx-create-ch-restore-done-sigkill-main":   "",
		"mx-create-ch-net-added-restart":           "",
		"mx-create-ch-resume-sigstop-cont":         "",
		"mx-create-ch-resume-stop":                 "",
		"mx-hibernate-ch-eject-acked-restart":      "never reaches",
		"mx-create-ch-resume-sigkill-vmm":          "sigkill-vmm",
		"mx-create-ch-resume-kill-all":             "kill-all",
		"mx-save-ch-pause-sigkill-main":            "",
		"mx-save-ch-snapshot-done-sigkill-child":   "",
		"mx-save-snapshot-save-paused-restart":     "vmctl's point",
	} {
		c, err := scenarios.CaseFor(id, 0, false, "fake")
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		got := r.cocoonUnsupported(c)
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("%s: unsupported %q, want %q", id, got, map[bool]string{true: "kept", false: "listed naming " + want}[want == ""])
		}
	}
}

// TestCocoonSkipsPointsItsPlanNeverReaches: a case parked at the agent's
// NIC drop (which the agent's plan over cocoon skips: no `vm net`) is not
// generated over cocoon; before, it ran and came out inconclusive (the park
// never came), a case whose point does not exist there.
func TestCocoonSkipsPointsItsPlanNeverReaches(t *testing.T) {
	c, err := scenarios.CaseFor("s001-h-double-restart", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	r := &Runner{opts: Options{Scale: 1}, res: &reports.Results{}}
	if kept := r.CocoonAgentCases([]scenarios.Case{c}); len(kept) != 0 || len(r.res.NotSupported) != 1 ||
		!strings.Contains(r.res.NotSupported[0].Reason, "agent.hibernate.nic-dropped") || !strings.Contains(r.res.NotSupported[0].Reason, "nic-change") {
		t.Fatalf("kept %d, not_supported %+v; want the case listed naming agent.hibernate.nic-dropped and nic-change", len(kept), r.res.NotSupported)
	}
}

// TestCocoonReproLineNamesTheManager: a case that ran with its agent over
// cocoon prints a repro line that runs it so again (without --manager it
// would rerun over the bundled vmctl, where these cases pass).
func TestCocoonReproLineNamesTheManager(t *testing.T) {
	c, err := scenarios.CaseForFrac("sweep-clone-sigkill", 0.5, "fake")
	if err != nil {
		t.Fatal(err)
	}
	r := &Runner{opts: Options{Scale: 0.1, Seed: 1, Backend: "fake", AgentCocoon: "/peers/bin/cocoon-head"}}
	want := "vmchaos repro --scenario sweep-clone-sigkill --offset 50% --seed 1 --time-scale 0.1 --backend fake --manager cocoon --manager-bin /peers/bin/cocoon-head"
	if got := r.Repro(c); got != want {
		t.Errorf("repro = %q, want %q", got, want)
	}
	r.opts.AgentCocoon = "/my peers/cocoon"
	if got := r.Repro(c); !strings.HasSuffix(got, "--manager-bin '/my peers/cocoon'") {
		t.Errorf("repro with a path to quote = %q", got)
	}
}
