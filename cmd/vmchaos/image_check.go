package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/realch"
	"github.com/vmchaos/vmchaos/realch/qemucheck"
)

func newImageCheckCmd() *cobra.Command {
	var o qemucheck.Options
	var jsonOut string
	c := &cobra.Command{
		Use:   "check [--image PATH] [--kernel PATH]",
		Short: "Boot the real guest image under QEMU (TCG, no KVM) and prove its guest half (root)",
		Long: `Boots the image ` + "`vmchaos image real`" + ` built under QEMU's software emulation
(qemu-system-x86_64 -accel tcg: no /dev/kvm needed, so it runs on a kvm_pvm host where no stock
guest kernel boots) and checks, each on one line with its evidence:

  userspace-*      the kernel and the initramfs reach userspace, systemd runs from the root
                   (the serial console, with the time of each line from QEMU's start)
  ssh-*            sshd answers as root with the run's key (time of the first answer)
  seed-dhcp        the NoCloud seed realch writes is applied: hostname, root's key, the
                   seed's SSH host key, DHCP on eth0 (an expiring address)
  ssh-host-key     the host key was pinned from the seed before first contact, and a pin
                   of any other key is refused by the guest's sshd
  dhcp-lease       the harness's DHCP responder (vmnet), on a TAP in a namespace this run
                   owns, leased the planned address to the guest's dhclient
  dhclient-release ` + "`dhclient -r`" + ` answers on its own SSH session and eth0 keeps its address
                   (the image's RELEASE hook)
  kill-9           vmchaos-writer acks markers, then QEMU gets SIGKILL by its pid
  seed-static      the second boot takes a static seed: the planned address for good, the
                   default route, no dhclient
  kill-9-cut       every marker acked before the kill is on the disk the guest booted from
                   (ledger cut rules: nothing lost, no holes)
  writer           a second writer session continues after the highest marker on disk
  clean-shutdown   systemctl poweroff: QEMU exits 0, the console says "Power down"
  acked-on-image   e2fsck finds the image clean and debugfs finds every acked marker in
                   the image file itself

The disk is a copy of --image attached with cache=none (writethrough where the file system
has no O_DIRECT), so a guest fsync is a host fsync of the image. Boot times go to the last
lines. Exit status: 0 every check passed, 1 a check failed, 2 the check could not run (the
reason names what is missing: root, qemu-system-x86, the image). Each boot takes minutes
under TCG (4 to 6.5 minutes in all on a loaded two-core machine); make image-check runs it.`,
		Example: `  sudo vmchaos image real && sudo vmchaos image check
  sudo vmchaos image check --kernel /srv/pvm/vmlinux --keep --json check.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Log = cmd.OutOrStdout()
			return runImageCheck(cmd, o, jsonOut)
		},
	}
	f := c.Flags()
	f.StringVar(&o.ImageDir, "image-dir", realch.DefaultImageDir, "where vmchaos image real wrote guest.raw, vmlinux, initrd.img")
	f.StringVar(&o.Image, "image", "", "raw guest disk (default IMAGE-DIR/guest.raw); the check boots a copy")
	f.StringVar(&o.Kernel, "kernel", "", "kernel to boot: a PVH vmlinux or a bzImage (default IMAGE-DIR/vmlinux)")
	f.StringVar(&o.Initramfs, "initrd", "", "initramfs (default IMAGE-DIR/initrd.img)")
	f.StringVar(&o.Cmdline, "cmdline", "", "kernel command line (default the image manifest's)")
	f.StringVar(&o.QEMU, "qemu", "", "emulator (default $"+qemucheck.EnvQEMU+", else "+qemucheck.DefaultQEMU+" on PATH)")
	f.IntVar(&o.CPUs, "cpus", 1, "guest vCPUs (TCG threads)")
	f.IntVar(&o.MemoryMiB, "memory-mib", 1024, "guest memory in MiB")
	f.IntVar(&o.Markers, "markers", 20, "writer acks to wait for in each session")
	f.Float64Var(&o.Rate, "rate", 20, "writer markers per second")
	f.DurationVar(&o.BootTimeout, "boot-timeout", 10*time.Minute, "bound on each boot to SSH")
	f.StringVar(&o.WorkDir, "work-dir", "", "keep the disk copy, seeds, serial logs and journal here (default a temporary dir under /var/tmp, removed)")
	f.BoolVar(&o.Keep, "keep", false, "keep the temporary work dir")
	f.StringVar(&jsonOut, "json", "", "also write the report (checks, boot times) as JSON to this file")
	return c
}

// checkExit is the exit status of a check that ran (1) or could not (2).
type checkExit struct {
	err  error
	code int
}

func (e checkExit) Error() string { return e.err.Error() }
func (e checkExit) ExitCode() int { return e.code }

func runImageCheck(cmd *cobra.Command, o qemucheck.Options, jsonOut string) error {
	out := cmd.OutOrStdout()
	start := time.Now()
	// Ctrl-C ends the run through its context, so QEMU is killed and the
	// namespace deleted on the way out.
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := qemucheck.Run(ctx, o)
	if err != nil {
		code := 1
		if errors.Is(err, qemucheck.ErrMissing) {
			code = 2
		}
		return checkExit{err: err, code: code}
	}
	for _, b := range rep.Boots {
		fmt.Fprintf(out, "boot %-6s kernel %.1fs, userspace %.1fs, systemd %.1fs, SSH %.1fs (from QEMU's start, TCG)\n",
			b.Seed, b.Kernel.Seconds(), b.Userspace.Seconds(), b.Systemd.Seconds(), b.SSH.Seconds())
	}
	if o.Keep || o.WorkDir != "" {
		fmt.Fprintf(out, "work dir kept: %s\n", rep.Dir)
	}
	if jsonOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := durable.WriteFile(jsonOut, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("image check: %w", err)
		}
	}
	fmt.Fprintf(out, "image check: %d checks, %d failed, in %s\n", len(rep.Checks), len(rep.Failed()), time.Since(start).Round(time.Second))
	if !rep.OK() {
		return checkExit{err: fmt.Errorf("image check: failed: %s", strings.Join(rep.Failed(), ", ")), code: 1}
	}
	return nil
}
