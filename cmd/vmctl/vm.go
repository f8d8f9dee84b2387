package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/timescale"
	"github.com/vmchaos/vmchaos/vmctl"
)

func newVMCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "vm", Short: "Manage VMs"}
	c.AddCommand(newCreateCmd(g, "create", false), newCreateCmd(g, "run", true), newCloneCmd(g),
		newStartCmd(g), newStopCmd(g), newRmCmd(g), newInspectCmd(g), newListCmd(g), newStatusCmd(g),
		newNetCmd(g), newExecCmd(g), newStaleCmd(g))
	return c
}

func newCreateCmd(g *globals, verb string, start bool) *cobra.Command {
	var o vmctl.CreateOptions
	var mem, storage, out string
	short := "Create a VM from a guest disk image (record created, not booted)"
	if start {
		short = "Create a VM from a guest disk image and boot it"
	}
	c := &cobra.Command{
		Use:     verb + " [flags] IMAGE",
		Short:   short,
		Example: "  vmctl vm " + verb + " --name web --cpu 2 --memory 1G guest.img",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(out); err != nil {
				return err
			}
			var err error
			if o.Memory, err = vmctl.ParseSize(mem); err != nil {
				return err
			}
			if storage != "" {
				if o.Storage, err = vmctl.ParseSize(storage); err != nil {
					return err
				}
			}
			m, err := g.manager()
			if err != nil {
				return err
			}
			o.Image, o.Start = args[0], start
			v, err := m.Create(cmd.Context(), o)
			if err != nil {
				return err
			}
			return printRecord(out, v.ID, v)
		},
	}
	f := c.Flags()
	f.StringVar(&o.Name, "name", "", "VM name (default vm-<first 8 chars of the id>)")
	f.IntVar(&o.CPU, "cpu", vmctl.DefaultCPU, "vCPUs")
	f.StringVar(&mem, "memory", "512M", "RAM, K/M/G suffix (bare number = MiB)")
	f.StringVar(&storage, "storage", "", "disk size, K/M/G suffix (raw images are grown to it)")
	f.IntVar(&o.NICs, "nics", vmctl.DefaultNICs, "number of NICs")
	addOutputFlag(c, &out)
	return c
}

func newCloneCmd(g *globals) *cobra.Command {
	o := vmctl.CloneOptions{}
	var out string
	c := &cobra.Command{
		Use:     "clone [flags] SNAPSHOT",
		Short:   "Create a running VM from a snapshot (by id or name)",
		Example: "  vmctl vm clone --name web-2 --nics 1 base-snap -o json",
		Args:    cobra.ExactArgs(1),
		RunE: g.run(&out, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			o.Snapshot = args[0]
			v, err := m.Clone(cmd.Context(), o)
			if err != nil {
				return err
			}
			return printRecord(out, v.ID, v)
		}),
	}
	c.Flags().StringVar(&o.Name, "name", "", "VM name (default vm-<first 8 chars of the id>)")
	c.Flags().IntVar(&o.NICs, "nics", -1, "number of NICs (default: as many as the snapshot's VM had)")
	addOutputFlag(c, &out)
	return c
}

func newStartCmd(g *globals) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:     "start VM...",
		Short:   "Boot VMs (idempotent: a live VMM is kept, a dead one is booted again)",
		Example: "  vmctl vm start web",
		Args:    cobra.MinimumNArgs(1),
		RunE: g.run(nil, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			for _, a := range args {
				v, err := m.Start(cmd.Context(), a)
				if err != nil {
					return err
				}
				if err := printRecord(out, v.ID, v); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	addOutputFlag(c, &out)
	return c
}

func newStopCmd(g *globals) *cobra.Command {
	var force bool
	var timeout time.Duration
	c := &cobra.Command{
		Use:     "stop [--force] [--timeout D] VM...",
		Short:   "Stop VMs (vmm.shutdown, SIGKILL after --timeout; --force kills at once)",
		Example: "  vmctl vm stop --timeout 10s web",
		Args:    cobra.MinimumNArgs(1),
		RunE: g.run(nil, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			for _, a := range args {
				v, err := m.Stop(cmd.Context(), a, force, timescale.D(timeout))
				if err != nil {
					return err
				}
				fmt.Println(v.ID)
			}
			return nil
		}),
	}
	c.Flags().BoolVar(&force, "force", false, "SIGKILL the VMM without a graceful shutdown")
	c.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "graceful shutdown budget before SIGKILL (scaled by VMCHAOS_TIME_SCALE)")
	return c
}

func newRmCmd(g *globals) *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:     "rm [--force] VM...",
		Short:   "Delete VMs (tombstoned, resumable); a running VM needs --force",
		Example: "  vmctl vm rm --force web",
		Args:    cobra.MinimumNArgs(1),
		RunE: g.run(nil, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			for _, a := range args {
				if err := m.Remove(cmd.Context(), a, force); err != nil {
					return err
				}
				fmt.Println(a)
			}
			return nil
		}),
	}
	c.Flags().BoolVar(&force, "force", false, "delete a running VM (its VMM is killed)")
	return c
}

