package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios/managerlayer"
	"github.com/vmchaos/vmchaos/stackbin"
)

// managerFlags select the manager-level catalogue (layer:manager) and the
// manager it runs against.
type managerFlags struct {
	name   string
	bin    string
	config string
}

func (m *managerFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&m.name, "manager", "", "run the manager-level catalogue (layer:manager) against this manager: vmctl (bundled) or cocoon (needs --manager-bin); default: the agent catalogue, or vmctl when --label-filter names layer:manager")
	c.Flags().StringVar(&m.bin, "manager-bin", "", "the manager binary to test (cocoon: the one you built; vmctl: default the bundled one), e.g. /usr/local/bin/cocoon")
	c.Flags().StringVar(&m.config, "manager-config", "", "the manager's own config file, passed to every verb (cocoon: --config FILE)")
}

// selected: the manager layer runs when a manager is named, or when the
// label filter asks for layer:manager or a manager case (then against vmctl).
func (m *managerFlags) selected(filter string) bool {
	if m.name == "" && (strings.Contains(filter, "layer:manager") || strings.Contains(filter, "case:mgr-")) {
		m.name = "vmctl"
	}
	return m.name != ""
}

// run is `vmchaos run` for the manager layer: same report dir, reports and
// gate as the agent catalogue.
func (m *managerFlags) run(cmd *cobra.Command, f *runFlags, filter, shard string, list bool) error {
	if shard != "" {
		return fmt.Errorf("--shard is not supported with --manager yet")
	}
	if f.backend != "fake" {
		return fmt.Errorf("--manager runs on the fake backend only (fakech installed as cloud-hypervisor)")
	}
	if !(f.scale > 0 && f.scale <= 1000) {
		return fmt.Errorf("--time-scale %v: want a number in (0, 1000]", f.scale)
	}
	binDir, err := stackbin.Dir()
	if err != nil {
		return runInfraError{err}
	}
	dir := f.dir("manager-" + m.name)
	r, err := managerlayer.New(managerlayer.Options{Manager: m.name, Bin: m.bin, Config: m.config, BinDir: binDir,
		Scale: f.scale, Seed: f.seed, ReportDir: dir, Progress: os.Stderr})
	if err != nil {
		return runInfraError{err}
	}
	defer r.Close()
	ctx, cancel := signalContext()
	defer cancel()
	all, err := r.Cases(ctx)
	if err != nil {
		return runInfraError{err}
	}
	cases, err := managerlayer.Filter(all, filter)
	if err != nil {
		return err
	}
	if list {
		return listManagerCases(cmd.OutOrStdout(), cases)
	}
	if len(cases) == 0 {
		return fmt.Errorf("no manager case matches --label-filter %q", filter)
	}
	fmt.Fprintf(os.Stderr, "vmchaos run: %d manager case(s) against %s (%s), time scale %g, seed %d → %s\n",
		len(cases), m.name, r.BinPath(), f.scale, f.seed, dir)
	res, err := r.RunSuite(ctx, cases, filter)
	if err != nil {
		return err
	}
	res.Dir = dir
	if err := reports.WriteAll(dir, res); err != nil {
		return fmt.Errorf("write reports: %w", err)
	}
	reports.Summary(cmd.OutOrStdout(), res)
	return reports.Gate(res, nil, reports.DefaultGateOptions()).Err()
}

func listManagerCases(w io.Writer, cases []managerlayer.Case) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tLABELS\tTITLE")
	for _, c := range cases {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.ID, strings.Join(c.Labels, ","), c.Title)
	}
	fmt.Fprintf(tw, "%d case(s)\n", len(cases))
	return tw.Flush()
}
