// Command nodeagent is the bundled node agent: flags → nodeagent.Run → exit
// code. SIGINT/SIGTERM cancel one lifecycle context, which kills in-flight
// vmctl children (they run under exec.CommandContext on it); SIGKILL leaves
// them running (docs/architecture.md §6).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/nodeagent"
)

func main() {
	os.Exit(run())
}

func run() int {
	cfg := nodeagent.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "nodeagent --state-dir DIR --registry-dir DIR [flags]",
		Short: "Node agent: durable VM intents driven through vmctl, converging after any crash",
		Long: `nodeagent keeps VM intents (create, hibernate, wake, delete) received over HTTP on
<state-dir>/agent.sock, drives vmctl as child processes to reach them and converges by itself
after a crash or stop. Every duration flag is given at time scale 1 and multiplied by
VMCHAOS_TIME_SCALE. Children inherit the environment (VMCTL_*, VMCHAOS_*).

Example:
  nodeagent --state-dir /var/lib/nodeagent --registry-dir /var/lib/nodeagent-registry \
            --metrics-addr 127.0.0.1:9464`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.VMCtl == "" {
				cfg.VMCtl = nodeagent.DefaultVMCtl()
			}
			if err := failpoint.Init("nodeagent"); err != nil {
				return err
			}
			defer failpoint.Close() // a clean exit accounts for its trace
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			return nodeagent.Run(ctx, cfg, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.StateDir, "state-dir", "", "directory holding agent.sock, intents, status markers, metrics.json and metrics.addr (required)")
	f.StringVar(&cfg.VMCtl, "vmctl", "", "vmctl binary (default: vmctl next to this executable, else vmctl on PATH)")
	f.StringVar(&cfg.VMCtl, "manager-bin", "", "the manager binary (the same as --vmctl)")
	f.StringVar(&cfg.Manager, "manager", nodeagent.ManagerVMCtl, "manager adapter: vmctl or cocoon (what the binary lacks is planned around, or refused at start: <state-dir>/manager-plan.json)")
	f.StringVar(&cfg.RegistryDir, "registry-dir", "", "local registry directory: hibernate snapshots are pushed here and pulled from here (required)")
	f.StringVar(&cfg.RegistryURL, "registry", "", `real OCI registry, e.g. http://127.0.0.1:5000: hibernate pushes <name>:hibernate there as an OCI artifact and wake pulls it (--registry-dir then only stages pushes and pulls); "" uses --registry-dir as the registry`)
	f.DurationVar(&cfg.RegistryTimeout, "registry-timeout", cfg.RegistryTimeout, "connect and answer wait of one --registry request; an unreachable registry fails the step, which is retried")
	f.StringVar(&cfg.MetricsAddr, "metrics-addr", "", `Prometheus /metrics listen address, e.g. 127.0.0.1:0 (the bound address is written to <state-dir>/metrics.addr); "" disables`)
	f.IntVar(&cfg.NICs, "nics", cfg.NICs, "NICs a clone or wake gets (cocoon: 0 = the snapshot's own, cocoon's meaning of --nics 0)")
	f.IntVar(&cfg.StartupFanout, "startup-fanout", cfg.StartupFanout, "resumed operations dispatched concurrently at startup")
	f.DurationVar(&cfg.BusyCreateBudget, "busy-create-budget", cfg.BusyCreateBudget, "how long a creating record owned by a live operation is watched before giving up")
	f.DurationVar(&cfg.BusyCreateTick, "busy-create-tick", cfg.BusyCreateTick, "first interval between reconcile-stale-create re-invocations (doubles up to 8x)")
	f.DurationVar(&cfg.RetryBase, "retry-base", cfg.RetryBase, "first backoff before a failed intent is retried (doubles per attempt)")
	f.DurationVar(&cfg.RetryMax, "retry-max", cfg.RetryMax, "backoff cap of failed retries")
	f.IntVar(&cfg.RetryAttempts, "retry-attempts", cfg.RetryAttempts, "automatic retries of a failed intent per generation before it waits for a new PUT")
	f.DurationVar(&cfg.LeaseWait, "lease-wait", cfg.LeaseWait, "how long a snapshot rm refused because its lease is held is retried")
	f.DurationVar(&cfg.WatchInterval, "watch-interval", cfg.WatchInterval, "interval of the vm status --event watcher child (-n)")
	f.DurationVar(&cfg.ReadyBudget, "ready-budget", cfg.ReadyBudget, "post-clone readiness budget (guest exec retried until then)")
	f.DurationVar(&cfg.ReadyTick, "ready-tick", cfg.ReadyTick, "interval between readiness probes and lease-wait retries")
	f.StringVar(&cfg.ControlPlane, "control-plane", "", `unix socket of the cluster's control plane, e.g. /run/vmchaos/cp.sock: the agent runs the VMs placed on --node and hibernates and releases those moved away (docs/controlplane.md); "" runs only the intents PUT on its own API`)
	f.StringVar(&cfg.Node, "node", "", "this node's name on --control-plane, e.g. node-a")
	f.DurationVar(&cfg.ControlPlaneTick, "control-plane-tick", cfg.ControlPlaneTick, "interval between two syncs with --control-plane")
	f.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", cfg.ShutdownGrace, "how long SIGTERM waits for operations to unwind")
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		return 1
	}
	return 0
}
