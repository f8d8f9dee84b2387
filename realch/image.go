package realch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/cidata"
	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/ledger/writerproto"
)

// The guest half of the seed (vmchaos-seed, its units, the udev rule and
// the dhclient hook) goes into every image as it is in realch/guest.
//
//go:embed guest
var guestFiles embed.FS

// imageRecipe names this recipe in the cache key: bump it when the build
// steps change, so a cached image from older steps is not reused.
const imageRecipe = "vmchaos-image-real/3"

// ImagePackages are what debootstrap installs on top of Debian's minbase:
// systemd as init (udev runs the NIC hotplug rule), the cloud kernel and
// initramfs-tools, sshd, and dhclient (the agent's `dhclient -r`).
var ImagePackages = []string{
	"systemd-sysv", "udev", "kmod", "linux-image-cloud-amd64", "initramfs-tools",
	"openssh-server", "isc-dhcp-client", "iproute2", "procps",
}

// initramfsModules are loaded by the initramfs so the root on the virtio
// disk mounts (MODULES=list: a small initrd that boots in a second).
var initramfsModules = []string{"virtio_pci", "virtio_blk", "virtio_net", "ext4", "vfat", "nls_cp437", "nls_iso8859_1"}

// Defaults of ImageOptions.
const (
	DefaultImageDir   = "/var/lib/vmchaos/images"
	DefaultImageCache = "/var/cache/vmchaos/image-real"
	DefaultSuite      = "bookworm"
	DefaultMirror     = "http://deb.debian.org/debian"
	DefaultImageMiB   = 2048
	// rootOffset is where the root partition starts (sector 2048, as fdisk).
	rootOffset = 1 << 20
)

// Output names in ImageOptions.OutDir and in the cache. The kernel and
// initramfs are found by Discover next to the image.
const (
	ImageRaw       = "guest.raw"
	ImageQCOW2     = "guest.qcow2"
	ImageKernel    = "vmlinux" // PVH ELF, extracted from the bzImage
	ImageBzImage   = "vmlinuz" // the Debian bzImage as packaged (CH v53 boots it too, slower)
	ImageInitramfs = "initrd.img"
	ImageManifest  = "image-real.json"
	// ImageWriter is the guest workload writer (cmd/vmchaos-writer) the
	// image installs at GuestWriterPath; a copy stays in the cache entry so
	// the manifest lists its digest.
	ImageWriter = writerproto.Cmd
)

// GuestWriterPath is where the image installs the workload writer (on the
// root's PATH over SSH, as the ledger runs it).
const GuestWriterPath = "/usr/local/bin/" + writerproto.Cmd

// ImageOptions say what `vmchaos image real` builds and where.
type ImageOptions struct {
	OutDir   string // default DefaultImageDir
	CacheDir string // default DefaultImageCache: built images by key, and debootstrap's .deb cache
	Suite    string // Debian suite, default bookworm
	Mirror   string // default DefaultMirror
	SizeMiB  int    // disk size (sparse), default DefaultImageMiB
	QCOW2    bool   // also put guest.qcow2 in OutDir (it is always made in the cache)
	Rebuild  bool   // ignore a cached image with the same key
	// Writer is the static vmchaos-writer binary to install; default: the
	// one next to the running executable (bin/ after `make build`).
	Writer string
	Log    io.Writer

	writer []byte // Writer's content, read once: the key and the image hold the same bytes
}

// PackageVersion is one installed Debian package.
type PackageVersion struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// ImageFile is one output with its size and digest.
type ImageFile struct {
	Bytes     int64  `json:"bytes"`
	Allocated int64  `json:"allocated_bytes"` // on disk (the raw image is sparse)
	SHA256    string `json:"sha256"`
}

// ImageInfo is the manifest written next to the outputs: which recipe and
// archive state made them, the packages they hold, and what it cost.
type ImageInfo struct {
	Recipe        string               `json:"recipe"`
	Key           string               `json:"key"`
	Suite         string               `json:"suite"`
	Mirror        string               `json:"mirror"`
	PackagesIndex string               `json:"packages_index_sha256"` // main/binary-amd64/Packages.xz of the suite's InRelease
	Requested     []string             `json:"requested_packages"`
	Kernel        string               `json:"kernel_release"`
	Cmdline       string               `json:"cmdline"`
	SizeMiB       int                  `json:"disk_mib"`
	Packages      []PackageVersion     `json:"packages"`
	Files         map[string]ImageFile `json:"files"`
	BuildSeconds  float64              `json:"build_seconds"`
	BuiltAt       time.Time            `json:"built_at"`
}

