package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/scenarios/runner"
	"github.com/vmchaos/vmchaos/stackbin"
)

func init() { register(newManagerCmd) }

// newManagerCmd is `vmchaos manager`: what vmchaos knows about a VM manager
// binary before it runs any case against it.
func newManagerCmd() *cobra.Command {
	c := &cobra.Command{Use: "manager", Short: "Inspect a VM manager binary (see docs/manager.md)"}
	c.AddCommand(newManagerProbeCmd())
	return c
}

type probeFlags struct {
	name, bin, config string
	json              bool
}

func newManagerProbeCmd() *cobra.Command {
	var o probeFlags
	c := &cobra.Command{
		Use:   "probe --manager NAME [--manager-bin PATH] [--json]",
		Short: "Print the manager's capability table: each verb and feature, present (and how) or missing (and why), and its version",
		Long: `The adapter reads the binary's own CLI (cocoon: its --help pages and "cocoon version") and reports
what the manager-level catalogue can drive there. A missing row names exactly what is missing and where the
adapter looked; the catalogue generates no case that needs it, and a run records such a case as
"not supported by this manager", never as a pass. Nothing is created: only help and version are run.`,
		Example: `  vmchaos manager probe --manager cocoon --manager-bin /usr/local/bin/cocoon
  vmchaos manager probe --manager cocoon --manager-bin ./cocoon --json
  vmchaos manager probe --manager vmctl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			caps, err := probeManager(ctx, o)
			if err != nil {
				return err
			}
			if o.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(caps)
			}
			return printCapabilities(cmd.OutOrStdout(), caps)
		},
	}
	c.Flags().StringVar(&o.name, "manager", "", "the adapter: vmctl (bundled) or cocoon (needs --manager-bin)")
	c.Flags().StringVar(&o.bin, "manager-bin", "", "the manager binary (vmctl: default the bundled one), e.g. /usr/local/bin/cocoon")
	c.Flags().StringVar(&o.config, "manager-config", "", "the manager's own config file, passed as it is to every verb (cocoon: --config FILE)")
	c.Flags().BoolVar(&o.json, "json", false, "print the table as JSON (manager.Capabilities), as results.json records it")
	_ = c.MarkFlagRequired("manager")
	return c
}

// probeManager builds the named adapter on a scratch store and asks it for
// its capability table.
func probeManager(ctx context.Context, o probeFlags) (manager.Capabilities, error) {
	if o.bin == "" && o.name == "vmctl" {
		p, err := stackbin.Path("vmctl")
		if err != nil {
			return manager.Capabilities{}, fmt.Errorf("bundled vmctl: %w", err)
		}
		o.bin = p
	}
	if o.bin != "" {
		if st, err := os.Stat(o.bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return manager.Capabilities{}, fmt.Errorf("manager binary %q: not an executable file (%v)", o.bin, err)
		}
	}
	dir, err := os.MkdirTemp("", "vmchaos-probe-")
	if err != nil {
		return manager.Capabilities{}, fmt.Errorf("manager probe: %w", err)
	}
	defer os.RemoveAll(dir)
	m, err := runner.NewManager(o.name, manager.Options{Bin: o.bin, Config: o.config, Dir: dir})
	if err != nil {
		return manager.Capabilities{}, err
	}
	caps, err := manager.CapabilitiesOf(ctx, m)
	if err != nil {
		return caps, err
	}
	if len(caps.Items) == 0 {
		return caps, errors.New("manager probe: the adapter reported no capabilities")
	}
	return caps, nil
}

func printCapabilities(w io.Writer, c manager.Capabilities) error {
	fmt.Fprintf(w, "manager  %s  %s\nversion  %s\n\n", c.Manager, c.Bin, c.Version)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CAPABILITY\tPRESENT\tHOW / WHY MISSING")
	for _, it := range c.Items {
		if it.Present {
			fmt.Fprintf(tw, "%s\tyes\t%s\n", it.Name, it.How)
		} else {
			fmt.Fprintf(tw, "%s\tno\t%s\n", it.Name, it.Reason)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%d of %d present\n", len(c.Items)-len(c.Missing()), len(c.Items))
	return nil
}
