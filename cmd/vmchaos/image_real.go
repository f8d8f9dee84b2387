package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/realch"
)

func newImageRealCmd() *cobra.Command {
	var o realch.ImageOptions
	var quiet bool
	var kernel string
	c := &cobra.Command{
		Use:   "real [-o DIR]",
		Short: "Build a bootable Debian guest for real cloud-hypervisor (debootstrap; root, network to the Debian mirror)",
		Long: `Builds a guest for the real backend from Debian packages only: debootstrap (minbase) of the
suite with systemd, the Debian cloud kernel, openssh-server, isc-dhcp-client and iproute2, plus
vmchaos-seed, a small shell agent that applies the NoCloud seed realch writes (hostname, root's
SSH key, host keys made on first boot, static address by MAC or DHCP on every NIC, hot-plugged
ones included), and the workload writer vmchaos-writer at /usr/local/bin (the static binary
` + "`make build`" + ` puts next to vmchaos, or --writer; its digest is in the cache key). Writes to -o:

  guest.raw     sparse raw disk, MBR, ext4 root on the first partition (root=/dev/vda1)
  vmlinuz       the Debian kernel (bzImage: cloud-hypervisor loads it with --kernel)
  initrd.img    initramfs with the virtio drivers
  image-real.json  the manifest: every package and version, sizes, sha256s, build time
  guest.qcow2   with --qcow2 (always made in the cache)

With --kernel PATH the guest boots that kernel instead (an uncompressed vmlinux, say a PVM
guest kernel for a kvm_pvm host: CONFIG_PVM_GUEST=y and CONFIG_X86_PIE=y). It is read first and
said whether it is a PVM guest (from its embedded IKCONFIG; "unknown" without one), then written
to -o as vmlinux over the Debian one; the manifest still describes the Debian kernel, and the
Debian initrd carries that kernel's modules only, so build the virtio drivers in.

realch's discovery finds these in /var/lib/vmchaos/images without any variable. The result is
cached under --cache-dir by a key made of the recipe and the sha256 of the suite's package index
(the package versions): a second run with an unchanged archive copies the cached image. Host
tools (debootstrap, qemu-utils, e2fsprogs) are installed with apt-get when missing.`,
		Example: `  sudo vmchaos image real
  sudo vmchaos image real -o /srv/vmchaos --size-mib 4096 --qcow2
  VMCHAOS_KERNEL=/srv/vmchaos/vmlinuz VMCHAOS_INITRAMFS=/srv/vmchaos/initrd.img \
    VMCHAOS_GUEST_IMAGE=/srv/vmchaos/guest.raw vmchaos doctor`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !quiet {
				o.Log = cmd.ErrOrStderr()
			}
			return runImageReal(cmd, o, kernel, quiet)
		},
	}
	f := c.Flags()
	f.StringVarP(&o.OutDir, "out", "o", realch.DefaultImageDir, "directory for guest.raw, vmlinuz, initrd.img, image-real.json")
	f.StringVar(&o.CacheDir, "cache-dir", realch.DefaultImageCache, "built images by key, and debootstrap's .deb cache")
	f.StringVar(&o.Suite, "suite", realch.DefaultSuite, "Debian suite")
	f.StringVar(&o.Mirror, "mirror", realch.DefaultMirror, "Debian mirror")
	f.IntVar(&o.SizeMiB, "size-mib", realch.DefaultImageMiB, "disk size in MiB (sparse)")
	f.BoolVar(&o.QCOW2, "qcow2", false, "also write guest.qcow2 to -o (discovery prefers it over guest.raw)")
	f.BoolVar(&o.Rebuild, "rebuild", false, "build even when the cache holds this key")
	f.StringVar(&o.Writer, "writer", "", "the static vmchaos-writer binary to install (default: the one next to this vmchaos binary)")
	f.BoolVarP(&quiet, "quiet", "q", false, "no build log on stderr")
	f.StringVar(&kernel, "kernel", "", "boot this guest kernel (vmlinux) instead of the Debian one, e.g. a PVM guest kernel for a kvm_pvm host")
	return c
}

// runImageReal builds (or copies from the cache) the image, and with a
// --kernel installs the user's kernel in it after saying what it is.
func runImageReal(cmd *cobra.Command, o realch.ImageOptions, kernel string, quiet bool) error {
	out := cmd.OutOrStdout()
	if kernel != "" {
		k, err := realch.InspectKernel(kernel)
		if err != nil {
			return fmt.Errorf("image real --kernel: %w", err)
		}
		fmt.Fprintf(out, "image real: --kernel %s\n", k)
	}
	start := time.Now()
	res, err := realch.BuildImage(cmd.Context(), o)
	if err != nil {
		return err
	}
	if kernel != "" {
		if err := installKernel(kernel, res.Kernel); err != nil {
			return fmt.Errorf("image real --kernel: %w", err)
		}
		fmt.Fprintf(out, "image real: %s installed as %s (replacing the Debian kernel)\n", kernel, res.Kernel)
	}
	from := "built"
	if res.Cached {
		from = "cached"
	}
	i := res.Info
	fmt.Fprintf(out, "image real: %s in %s (build took %.0fs), key %s\n", from, time.Since(start).Round(time.Second), i.BuildSeconds, i.Key)
	fmt.Fprintf(out, "  debian %s from %s, package index sha256 %s\n", i.Suite, i.Mirror, i.PackagesIndex)
	fmt.Fprintf(out, "  kernel %s, cmdline %q\n", i.Kernel, i.Cmdline)
	var names []string
	for _, p := range i.Packages {
		names = append(names, p.Name+"="+p.Version)
	}
	fmt.Fprintf(out, "  %d packages (requested: %s); all in %s\n", len(i.Packages), strings.Join(i.Requested, " "), realch.ImageManifest)
	for _, f := range []struct{ name, path string }{
		{realch.ImageRaw, res.Raw}, {realch.ImageKernel, res.Kernel}, {realch.ImageInitramfs, res.Initramfs}, {realch.ImageQCOW2, res.QCOW2},
	} {
		if f.path == "" {
			continue
		}
		fi := i.Files[f.name]
		fmt.Fprintf(out, "  %-12s %s  %d MiB (%d MiB allocated)  sha256 %s\n", f.name, f.path, fi.Bytes>>20, fi.Allocated>>20, fi.SHA256[:16])
	}
	if !quiet {
		fmt.Fprintf(cmd.ErrOrStderr(), "packages: %s\n", strings.Join(names, " "))
	}
	return nil
}

// installKernel copies the user's kernel over the image's, durably: the
// preflight and `vmchaos doctor` read it back from there.
func installKernel(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return durable.SyncDir(filepath.Dir(dst))
}