// ImageResult is where the outputs are and whether they came from the cache.
type ImageResult struct {
	Info                          ImageInfo
	Dir                           string // OutDir
	Raw, QCOW2, Kernel, Initramfs string // in OutDir (QCOW2 only with ImageOptions.QCOW2)
	CacheDir                      string // the cache entry
	Cached                        bool
}

func (o *ImageOptions) defaults() {
	if o.OutDir == "" {
		o.OutDir = DefaultImageDir
	}
	if o.CacheDir == "" {
		o.CacheDir = DefaultImageCache
	}
	if o.Suite == "" {
		o.Suite = DefaultSuite
	}
	if o.Mirror == "" {
		o.Mirror = DefaultMirror
	}
	if o.SizeMiB == 0 {
		o.SizeMiB = DefaultImageMiB
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
}

// findWriter resolves o.Writer (default: next to the running executable)
// and checks it is there: an image without it cannot run the workload.
func (o *ImageOptions) findWriter() error {
	if o.Writer == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("image real: the workload writer: %w", err)
		}
		o.Writer = filepath.Join(filepath.Dir(exe), ImageWriter)
	}
	fi, err := os.Stat(o.Writer)
	if err == nil && !fi.Mode().IsRegular() {
		err = errors.New("not a regular file")
	}
	if err == nil {
		o.writer, err = os.ReadFile(o.Writer)
	}
	if err != nil {
		return fmt.Errorf("image real: the guest workload writer %s is missing (`make build` puts bin/%s next to bin/vmchaos; or give --writer PATH): %v",
			o.Writer, ImageWriter, err)
	}
	return nil
}

// imageTools are the host commands the build runs and the Debian packages
// that provide them.
var imageTools = []struct{ bin, pkg string }{
	{"debootstrap", "debootstrap"},
	{"qemu-img", "qemu-utils"},
	{"mkfs.ext4", "e2fsprogs"},
	{"/usr/lib/apt/apt-helper", "apt"},
	{"lz4", "lz4"}, // Debian's x86 kernels are LZ4-compressed bzImages
	{"xz", "xz-utils"},
	{"zstd", "zstd"},
}

// BuildImage builds (or takes from the cache) a guest for real CH: a raw
// disk whose first partition is an ext4 root made by debootstrap from
// Debian packages, the Debian cloud kernel (a bzImage, which CH loads
// directly) and a small initramfs with the virtio drivers. The cache key is
// the recipe plus the sha256 of the suite's package index (so the package
// versions): the same key means the same packages.
func BuildImage(ctx context.Context, o ImageOptions) (*ImageResult, error) {
	o.defaults()
	if os.Geteuid() != 0 {
		return nil, errors.New("image real: needs root (debootstrap, chroot)")
	}
	if o.SizeMiB < 512 {
		return nil, fmt.Errorf("image real: size %d MiB: want at least 512", o.SizeMiB)
	}
	if err := o.findWriter(); err != nil {
		return nil, err
	}
	if err := ensureImageTools(ctx, o.Log); err != nil {
		return nil, err
	}
	index, err := packagesIndex(ctx, o)
	if err != nil {
		return nil, err
	}
	key, err := imageKey(o, index)
	if err != nil {
		return nil, err
	}
	entry := filepath.Join(o.CacheDir, key)
	res := &ImageResult{Dir: o.OutDir, CacheDir: entry}
	info, err := readImageInfo(entry)
	switch {
	case err == nil && !o.Rebuild:
		res.Cached = true
		fmt.Fprintf(o.Log, "image real: cached %s\n", entry)
	default:
		if info, err = buildImage(ctx, o, entry, key, index); err != nil {
			return nil, err
		}
	}
	res.Info = *info
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("image real: %w", err)
	}
	outs := []string{ImageRaw, ImageKernel, ImageInitramfs, ImageManifest}
	if o.QCOW2 {
		outs = append(outs, ImageQCOW2)
	}
	for _, name := range outs {
		if err := copySparse(ctx, filepath.Join(entry, name), filepath.Join(o.OutDir, name)); err != nil {
			return nil, fmt.Errorf("image real: %w", err)
		}
	}
	res.Raw = filepath.Join(o.OutDir, ImageRaw)
	res.Kernel = filepath.Join(o.OutDir, ImageKernel)
	res.Initramfs = filepath.Join(o.OutDir, ImageInitramfs)
	if o.QCOW2 {
		res.QCOW2 = filepath.Join(o.OutDir, ImageQCOW2)
	}
	return res, durable.SyncDir(o.OutDir)
}