func newInspectCmd(g *globals) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:     "inspect VM",
		Short:   "Show one VM, with the VMM's own state (vmm_state)",
		Example: "  vmctl vm inspect web -o json",
		Args:    cobra.ExactArgs(1),
		RunE: g.run(&out, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			v, err := m.Inspect(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printVM(os.Stdout, out, v)
		}),
	}
	addOutputFlag(c, &out)
	return c
}

func newListCmd(g *globals) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   `List VMs ("stopped (stale)" for a running record whose VMM is dead)`,
		Example: "  vmctl vm list -o json",
		Args:    cobra.NoArgs,
		RunE: g.run(&out, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			vs, err := m.List(cmd.Context())
			if err != nil {
				return err
			}
			return printVMs(os.Stdout, out, vs)
		}),
	}
	addOutputFlag(c, &out)
	return c
}

func newStatusCmd(g *globals) *cobra.Command {
	var interval float64
	var event bool
	var format string
	c := &cobra.Command{
		Use:   "status [-n SECONDS] [--event] [--format json]",
		Short: "Watch VMs: a list per interval, or with --event one JSON line per change",
		Long: `Without --event, prints the VM list every interval (once with -n 0).
With --event --format json, prints {"event":"ADDED|MODIFIED|DELETED","vm":{...}} per change;
a VMM killed with -9 yields MODIFIED with "stopped (stale)" within one interval.
The interval is scaled by VMCHAOS_TIME_SCALE.`,
		Example: "  vmctl vm status --event --format json -n 1",
		Args:    cobra.NoArgs,
		RunE: g.run(&format, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			d := timescale.D(time.Duration(interval * float64(time.Second)))
			if interval > 0 {
				residentGC()
			}
			if event {
				enc := json.NewEncoder(os.Stdout)
				return m.StatusEvents(cmd.Context(), d, func(e vmctl.StatusEvent) error {
					if format == "json" {
						return enc.Encode(e)
					}
					_, err := fmt.Printf("%s\t%s\t%s\t%s\n", e.Event, e.VM.ID, e.VM.Name, e.VM.State)
					return err
				})
			}
			for {
				vs, err := m.List(cmd.Context())
				if err != nil {
					return err
				}
				if err := printVMs(os.Stdout, format, vs); err != nil {
					return err
				}
				if interval <= 0 || timescale.SleepRaw(cmd.Context(), d) != nil {
					return nil
				}
			}
		}),
	}
	c.Flags().Float64VarP(&interval, "interval", "n", 5, "seconds between passes")
	c.Flags().BoolVar(&event, "event", false, "print one line per change instead of the whole list")
	c.Flags().StringVar(&format, "format", "", `"json" for JSON lines`)
	return c
}

func newNetCmd(g *globals) *cobra.Command {
	var n int
	var out string
	c := &cobra.Command{
		Use:   "net VM --nics N",
		Short: "Set a running VM's NIC count through its VMM (converges a pause left by a dead capture)",
		Example: `  vmctl vm net web --nics 0
  vmctl vm net web --nics 1`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("nics") {
				return fmt.Errorf("--nics is required")
			}
			m, err := g.manager()
			if err != nil {
				return err
			}
			v, err := m.Net(cmd.Context(), args[0], n)
			if err != nil {
				return err
			}
			return printRecord(out, v.ID, v)
		},
	}
	c.Flags().IntVar(&n, "nics", 0, "number of NICs wanted")
	addOutputFlag(c, &out)
	return c
}

func newExecCmd(g *globals) *cobra.Command {
	var user string
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "exec VM -- ARGV...",
		Short: "Run a command in the guest over SSH; exits with the command's status",
		Long: `Connects to the guest's first NIC address with --identity (VMCTL_SSH_KEY). The guest
host key is pinned: the key inside a fake image, or trust-on-first-use for others.`,
		Example: "  vmctl vm exec web -- hostname",
		Args:    cobra.MinimumNArgs(2),
		RunE: g.run(nil, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			st, err := m.Exec(cmd.Context(), args[0], args[1:], os.Stdout, os.Stderr, vmctl.ExecOptions{User: user, Timeout: timeout})
			if err != nil {
				return err
			}
			if st != 0 {
				return exitStatus(st)
			}
			return nil
		}),
	}
	c.Flags().StringVar(&user, "user", "root", "guest user")
	c.Flags().DurationVar(&timeout, "connect-timeout", 10*time.Second, "SSH connect timeout")
	return c
}

func newStaleCmd(g *globals) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "reconcile-stale-create VM [-o json]",
		Short: "Collect a creating placeholder whose owner died (never waits for a live one)",
		Long: `Try-locks the VM's ops lock. Outcomes (exit 0 for all four):
  busy          an operation owns the VM right now
  not-found     no such record
  not-creating  the record is not creating (a committed VM is never touched)
  collected     the owner is gone: no VMM left, placeholder deleted (tombstoned delete)`,
		Example: "  vmctl vm reconcile-stale-create NMA2LDSIW5ZIM54D4UMFSDYTR5 -o json",
		Args:    cobra.ExactArgs(1),
		RunE: g.run(&out, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			r, err := m.ReconcileStaleCreate(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if out == "json" {
				b, _ := json.Marshal(r)
				fmt.Println(string(b))
				return nil
			}
			fmt.Printf("%s %s\n", r.ID, r.Outcome)
			return nil
		}),
	}
	addOutputFlag(c, &out)
	return c
}
