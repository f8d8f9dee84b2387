// Package vmctl is the bundled VM manager: a crash-safe JSON store under
// flocks, per-VM ops locks and per-snapshot leases that are never unlinked,
// creating placeholders reserved before any work, pending snapshot records,
// and one VMM process (cloud-hypervisor or fakech) per VM. Every verb is a
// short-lived process; `daemon` is an optional resident supervisor that runs
// the same convergers on a timer.
package vmctl

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"time"

	"github.com/vmchaos/vmchaos/cidata"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/vmnet"
)

// Defaults for the manager's configuration.
const (
	DefaultRootDir  = "/var/lib/vmctl"
	DefaultCHBinary = "cloud-hypervisor"
	DefaultFirmware = "/usr/share/cloud-hypervisor/CLOUDHV.fd"
	DefaultNetPool  = "127.77.0.0/16"
)

// Config is what every verb needs to find the store and the VMM binary.
type Config struct {
	RootDir  string // store root (indexes, locks, VM disks, snapshots)
	RunDir   string // per-VM runtime dirs holding api.sock (default <root>/run)
	CHBinary string // VMM binary: a name looked up on PATH or a path
	Firmware string // passed to the VMM as --firmware on cold boots
	NetPool  string // CIDR guest addresses (tap mode: /30s) are allocated from
	Identity string // SSH private key for `vm exec`
	// NetMode is NetModeFake (default: --net ip=<guest> on loopback) or
	// NetModeTap (real CH: a TAP per NIC, guest address from a seed).
	NetMode string
	// SeedPubKey is the authorized_keys line (or a file holding it) every
	// guest's cloud-init seed gives it; the seed also carries the VM's host
	// key, which vm exec pins.
	SeedPubKey string
	// Kernel, Cmdline, Initramfs boot a kernel directly instead of
	// Firmware (when Kernel is set).
	Kernel, Cmdline, Initramfs string
	// Netns is the network namespace vm exec dials guests from (where the
	// VMMs' TAPs are); empty = this process's namespace.
	Netns string
	// GuestNet is how a tap-mode guest gets its address: GuestNetStatic
	// (default; the seed pins it by MAC) or GuestNetDHCP (the seed asks
	// for DHCP on every NIC; vmnet.ServeDHCP answers with the TAP's /30).
	GuestNet string
	// VMMCgroup is CgroupAuto (default), CgroupOn or CgroupOff: whether
	// each VMM is started in its own cgroup (cgroup.go).
	VMMCgroup string
}

// Manager runs the verbs against one store.
type Manager struct {
	cfg    Config
	chPath string // resolved VMM binary
	chName string // argv[0] basename a live VMM of ours must carry
	pool   *netPool
	// Progress receives one line per phase of long verbs (stderr in the CLI).
	Progress io.Writer
}

// ErrUsage marks errors in the caller's input.
var ErrUsage = errors.New("usage")

// New checks cfg and prepares the store's directories.
func New(cfg Config) (*Manager, error) {
	if cfg.RootDir == "" {
		cfg.RootDir = DefaultRootDir
	}
	if cfg.RunDir == "" {
		cfg.RunDir = filepath.Join(cfg.RootDir, "run")
	}
	if cfg.CHBinary == "" {
		cfg.CHBinary = DefaultCHBinary
	}
	if cfg.Firmware == "" {
		cfg.Firmware = DefaultFirmware
	}
	switch cfg.NetMode {
	case "":
		cfg.NetMode = NetModeFake
	case NetModeFake, NetModeTap:
	default:
		return nil, fmt.Errorf("%w: --net-mode %q: want %s or %s", ErrUsage, cfg.NetMode, NetModeFake, NetModeTap)
	}
	switch cfg.GuestNet {
	case "":
		cfg.GuestNet = GuestNetStatic
	case GuestNetStatic, GuestNetDHCP:
	default:
		return nil, fmt.Errorf("%w: --guest-net %q: want %s or %s", ErrUsage, cfg.GuestNet, GuestNetStatic, GuestNetDHCP)
	}
	switch cfg.VMMCgroup {
	case "":
		cfg.VMMCgroup = CgroupAuto
	case CgroupAuto, CgroupOn, CgroupOff:
	default:
		return nil, fmt.Errorf("%w: --vmm-cgroup %q: want %s, %s or %s", ErrUsage, cfg.VMMCgroup, CgroupAuto, CgroupOn, CgroupOff)
	}
	if cfg.NetPool == "" {
		cfg.NetPool = DefaultNetPool
		if cfg.NetMode == NetModeTap {
			cfg.NetPool = vmnet.DefaultTapPool
		}
	}
	if cfg.Kernel != "" && cfg.Cmdline == "" {
		cfg.Cmdline = cidata.DefaultCmdline
	}
	var err error
	if cfg.RootDir, err = filepath.Abs(cfg.RootDir); err != nil {
		return nil, err
	}
	if cfg.RunDir, err = filepath.Abs(cfg.RunDir); err != nil {
		return nil, err
	}
	pool, err := parseNetPool(cfg.NetPool)
	if err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, pool: pool, Progress: io.Discard}
	m.chPath = cfg.CHBinary
	if p, err := exec.LookPath(cfg.CHBinary); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			m.chPath = abs
		}
	}
	m.chName = filepath.Base(m.chPath)
	for _, d := range []string{cfg.RootDir, cfg.RunDir, m.vmLockDir(), m.vmsDir(), m.snapsDir(), m.stagingDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("vmctl: prepare %s: %w", d, err)
		}
	}
	// An api.sock path longer than sun_path cannot be bound: say so once, here.
	if n := len(m.apiSocket("XXXXXXXXXXXXXXXXXXXXXXXXXX")); n > 107 {
		return nil, fmt.Errorf("vmctl: run dir %s too long: api socket paths would be %d bytes (max 107)", cfg.RunDir, n)
	}
	return m, nil
}