// ensureImageTools installs the build's host tools with apt-get when one
// is missing (after `apt-get update`: a stale list cannot install).
func ensureImageTools(ctx context.Context, log io.Writer) error {
	var pkgs []string
	for _, t := range imageTools {
		if _, err := exec.LookPath(t.bin); err != nil {
			pkgs = append(pkgs, t.pkg)
		}
	}
	if len(pkgs) == 0 {
		return nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("image real: missing host packages %s and no apt-get to install them", strings.Join(pkgs, ", "))
	}
	fmt.Fprintf(log, "image real: installing host packages: %s\n", strings.Join(pkgs, " "))
	if err := runLogged(ctx, log, "", "apt-get", "update", "-q"); err != nil {
		return fmt.Errorf("image real: %w", err)
	}
	args := append([]string{"install", "-y", "-q", "--no-install-recommends"}, pkgs...)
	if err := runLogged(ctx, log, "", "apt-get", args...); err != nil {
		return fmt.Errorf("image real: %w", err)
	}
	return nil
}

// packagesIndex downloads the suite's InRelease with apt's own helper and
// returns the sha256 it lists for main/binary-amd64/Packages.xz: a digest
// of every package version debootstrap can pick.
func packagesIndex(ctx context.Context, o ImageOptions) (string, error) {
	u, err := url.Parse(o.Mirror)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("image real: mirror %q: want an http(s) URL", o.Mirror)
	}
	tmp, err := os.MkdirTemp("", "vmchaos-inrelease-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	dst := filepath.Join(tmp, "InRelease")
	src := strings.TrimSuffix(o.Mirror, "/") + "/dists/" + o.Suite + "/InRelease"
	if err := runLogged(ctx, io.Discard, "", "/usr/lib/apt/apt-helper", "download-file", src, dst); err != nil {
		return "", fmt.Errorf("image real: fetch %s: %w", src, err)
	}
	b, err := os.ReadFile(dst)
	if err != nil {
		return "", err
	}
	return parseInRelease(b)
}

// parseInRelease finds the SHA256 line of main/binary-amd64/Packages.xz.
func parseInRelease(b []byte) (string, error) {
	inSHA := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, " ") {
			inSHA = strings.HasPrefix(line, "SHA256:")
			continue
		}
		f := strings.Fields(line)
		if inSHA && len(f) == 3 && f[2] == "main/binary-amd64/Packages.xz" && len(f[0]) == 64 {
			return f[0], nil
		}
	}
	return "", errors.New("image real: InRelease lists no SHA256 for main/binary-amd64/Packages.xz")
}

// imageKey digests everything the image is made of.
func imageKey(o ImageOptions, index string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n%d\n", imageRecipe, o.Suite, o.Mirror, index, o.SizeMiB)
	fmt.Fprintf(h, "%s\n%s\n", strings.Join(ImagePackages, ","), strings.Join(initramfsModules, ","))
	err := fs.WalkDir(guestFiles, "guest", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := guestFiles.ReadFile(p)
		fmt.Fprintf(h, "%s %d\n", p, len(b))
		h.Write(b)
		return err
	})
	if err != nil {
		return "", err
	}
	// a changed writer is another image
	if o.writer == nil {
		return "", errors.New("image real: the workload writer was not read (findWriter)")
	}
	fmt.Fprintf(h, "writer %x\n", sha256.Sum256(o.writer))
	return o.Suite + "-" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

func readImageInfo(dir string) (*ImageInfo, error) {
	b, err := os.ReadFile(filepath.Join(dir, ImageManifest))
	if err != nil {
		return nil, err
	}
	var info ImageInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("image real: %s: %w", dir, err)
	}
	for name, f := range info.Files {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Size() != f.Bytes {
			return nil, fmt.Errorf("image real: cache entry %s: %s missing or truncated", dir, name)
		}
	}
	return &info, nil
}

