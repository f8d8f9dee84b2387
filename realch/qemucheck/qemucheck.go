// Package qemucheck boots the real guest image (`vmchaos image real`) under
// QEMU's software emulation (TCG: no KVM needed) and proves the guest half
// of the real backend on any Linux host: the kernel and initramfs reach
// userspace, the NoCloud seed realch writes is applied (hostname, root's key,
// the SSH host key, DHCP and then static network config), sshd answers with
// the host key pinned from the seed, the harness's DHCP responder leases the
// address to the guest's dhclient over a TAP in a namespace the run owns
// (docs/architecture.md §13), the dhclient RELEASE hook keeps the address, and vmchaos-writer's acked
// markers survive a kill -9 of the emulator and a clean shutdown, read back
// by the ledger's cut rules (docs/architecture.md §8) from the guest and
// from the image file itself. `vmchaos image check` runs it.
//
// It exists because this project's own machines serve /dev/kvm from kvm_pvm,
// on which no stock guest kernel reaches userspace (docs/realch.md, "PVM
// hosts"): without it the guest half would first run on a user's KVM runner.
package qemucheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/cidata"
	"github.com/vmchaos/vmchaos/realch"
)

// Options configure one check.
type Options struct {
	// ImageDir holds guest.raw, vmlinux, initrd.img and image-real.json
	// as `vmchaos image real` writes them; default realch.DefaultImageDir.
	ImageDir string
	// Image, Kernel, Initramfs override the files of ImageDir (Kernel: a
	// PVH vmlinux or a bzImage).
	Image, Kernel, Initramfs string
	// Cmdline: default the manifest's, else cidata.DefaultCmdline.
	Cmdline string
	// QEMU is the emulator; default $VMCHAOS_QEMU, else
	// qemu-system-x86_64 on PATH.
	QEMU string
	// WorkDir holds the disk copy, seeds, serial logs and the journal;
	// default a new directory under /var/tmp, removed unless Keep.
	WorkDir string
	Keep    bool
	// CPUs and MemoryMiB of the guest: default 1 and 1024.
	CPUs      int
	MemoryMiB int
	// Markers is how many writer acks each session waits for: default 20.
	Markers int
	// Rate is the writer's markers per second: default 20.
	Rate float64
	// BootTimeout bounds each boot to SSH: default 10 min (TCG on a
	// loaded two-core machine).
	BootTimeout time.Duration
	// Log gets one line per step and per check (nil: discarded).
	Log io.Writer
}

// EnvQEMU names the emulator binary when Options.QEMU is empty.
const EnvQEMU = "VMCHAOS_QEMU"

// EnvRun=1 lets the Go test run the whole check (make image-check): it
// takes minutes, too long for make test.
const EnvRun = "VMCHAOS_IMAGE_CHECK"

// DefaultQEMU is looked up on PATH (Debian's qemu-system-x86).
const DefaultQEMU = "qemu-system-x86_64"

func (o *Options) defaults() error {
	if o.ImageDir == "" {
		o.ImageDir = realch.DefaultImageDir
	}
	for _, f := range []struct {
		p    *string
		name string
	}{{&o.Image, realch.ImageRaw}, {&o.Kernel, realch.ImageKernel}, {&o.Initramfs, realch.ImageInitramfs}} {
		if *f.p == "" {
			*f.p = filepath.Join(o.ImageDir, f.name)
		}
	}
	if o.Cmdline == "" {
		o.Cmdline = manifestCmdline(o.ImageDir)
	}
	if o.QEMU == "" {
		o.QEMU = os.Getenv(EnvQEMU)
	}
	if o.QEMU == "" {
		o.QEMU = DefaultQEMU
	}
	o.CPUs = max(o.CPUs, 1)
	if o.MemoryMiB <= 0 {
		o.MemoryMiB = 1024
	}
	if o.Markers <= 0 {
		o.Markers = 20
	}
	if o.Rate <= 0 {
		o.Rate = 20
	}
	if o.BootTimeout <= 0 {
		o.BootTimeout = 10 * time.Minute
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return nil
}

// manifestCmdline is the command line the image was built for.
func manifestCmdline(dir string) string {
	var info realch.ImageInfo
	b, err := os.ReadFile(filepath.Join(dir, realch.ImageManifest))
	if err == nil && json.Unmarshal(b, &info) == nil && info.Cmdline != "" {
		return info.Cmdline
	}
	return cidata.DefaultCmdline
}

// ErrMissing wraps what the host lacks for the check (the emulator, the
// image, root): the caller skips or tells the user how to get it.
var ErrMissing = errors.New("image check: missing")

// Missing says what the host lacks for the check, each item with how to
// get it; "" when nothing. The Go test skips with it.
func Missing(o Options) string {
	_ = o.defaults()
	var miss []string
	if os.Geteuid() != 0 {
		miss = append(miss, "root (a network namespace, a TAP, DHCP on port 67)")
	}
	if _, err := exec.LookPath(o.QEMU); err != nil {
		miss = append(miss, fmt.Sprintf("%s (apt-get install qemu-system-x86, or scripts/setup.sh; or set %s)", o.QEMU, EnvQEMU))
	}
	for _, t := range []string{"ip", "debugfs", "e2fsck", "cp"} {
		if _, err := exec.LookPath(t); err != nil {
			miss = append(miss, t+" (iproute2, e2fsprogs, coreutils)")
		}
	}
	for _, p := range []string{o.Image, o.Kernel, o.Initramfs} {
		if _, err := os.Stat(p); err != nil {
			miss = append(miss, p+" (build the guest: sudo vmchaos image real)")
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		miss = append(miss, "/dev/net/tun (TAP devices)")
	}
	return strings.Join(miss, "; ")
}

// Check is one verdict with its evidence.
type Check struct {
	Name     string `json:"name"`
	OK       bool   `json:"ok"`
	Evidence string `json:"evidence"`
}

// Boot is one boot's timeline, from QEMU's start.
type Boot struct {
	Seed      string        `json:"seed"` // dhcp or static
	Kernel    time.Duration `json:"kernel_ns"`
	Userspace time.Duration `json:"userspace_ns"` // the initramfs's /init runs
	Systemd   time.Duration `json:"systemd_ns"`   // systemd from the root file system
	SSH       time.Duration `json:"ssh_ns"`       // the first command answered over SSH
}

// Report is what one check found.
type Report struct {
	Checks []Check `json:"checks"`
	Boots  []Boot  `json:"boots"`
	Dir    string  `json:"dir"` // the work dir (kept with Options.Keep)
}

// OK is true when every check passed (and there was at least one).
func (r *Report) OK() bool {
	if len(r.Checks) == 0 {
		return false
	}
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return true
}

// Failed lists the failed checks' names.
func (r *Report) Failed() []string {
	var f []string
	for _, c := range r.Checks {
		if !c.OK {
			f = append(f, c.Name)
		}
	}
	return f
}
