package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/timescale"
	"github.com/vmchaos/vmchaos/vmctl"
	"github.com/vmchaos/vmchaos/vmctl/api"
)

func newDaemonCmd(g *globals) *cobra.Command {
	var interval time.Duration
	var once bool
	c := &cobra.Command{
		Use:   "daemon [--interval 5s] [--once]",
		Short: "Resident supervisor: collect ownerless creates, converge dead VMMs, roll deletes forward",
		Long: `Each pass: every creating record goes through reconcile-stale-create (collected when its
owner is gone), a running record whose VMM died is recorded stopped (reason unexpected-exit),
tombstoned deletes are completed. One instance per root dir. The interval is scaled by
VMCHAOS_TIME_SCALE. --once runs a single pass and prints its report as JSON.`,
		Example: "  vmctl daemon --interval 5s\n  vmctl daemon --once",
		Args:    cobra.NoArgs,
		RunE: g.run(nil, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			if once {
				rep, err := m.DaemonPass(cmd.Context())
				if err != nil {
					return err
				}
				return printJSON(os.Stdout, rep)
			}
			residentGC()
			return m.Daemon(cmd.Context(), timescale.D(interval))
		}),
	}
	c.Flags().DurationVar(&interval, "interval", 5*time.Second, "time between passes (scaled by VMCHAOS_TIME_SCALE)")
	c.Flags().BoolVar(&once, "once", false, "run one pass and exit")
	return c
}

func newGCCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "gc",
		Short:   "Remove unreferenced dirs, dead builds' staging dirs and stale pending snapshots whose lease is free",
		Example: "  vmctl gc",
		Args:    cobra.NoArgs,
		RunE: g.run(nil, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			rep, err := m.GC(cmd.Context())
			if err != nil {
				return err
			}
			return printJSON(os.Stdout, rep)
		}),
	}
}

func newCheckCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Verify the store's invariants; prints a JSON report, exit 1 if any is violated",
		Long: `Invariants: store-loadable, indexes-consistent, one-vm-per-name, no-tombstone,
no-orphan-creating, no-orphan-vmm, no-running-with-dead-vmm, no-paused-running,
no-pending-without-lease, no-leftover-staging, no-leftover-sockets, no-unreferenced-dirs,
snapshot-data. Read-only apart from momentary try-locks.`,
		Example: "  vmctl check",
		Args:    cobra.NoArgs,
		RunE: g.run(nil, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			rep := m.Check(cmd.Context())
			if err := printJSON(os.Stdout, rep); err != nil {
				return err
			}
			if !rep.OK {
				return fmt.Errorf("store inconsistent: %d violation(s)", len(rep.Violations))
			}
			return nil
		}),
	}
}

func newObserveCmd(g *globals) *cobra.Command {
	check := true
	c := &cobra.Command{
		Use:   "observe [--check=false]",
		Short: "Print vm list, snapshot list and check as one JSON object (one read for pollers)",
		Long: `observe prints {"vms": [...], "snapshots": [...], "check": {...}}: what vm list -o json,
snapshot list -o json and check print, read one after the other in this one process, so a
poller pays one exec instead of three. A list that could not be read is null with its error
in vms_error or snapshots_error; check's violations are data, not an error. Exit 0 once the
object is printed. Read-only apart from check's momentary try-locks.`,
		Example: "  vmctl observe\n  vmctl observe --check=false",
		Args:    cobra.NoArgs,
		RunE: g.run(nil, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			return printJSON(os.Stdout, observe(cmd.Context(), m, check))
		}),
	}
	c.Flags().BoolVar(&check, "check", true, "include the check report")
	return c
}

// observe reads what the three verbs read, in their order.
func observe(ctx context.Context, m *vmctl.Manager, check bool) api.Observation {
	var o api.Observation
	vs, err := m.List(ctx)
	if err != nil {
		o.VMsError = err.Error()
	} else {
		o.VMs = vs
	}
	ss, err := m.SnapshotList(ctx)
	if err != nil {
		o.SnapshotsError = err.Error()
	} else {
		o.Snapshots = ss
	}
	if check {
		rep := m.Check(ctx)
		o.Check = &rep
	}
	return o
}