// buildImage runs the recipe into a temporary dir next to the cache entry
// and renames it into place when everything is written.
func buildImage(ctx context.Context, o ImageOptions, entry, key, index string) (*ImageInfo, error) {
	start := time.Now()
	if err := os.MkdirAll(filepath.Join(o.CacheDir, "debs"), 0o755); err != nil {
		return nil, fmt.Errorf("image real: %w", err)
	}
	work, err := os.MkdirTemp(o.CacheDir, key+".build-")
	if err != nil {
		return nil, fmt.Errorf("image real: %w", err)
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "root")
	step := func(what string) {
		fmt.Fprintf(o.Log, "image real: %s (%s)\n", what, time.Since(start).Round(time.Second))
	}

	step("debootstrap " + o.Suite)
	if err := runLogged(ctx, o.Log, "", "debootstrap", "--variant=minbase",
		"--include="+strings.Join(ImagePackages, ","), "--cache-dir="+filepath.Join(o.CacheDir, "debs"),
		o.Suite, root, o.Mirror); err != nil {
		return nil, fmt.Errorf("image real: debootstrap: %w", err)
	}
	step("configure the guest")
	if err := configureGuest(root, o.writer); err != nil {
		return nil, fmt.Errorf("image real: configure: %w", err)
	}
	kver, err := bootFiles(ctx, o.Log, root, work, step)
	if err != nil {
		return nil, err
	}
	pkgs, err := installedPackages(ctx, root)
	if err != nil {
		return nil, err
	}
	if err := scrubGuest(root); err != nil {
		return nil, fmt.Errorf("image real: scrub: %w", err)
	}
	step("root file system")
	raw := filepath.Join(work, ImageRaw)
	if err := makeDisk(ctx, o.Log, root, raw, o.SizeMiB, key); err != nil {
		return nil, err
	}
	step("qcow2")
	if err := runLogged(ctx, o.Log, "", "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, filepath.Join(work, ImageQCOW2)); err != nil {
		return nil, fmt.Errorf("image real: qemu-img: %w", err)
	}
	if err := os.RemoveAll(root); err != nil {
		return nil, fmt.Errorf("image real: %w", err)
	}
	if err := writeFileMode(filepath.Join(work, ImageWriter), o.writer, 0o755); err != nil {
		return nil, fmt.Errorf("image real: %w", err)
	}
	info := &ImageInfo{
		Recipe: imageRecipe, Key: key, Suite: o.Suite, Mirror: o.Mirror, PackagesIndex: index,
		Requested: ImagePackages, Kernel: kver, Cmdline: cidata.DefaultCmdline, SizeMiB: o.SizeMiB,
		Packages: pkgs, Files: map[string]ImageFile{}, BuiltAt: time.Now().UTC().Truncate(time.Second),
	}
	if err := publishImage(info, work, entry, start); err != nil {
		return nil, err
	}
	step("done: " + entry)
	return info, durable.SyncDir(o.CacheDir)
}

// bootFiles makes the guest's initramfs and puts its bzImage, initramfs and
// the vmlinux inside the bzImage into work; it returns the kernel release.
func bootFiles(ctx context.Context, log io.Writer, root, work string, step func(string)) (string, error) {
	kver, err := kernelRelease(root)
	if err != nil {
		return "", err
	}
	step("initramfs for " + kver)
	if err := runLogged(ctx, log, "", "chroot", root, "update-initramfs", "-u", "-k", kver); err != nil {
		return "", fmt.Errorf("image real: update-initramfs: %w", err)
	}
	for _, c := range [][2]string{{"boot/vmlinuz-" + kver, ImageBzImage}, {"boot/initrd.img-" + kver, ImageInitramfs}} {
		if err := copySparse(ctx, filepath.Join(root, c[0]), filepath.Join(work, c[1])); err != nil {
			return "", fmt.Errorf("image real: %w", err)
		}
	}
	step("vmlinux from the bzImage")
	if err := ExtractVmlinux(ctx, filepath.Join(work, ImageBzImage), filepath.Join(work, ImageKernel)); err != nil {
		return "", fmt.Errorf("image real: %w", err)
	}
	return kver, nil
}

