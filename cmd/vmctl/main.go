// Command vmctl is the bundled VM manager: one VMM process per VM, every
// verb a short-lived process, JSON output with -o json, errors as
// "Error: <msg>" on stderr with exit 1. See docs/vmctl.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vmchaos/vmchaos/cidata"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/vmctl"
	"github.com/vmchaos/vmchaos/vmnet"
)

// exitStatus carries a status other than 1 (vm exec returns the guest's).
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func main() {
	if err := failpoint.Init("vmctl"); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
	// Most verbs live for milliseconds and allocate a few MiB decoding an
	// index: collecting that garbage costs more than the process's whole
	// life. GC runs only near the limit; resident verbs (daemon, status)
	// restore the default with residentGC.
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(256 << 20)
	// SIGINT/SIGTERM cancel the verb's context (a save still resumes the
	// guest). SIGPIPE keeps Go's default: a child whose parent died exits
	// on its next write to the dead stdout/stderr pipe.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	// The verb is over: the trace end accounts for every datagram sent.
	failpoint.Close()
	var st exitStatus
	switch {
	case err == nil:
	case errors.As(err, &st):
		os.Exit(int(st))
	default:
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

// globals are the persistent flags shared by every verb.
type globals struct {
	cfg vmctl.Config
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (g *globals) manager() (*vmctl.Manager, error) {
	m, err := vmctl.New(g.cfg)
	if err != nil {
		return nil, err
	}
	m.Progress = os.Stderr
	return m, nil
}

// run is the RunE most verbs share: check -o first (when the verb has one,
// out != nil) so a bad format fails before the store is opened, then open
// the manager and hand it to the verb.
func (g *globals) run(out *string, verb func(cmd *cobra.Command, args []string, m *vmctl.Manager) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if out != nil {
			if err := checkFormat(*out); err != nil {
				return err
			}
		}
		m, err := g.manager()
		if err != nil {
			return err
		}
		return verb(cmd, args, m)
	}
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "vmctl",
		Short: "VM manager for cloud-hypervisor (and fakech): crash-safe store, ops locks, clone/snapshot",
		Long: `vmctl manages VMs backed by one cloud-hypervisor process each. Every verb is a short-lived
process; state lives in flocked, fsynced JSON indexes under --root-dir. Errors print
"Error: <msg>" on stderr and exit 1. Verbs that print data take -o json.`,
		Example: `  VMCTL_ROOT_DIR=/tmp/vmctl vmctl vm run --name a guest.img
  vmctl snapshot save --name base a && vmctl vm clone --name b base -o json
  vmctl --net-mode tap --seed-pubkey ~/.ssh/id_ed25519.pub --firmware CLOUDHV.fd vm run --name r jammy.raw`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	f := root.PersistentFlags()
	f.StringVar(&g.cfg.RootDir, "root-dir", envOr("VMCTL_ROOT_DIR", vmctl.DefaultRootDir), "store root: indexes, locks, disks, snapshots (env VMCTL_ROOT_DIR)")
	f.StringVar(&g.cfg.RunDir, "run-dir", envOr("VMCTL_RUN_DIR", ""), "runtime dir holding <ID>/api.sock (env VMCTL_RUN_DIR; default <root-dir>/run)")
	f.StringVar(&g.cfg.CHBinary, "ch-binary", envOr("VMCTL_CH_BINARY", vmctl.DefaultCHBinary), "VMM binary, a name on PATH or a path (env VMCTL_CH_BINARY)")
	f.StringVar(&g.cfg.Firmware, "firmware", envOr("VMCTL_FIRMWARE", vmctl.DefaultFirmware), "firmware passed to the VMM as --firmware on cold boots (env VMCTL_FIRMWARE)")
	f.StringVar(&g.cfg.NetPool, "net-pool", envOr("VMCTL_NET_POOL", ""), "CIDR guest addresses are allocated from; inside 127.0.0.0/8 for fake guests; tap mode takes one /30 per NIC from it (env VMCTL_NET_POOL; default "+vmctl.DefaultNetPool+", tap mode "+vmnet.DefaultTapPool+")")
	f.StringVar(&g.cfg.Identity, "identity", envOr("VMCTL_SSH_KEY", ""), "SSH private key file used by vm exec (env VMCTL_SSH_KEY)")
	f.StringVar(&g.cfg.VMMCgroup, "vmm-cgroup", envOr("VMCTL_VMM_CGROUP", vmctl.CgroupAuto), "auto: start each VMM in its own cgroup (<cgroup2>/vmctl-<store hash>/<ID>, CLONE_INTO_CGROUP) where cgroup v2 is writable, so stopping the caller's unit does not kill VMMs; on: require it (clear error where it is not writable); off: VMMs stay in the caller's cgroup (env VMCTL_VMM_CGROUP)")
	f.StringVar(&g.cfg.NetMode, "net-mode", envOr("VMCTL_NET_MODE", vmctl.NetModeFake), "fake: --net ip=<guest loopback address> (fakech); tap: real cloud-hypervisor, a TAP per NIC (--net tap=,mac=,ip=<host side>,mask=) and a cloud-init seed disk on cold boots (env VMCTL_NET_MODE)")
	f.StringVar(&g.cfg.SeedPubKey, "seed-pubkey", envOr("VMCTL_SEED_PUBKEY", ""), "SSH public key (an authorized_keys line, or a file holding one) every guest's cloud-init seed authorizes for root (env VMCTL_SEED_PUBKEY)")
	f.StringVar(&g.cfg.Kernel, "kernel", envOr("VMCTL_KERNEL", ""), "boot this kernel instead of --firmware on cold boots (env VMCTL_KERNEL)")
	f.StringVar(&g.cfg.Cmdline, "cmdline", envOr("VMCTL_CMDLINE", ""), "kernel command line with --kernel (env VMCTL_CMDLINE; default \""+cidata.DefaultCmdline+"\")")
	f.StringVar(&g.cfg.Initramfs, "initramfs", envOr("VMCTL_INITRAMFS", ""), "initramfs with --kernel (env VMCTL_INITRAMFS)")
	f.StringVar(&g.cfg.GuestNet, "guest-net", envOr("VMCTL_GUEST_NET", vmctl.GuestNetStatic), "tap mode: how the guest gets its address: static (the seed pins it by MAC) or dhcp (the seed asks for DHCP; run realch's DHCP responder on the TAP side so clones under a new name take their own TAP's address) (env VMCTL_GUEST_NET)")
	f.StringVar(&g.cfg.Netns, "netns", envOr("VMCTL_NETNS", ""), "network namespace (ip netns name) vm exec dials guests from, where the VMMs' TAPs are; needs root (env VMCTL_NETNS)")
	root.AddCommand(newVMCmd(g), newSnapshotCmd(g), newDaemonCmd(g), newGCCmd(g), newCheckCmd(g), newObserveCmd(g))
	return root
}

// residentGC restores Go's default collector for long-running verbs.
func residentGC() {
	debug.SetGCPercent(100)
	debug.SetMemoryLimit(math.MaxInt64)
}