// Config returns the effective configuration.
func (m *Manager) Config() Config { return m.cfg }

func (m *Manager) logf(format string, a ...any) {
	fmt.Fprintf(m.Progress, format+"\n", a...)
}

// Paths. Lock and lease files live outside the dirs they guard and are never
// unlinked: removing an inode a waiter holds open would split the exclusion.
func (m *Manager) vmIndexPath() string   { return filepath.Join(m.cfg.RootDir, "vms.json") }
func (m *Manager) snapIndexPath() string { return filepath.Join(m.cfg.RootDir, "snapshots.json") }
func (m *Manager) lockDir() string       { return filepath.Join(m.cfg.RootDir, "locks") }
func (m *Manager) vmLockDir() string     { return filepath.Join(m.lockDir(), "vm") }
func (m *Manager) vmIndexLock() string   { return filepath.Join(m.lockDir(), "vms.index.lock") }
func (m *Manager) snapIndexLock() string { return filepath.Join(m.lockDir(), "snapshots.index.lock") }
func (m *Manager) daemonLock() string    { return filepath.Join(m.lockDir(), "daemon.lock") }
func (m *Manager) opsLockPath(id string) string {
	return filepath.Join(m.vmLockDir(), id+".lock")
}
func (m *Manager) vmsDir() string              { return filepath.Join(m.cfg.RootDir, "vms") }
func (m *Manager) vmDir(id string) string      { return filepath.Join(m.vmsDir(), id) }
func (m *Manager) vmDisk(id string) string     { return filepath.Join(m.vmDir(id), "disk.img") }
func (m *Manager) vmRunDir(id string) string   { return filepath.Join(m.cfg.RunDir, id) }
func (m *Manager) apiSocket(id string) string  { return filepath.Join(m.vmRunDir(id), "api.sock") }
func (m *Manager) snapsDir() string            { return filepath.Join(m.cfg.RootDir, "snapshots") }
func (m *Manager) snapDir(id string) string    { return filepath.Join(m.snapsDir(), id) }
func (m *Manager) leasePath(id string) string  { return filepath.Join(m.snapsDir(), id+".lease") }
func (m *Manager) stagingDir() string          { return filepath.Join(m.snapsDir(), ".staging") }
func (m *Manager) stagingFor(id string) string { return filepath.Join(m.stagingDir(), id) }

var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// newID returns a 26-character random upper-case base32 id.
func newID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("vmctl: crypto/rand: " + err.Error())
	}
	return idEncoding.EncodeToString(b[:])
}

var idRE = regexp.MustCompile(`^[A-Z2-7]{26}$`)

// validID reports whether s has the shape of an id; only such strings may
// name lock files.
func validID(s string) bool { return idRE.MatchString(s) }

// hit marks a phase with the VM (or snapshot) id as the "vm" attribute.
func hit(ctx context.Context, point, id string) error {
	return failpoint.Hit(ctx, point, failpoint.Attrs{"vm": id})
}

func now() time.Time { return time.Now().UTC() }