// publishImage writes the manifest into work, describing its outputs, and
// moves work into place as entry (replacing an older build).
func publishImage(info *ImageInfo, work, entry string, start time.Time) error {
	var err error
	if info.Files, err = describeOutputs(work); err != nil {
		return err
	}
	info.BuildSeconds = time.Since(start).Round(time.Second).Seconds()
	b, _ := json.MarshalIndent(info, "", "  ")
	if err := durable.WriteFile(filepath.Join(work, ImageManifest), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("image real: %w", err)
	}
	if err := os.RemoveAll(entry); err != nil {
		return fmt.Errorf("image real: %w", err)
	}
	if err := os.Rename(work, entry); err != nil {
		return fmt.Errorf("image real: %w", err)
	}
	return nil
}

// imageOutputs are the files of a cache entry the manifest describes.
var imageOutputs = []string{ImageRaw, ImageQCOW2, ImageKernel, ImageBzImage, ImageInitramfs, ImageWriter}

// describeOutputs is the manifest's file list of the cache entry in dir.
func describeOutputs(dir string) (map[string]ImageFile, error) {
	files := map[string]ImageFile{}
	for _, name := range imageOutputs {
		f, err := describeFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("image real: %w", err)
		}
		files[name] = f
	}
	return files, nil
}

// writeFileMode writes b to dst with mode perm (whatever the umask).
func writeFileMode(dst string, b []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(dst, b, perm); err != nil {
		return err
	}
	return os.Chmod(dst, perm) // WriteFile keeps an existing file's mode
}

// configureGuest installs the seed agent and the workload writer and makes
// the image a quiet, fast-booting VM guest.
func configureGuest(root string, writer []byte) error {
	if err := writeFileMode(filepath.Join(root, GuestWriterPath), writer, 0o755); err != nil {
		return fmt.Errorf("the workload writer: %w", err)
	}
	put := func(dst, src string, mode os.FileMode) error {
		b, err := guestFiles.ReadFile("guest/" + src)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, dst)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(root, dst), b, mode)
	}
	files := []struct {
		dst, src string
		mode     os.FileMode
	}{
		{"usr/local/sbin/vmchaos-seed", "vmchaos-seed", 0o755},
		{"etc/systemd/system/vmchaos-seed.service", "vmchaos-seed.service", 0o644},
		{"etc/systemd/system/vmchaos-net@.service", "vmchaos-net@.service", 0o644},
		{"etc/udev/rules.d/80-vmchaos-net.rules", "80-vmchaos-net.rules", 0o644},
		{"etc/dhcp/dhclient-enter-hooks.d/vmchaos-keep-address", "vmchaos-keep-address", 0o644},
	}
	for _, f := range files {
		if err := put(f.dst, f.src, f.mode); err != nil {
			return err
		}
	}
	links := map[string]string{
		"etc/systemd/system/multi-user.target.wants/vmchaos-seed.service": "/etc/systemd/system/vmchaos-seed.service",
		// eth0, eth1...: the udev rule and the seed's "e*" match them, and a
		// hot-plugged NIC's name does not depend on its PCI slot.
		"etc/systemd/network/99-default.link": "/dev/null",
		// Nothing to fetch on an isolated TAP; keep the guest quiet.
		"etc/systemd/system/apt-daily.timer":           "/dev/null",
		"etc/systemd/system/apt-daily-upgrade.timer":   "/dev/null",
		"etc/systemd/system/e2scrub_all.timer":         "/dev/null",
		"etc/systemd/system/fstrim.timer":              "/dev/null",
		"etc/systemd/system/systemd-timesyncd.service": "/dev/null",
	}
	for l, target := range links {
		p := filepath.Join(root, l)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		_ = os.Remove(p)
		if err := os.Symlink(target, p); err != nil {
			return err
		}
	}
	writes := map[string]string{
		"etc/fstab":                   "LABEL=vmchaos-root / ext4 rw,errors=remount-ro 0 1\n",
		"etc/hostname":                "vmchaos\n",
		"etc/hosts":                   "127.0.0.1\tlocalhost\n127.0.1.1\tvmchaos\n",
		"etc/initramfs-tools/modules": strings.Join(initramfsModules, "\n") + "\n",
		"etc/initramfs-tools/conf.d/vmchaos.conf": "MODULES=list\nCOMPRESS=gzip\n",
		"etc/ssh/sshd_config.d/vmchaos.conf":      "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n",
	}
	for p, s := range writes {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// scrubGuest removes what must differ per VM (host keys: vmchaos-seed
// makes them on first boot; machine-id: systemd makes it) and what only
// the build needed.
func scrubGuest(root string) error {
	keys, _ := filepath.Glob(filepath.Join(root, "etc/ssh/ssh_host_*"))
	debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb"))
	lists, _ := filepath.Glob(filepath.Join(root, "var/lib/apt/lists/*_*"))
	logs, _ := filepath.Glob(filepath.Join(root, "var/log/*.log"))
	for _, p := range slices.Concat(keys, debs, lists, logs) {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	for _, p := range []string{"etc/machine-id", "var/lib/dbus/machine-id"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			if err := os.WriteFile(filepath.Join(root, p), nil, 0o444); err != nil {
				return err
			}
		}
	}
	return nil
}

// kernelRelease is the one kernel debootstrap installed.
func kernelRelease(root string) (string, error) {
	ks, _ := filepath.Glob(filepath.Join(root, "boot/vmlinuz-*"))
	if len(ks) != 1 {
		return "", fmt.Errorf("image real: want one kernel in /boot, found %d", len(ks))
	}
	return strings.TrimPrefix(filepath.Base(ks[0]), "vmlinuz-"), nil
}

func installedPackages(ctx context.Context, root string) ([]PackageVersion, error) {
	var out bytes.Buffer
	if err := runLogged(ctx, &out, "", "dpkg-query", "--admindir="+filepath.Join(root, "var/lib/dpkg"), "-W", "-f", "${Package} ${Version}\n"); err != nil {
		return nil, fmt.Errorf("image real: dpkg-query: %w", err)
	}
	var pkgs []PackageVersion
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if name, v, ok := strings.Cut(line, " "); ok {
			pkgs = append(pkgs, PackageVersion{Name: name, Version: v})
		}
	}
	return pkgs, nil
}

