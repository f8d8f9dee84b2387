package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/vmchaos/vmchaos/progress"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
	"github.com/vmchaos/vmchaos/scenarios/suite"
)

// managerFlags select the manager-verb cases (layer:manager) and the
// manager they run against.
type managerFlags struct {
	name   string
	bin    string
	config string
}

func (m *managerFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&m.name, "manager", "", "run the manager-verb cases (layer:manager) against this manager: vmctl (bundled) or cocoon (needs --manager-bin); default: the agent catalogue, or vmctl when --label-filter names layer:manager, op:mgr-… or case:mgr-…; cocoon with a filter that selects agent cases runs those with their agent over cocoon (docs/manager.md)")
	c.Flags().StringVar(&m.bin, "manager-bin", "", "the manager binary to test (cocoon: the one you built; vmctl: default the bundled one), e.g. /usr/local/bin/cocoon")
	c.Flags().StringVar(&m.config, "manager-config", "", "the manager's own config file, passed to every verb (cocoon: --config FILE)")
}

// selected: the manager-verb cases run when a manager is named, or when the
// label filter asks for them (then against vmctl).
func (m *managerFlags) selected(filter string) bool {
	if m.name == "" && scenarios.WantsManager(filter) {
		m.name = "vmctl"
	}
	return m.name != ""
}

// agentCases: `--manager cocoon` with a label filter that selects no
// manager-verb case runs the agent cases with their agent over cocoon
// (issue 33 item 3); without a filter it runs the manager-verb cases.
func (m *managerFlags) agentCases(filter string) bool {
	return m.name == "cocoon" && m.bin != "" && filter != "" && !scenarios.WantsManager(filter)
}

// run is `vmchaos run` for the manager-verb cases: the one runner (its
// manager mode), the one filter, the one Ginkgo suite, the same reports and
// gate as the agent catalogue.
func (m *managerFlags) run(cmd *cobra.Command, o *runCmd) error {
	f := &o.f
	if o.shard != "" {
		return fmt.Errorf("--shard is not supported with --manager yet")
	}
	if !(f.scale > 0 && f.scale <= 1000) {
		return fmt.Errorf("--time-scale %v: want a number in (0, 1000]", f.scale)
	}
	if code, done := inPrivateMountNS(f, mgrMayCut); done {
		os.Exit(code)
	}
	bugs, err := regressFromEnv()
	if err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	dir := f.dir("manager-" + m.name)
	f.meter = progress.New(os.Stderr)
	r, err := runner.New(ctx, runner.Options{ReportDir: dir, Backend: f.backend, Scale: f.scale, Seed: f.seed,
		Regress: bugs, Progress: f.meter, Done: f.meter.Case, Repeat: o.repeat, Manager: m.name, ManagerBin: m.bin, ManagerConfig: m.config})
	if err != nil {
		return runInfraError{err}
	}
	all, err := r.ManagerCases(ctx)
	if err != nil {
		_ = r.Close()
		return runInfraError{err}
	}
	cases, err := scenarios.Filter(all, o.filter)
	if err != nil {
		_ = r.Close()
		return err
	}
	if o.list {
		_ = r.Close()
		return listCases(cmd.OutOrStdout(), cases)
	}
	if len(cases) == 0 {
		_ = r.Close()
		return fmt.Errorf("no manager case matches --label-filter %q", o.filter)
	}
	fmt.Fprintf(os.Stderr, "vmchaos run: %d manager case(s) against %s (%s), time scale %g, seed %d → %s\n",
		len(cases), m.name, r.ManagerBin(), f.scale, f.seed, dir)
	f.meter.Start("run", len(cases), 1)
	runErr := suite.Run(ctx, r, cases, o.filter, dir, f.seed)
	suite.Annotate(r.Results(), cases, nil)
	f.meter.Stop()
	res, werr := o.writeReports(cmd, r, dir)
	if runErr != nil {
		return runErr
	}
	if werr != nil {
		return fmt.Errorf("write reports: %w", werr)
	}
	return reports.Gate(res, nil, reports.DefaultGateOptions()).Err()
}

// mgrMayCut stands for the manager cases before they exist: they are
// generated only after the runner discovered each verb's VMM phases, and
// their power-cut cells mount the store on lazy filesystems, so a manager
// run goes to a private mount namespace as an agent run with power cuts
// does (inPrivateMountNS): its FUSE mounts never show in the host's mount
// table and go with the namespace if the run is SIGKILLed.
var mgrMayCut = []scenarios.Case{{ID: "mgr-powercut", Scenario: &scenarios.Scenario{
	Faults: []scenarios.Fault{{Kind: scenarios.FaultPowerCut}}}}}