// makeDisk writes a sparse raw disk: an MBR with one Linux partition at
// 1 MiB (root=/dev/vda1, cidata.DefaultCmdline) holding an ext4 made from root by
// mkfs.ext4 -d (no loop device, no mount). The file system's UUID and hash
// seed come from the key and its timestamps from a fixed time, so the same
// tree gives the same file system.
func makeDisk(ctx context.Context, log io.Writer, root, path string, sizeMiB int, key string) error {
	size := int64(sizeMiB) << 20
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("image real: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("image real: %w", err)
	}
	if _, err := f.WriteAt(mbr(size), 0); err != nil {
		return fmt.Errorf("image real: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("image real: %w", err)
	}
	sum := sha256.Sum256([]byte(key))
	u := hex.EncodeToString(sum[:16])
	uuid := u[0:8] + "-" + u[8:12] + "-4" + u[13:16] + "-8" + u[17:20] + "-" + u[20:32]
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "vmchaos-root", "-U", uuid,
		"-E", fmt.Sprintf("offset=%d,hash_seed=%s,root_owner=0:0", rootOffset, uuid),
		"-d", root, path, fmt.Sprintf("%dk", (size-rootOffset)>>10))
	cmd.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME=1700000000")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("image real: mkfs.ext4: %w", err)
	}
	return nil
}

// mbr is a DOS partition table with one bootable-agnostic Linux partition
// from rootOffset to the end of the disk.
func mbr(size int64) []byte {
	b := make([]byte, 512)
	binary.LittleEndian.PutUint32(b[440:], 0x766d6368) // disk signature "vmch"
	p := b[446:462]
	p[4] = 0x83 // Linux
	// CHS fields: "use LBA" (0xfe,0xff,0xff) as fdisk writes for large disks.
	copy(p[1:4], []byte{0xfe, 0xff, 0xff})
	copy(p[5:8], []byte{0xfe, 0xff, 0xff})
	binary.LittleEndian.PutUint32(p[8:], rootOffset/512)
	binary.LittleEndian.PutUint32(p[12:], uint32((size-rootOffset)/512))
	b[510], b[511] = 0x55, 0xaa
	return b
}

func describeFile(p string) (ImageFile, error) {
	f, err := os.Open(p)
	if err != nil {
		return ImageFile{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return ImageFile{}, err
	}
	return ImageFile{Bytes: n, Allocated: allocated(p), SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// bzImage compression formats by the magic at the start of the payload,
// and the command that decompresses each to stdout.
var kernelCompressions = []struct {
	name  string
	magic []byte
	cmd   []string
}{
	{"gzip", []byte{0x1f, 0x8b}, []string{"gzip", "-dc"}},
	{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0}, []string{"xz", "-dc"}},
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}, []string{"zstd", "-dcq"}},
	{"lz4", []byte{0x02, 0x21, 0x4c, 0x18}, []string{"lz4", "-dc"}},
	{"bzip2", []byte("BZh"), []string{"bzip2", "-dc"}},
	{"lzma", []byte{0x5d, 0, 0}, []string{"xz", "--format=lzma", "-dc"}},
}

// bzImagePayload returns the compressed kernel inside a bzImage and its
// format, from the setup header (boot protocol 2.08+: payload_offset and
// payload_length, relative to the protected-mode code after the setup
// sectors).
func bzImagePayload(b []byte) ([]byte, int, error) {
	if len(b) < 0x250 || string(b[0x202:0x206]) != "HdrS" {
		return nil, -1, errors.New("not a bzImage (no HdrS setup header)")
	}
	if v := binary.LittleEndian.Uint16(b[0x206:]); v < 0x208 {
		return nil, -1, fmt.Errorf("bzImage boot protocol %#x has no payload fields (2.08+)", v)
	}
	setup := int(b[0x1f1])
	if setup == 0 {
		setup = 4
	}
	off := (setup+1)*512 + int(binary.LittleEndian.Uint32(b[0x248:]))
	n := int(binary.LittleEndian.Uint32(b[0x24c:]))
	if off < 0 || n <= 0 || off+n > len(b) {
		return nil, -1, fmt.Errorf("bzImage payload %d+%d outside the file (%d bytes)", off, n, len(b))
	}
	p := b[off : off+n]
	for i, c := range kernelCompressions {
		if bytes.HasPrefix(p, c.magic) {
			return p, i, nil
		}
	}
	return nil, -1, fmt.Errorf("bzImage payload: unknown compression (starts % x)", p[:min(8, len(p))])
}

// ExtractVmlinux writes the uncompressed ELF kernel inside a bzImage to
// dst: cloud-hypervisor boots it through its PVH entry point directly,
// without running the bzImage's decompressor in the guest.
func ExtractVmlinux(ctx context.Context, bzImage, dst string) error {
	b, err := os.ReadFile(bzImage)
	if err != nil {
		return fmt.Errorf("vmlinux: %w", err)
	}
	p, i, err := bzImagePayload(b)
	if err != nil {
		return fmt.Errorf("vmlinux: %s: %w", bzImage, err)
	}
	c := kernelCompressions[i]
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("vmlinux: %w", err)
	}
	defer out.Close()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, c.cmd[0], c.cmd[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(p), out, &stderr
	// Decompressors may complain about the padding after the stream; the
	// ELF check below is what decides.
	runErr := cmd.Run()
	if err := out.Sync(); err != nil {
		return fmt.Errorf("vmlinux: %w", err)
	}
	head := make([]byte, 4)
	if _, err := out.ReadAt(head, 0); err != nil || string(head) != "\x7fELF" {
		return fmt.Errorf("vmlinux: %s payload (%s) did not decompress to an ELF: %v %s", bzImage, c.name, runErr, stderr.Bytes())
	}
	return out.Close()
}

// allocated is how much of p is on disk (st_blocks), 0 when unknown.
func allocated(p string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}

// copySparse copies a file keeping holes (and reflinks where the file
// system can), through a temporary name, then fsyncs it.
func copySparse(ctx context.Context, src, dst string) error {
	tmp := dst + ".tmp"
	if err := runLogged(ctx, io.Discard, "", "cp", "--reflink=auto", "--sparse=always", src, tmp); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	f, err := os.Open(tmp)
	if err != nil {
		return err
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// run runs a command with its output to log; the error carries the tail.
func runLogged(ctx context.Context, log io.Writer, dir, name string, args ...string) error {
	var tail bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	cmd.Stdout = io.MultiWriter(log, &tail)
	cmd.Stderr = io.MultiWriter(log, &tail)
	if err := cmd.Run(); err != nil {
		t := tail.Bytes()
		if len(t) > 2000 {
			t = t[len(t)-2000:]
		}
		return fmt.Errorf("%s: %w\n%s", name, err, t)
	}
	return nil
}
