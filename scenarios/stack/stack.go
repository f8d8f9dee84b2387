// Package stack builds, runs and tears down the node stack of one scenario
// case: fresh dirs, the stack binaries, a guest image carrying the run's
// ledger key, a base snapshot, the trace socket, nodeagent as a supervised
// unit (optionally `vmctl daemon` and a `vm status --event` observer), and a
// teardown that leaves no process of the case behind.
package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/manager/cocoon"
	agentapi "github.com/vmchaos/vmchaos/nodeagent/api"
	"github.com/vmchaos/vmchaos/realch"
	vmctlapi "github.com/vmchaos/vmchaos/vmctl/api"
)

// Backends NewRun accepts.
const (
	BackendFake = "fake" // fakech, the bundled fake cloud-hypervisor
	BackendReal = "real" // cloud-hypervisor on KVM through realch
)

// stackEnv is realch.StackEnv; tests replace it to see what a real run asks
// for without creating a namespace.
var stackEnv = realch.StackEnv

// guestBootTimeout bounds the wait for the real base guest to answer
// `vm exec` (cloud-init's first boot of a cloud image takes tens of seconds).
var guestBootTimeout = 5 * time.Minute

// Run is what every case of one run shares: binaries, the run's ledger key,
// the guest image and an exported base snapshot, and the supervisor.
type Run struct {
	BinDir     string
	TmpDir     string // short dir for sockets (sun_path is 108 bytes)
	Key        *ledger.Key
	Image      string
	BaseExport string // `vmctl snapshot export` of the base snapshot
	Sup        injector.Supervisor
	// Real is the real backend's environment (tap networking in the run's
	// network namespace, the discovered CH and payload); nil on fakech.
	Real  *realch.Stack
	Scale float64
	Seed  int64
	// TmpFS: TmpDir is a tmpfs of the run's own (RunOptions.StackFS),
	// unmounted by Close; a killed run's is found and unmounted by
	// `doctor --clean` (a mount below a leaked run dir).
	TmpFS bool
	next  int
	mu    sync.Mutex
	// nsInit is the host pid of the sandbox's PID 1 (0 without a pid
	// namespace): vmctl records hold pids as the stack sees them, so every
	// vmctl the harness runs must run in the stack's pid (and /proc) view.
	nsInit int
}

// RunOptions configures NewRun.
type RunOptions struct {
	BinDir     string // stack binaries (stackbin.Dir())
	Supervisor string // auto|sandbox|builtin|systemd (real: builtin or systemd)
	Backend    string // fake (default) | real
	Scale      float64
	Seed       int64
	StackFS    string // StackFSAuto (""), StackFSTmpfs or StackFSDisk
}

// Where a run's temp dir (every case's stack: stores, sockets, fake VMM
// files, logs until they are copied) lives.
//
// On disk, three cases at a time spend much of their time in the
// filesystem's journal: every product write is fsynced, every clone
// creates and removes files, and on a 2-core host a scheduled run was
// bound by it (docs/figures.md). What the product must make durable is
// judged by the power cut on lazyfs, which keeps its own durable and
// volatile copies wherever its backing dir is, so a tmpfs changes no
// verdict; auto takes one for the fake backend when this process may
// mount (root). The real backend's guest disks are images of gigabytes:
// auto keeps them on disk.
const (
	StackFSAuto  = "auto"
	StackFSTmpfs = "tmpfs"
	StackFSDisk  = "disk"
)

// wantTmpfs resolves o.StackFS: whether to mount, and whether a failed
// mount is an error (asked for) or means disk (auto).
func (o RunOptions) wantTmpfs() (mount, required bool, err error) {
	switch o.StackFS {
	case "", StackFSAuto:
		return (o.Backend == BackendFake || o.Backend == "") && os.Geteuid() == 0, false, nil
	case StackFSTmpfs:
		return true, true, nil
	case StackFSDisk:
		return false, false, nil
	}
	return false, false, fmt.Errorf("stack fs %q: want auto, tmpfs or disk", o.StackFS)
}

// NewRun prepares the shared parts: a temp dir, the ledger key, the guest
// image, the supervisor, and the base snapshot export (built once with a
// throwaway vmctl root: create, snapshot save, export, rm).
func NewRun(ctx context.Context, o RunOptions) (*Run, error) {
	// Recorded before it is created: a runner killed from here on leaves
	// a dir `doctor --clean` finds; the supervisor's record takes it over.
	tmp, release, err := injector.ReserveDir("", "vmchaos-")
	if err != nil {
		return nil, fmt.Errorf("stack: temp dir: %w", err)
	}
	defer release()
	r := &Run{BinDir: o.BinDir, TmpDir: tmp, Scale: o.Scale, Seed: o.Seed}
	fail := func(err error) (*Run, error) {
		r.Close()
		return nil, err
	}
	mount, required, err := o.wantTmpfs()
	if err != nil {
		return fail(fmt.Errorf("stack: %w", err))
	}
	if mount {
		// before anything is in it, and before the supervisor: a sandbox
		// or a systemd in namespaces of their own copy the mount with it
		err := unix.Mount("tmpfs", tmp, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700")
		switch {
		case err == nil:
			r.TmpFS = true
		case required:
			return fail(fmt.Errorf("stack: tmpfs at %s: %w", tmp, err))
		}
	}
	if r.Key, err = ledger.NewKey(filepath.Join(tmp, "key")); err != nil {
		return fail(fmt.Errorf("stack: ledger key: %w", err))
	}
	switch o.Backend {
	case BackendReal:
		// The sandbox supervisor gives the stack a private /run, where
		// the run's namespace (/run/netns) would be invisible.
		if o.Supervisor != injector.KindBuiltin && o.Supervisor != injector.KindSystemd {
			return fail(fmt.Errorf("stack: the real backend needs the builtin or systemd supervisor, not %q (the sandbox hides /run/netns)", o.Supervisor))
		}
		// The temp dir's name (vmchaos-<random>) is unique on the host,
		// so is the namespace named after it; the wrapper goes into it.
		r.Real, err = stackEnv(realch.StackOptions{SeedPubKey: r.Key.AuthorizedKey(), Netns: filepath.Base(tmp), Dir: tmp, DHCP: true})
		if err != nil {
			return fail(fmt.Errorf("stack: real backend: %w", err))
		}
		r.Image = r.Real.Image
	case BackendFake, "":
		// The image authorizes no key and its host key is never the one
		// pinned: like a cloud image, the guest takes both from the seed
		// vmctl writes (VMCTL_SEED_PUBKEY, baseEnv).
		r.Image = filepath.Join(tmp, "guest.img")
		if _, err := guestimg.Build(r.Image, guestimg.Options{Hostname: "vmchaos-guest"}); err != nil {
			return fail(fmt.Errorf("stack: guest image: %w", err))
		}
	default:
		return fail(fmt.Errorf("stack: backend %q: want fake or real", o.Backend))
	}
	if r.Sup, err = injector.NewSupervisor(ctx, o.Supervisor, filepath.Join(tmp, "sup")); err != nil {
		return fail(fmt.Errorf("stack: supervisor %s: %w", o.Supervisor, err))
	}
	// the run record names what `doctor --clean` removes after a SIGKILLed runner
	var netns []string
	if r.Real != nil && r.Real.Netns != nil {
		netns = append(netns, r.Real.Netns.Name)
	}
	if err := injector.RecordPaths(r.Sup, []string{tmp}, netns); err != nil {
		return fail(fmt.Errorf("stack: %w", err))
	}
	if err := r.buildBase(ctx); err != nil {
		return fail(err)
	}
	return r, nil
}

// buildBase makes the base snapshot every intent clones from, once per run.
func (r *Run) buildBase(ctx context.Context) error {
	dir := filepath.Join(r.TmpDir, "base")
	s := &Stack{run: r, Dir: dir, Root: filepath.Join(dir, "root"), RunDir: filepath.Join(dir, "run"),
		NetPool: "127.250.0.0/24", Loopback: "127.250.0.0"}
	if r.Real != nil {
		s.NetPool = r.netPool(0) // cases count from 1
	}
	for _, d := range []string{s.Root, s.RunDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	defer s.killLeftovers()
	var vm vmctlapi.VM
	if err := s.VmctlJSON(ctx, &vm, "vm", "run", "--name", "base-src", "-o", "json", r.Image); err != nil {
		return fmt.Errorf("stack: base snapshot: %w", err)
	}
	if r.Real != nil {
		// A real guest is worth saving only once it has booted (cloud-init
		// applied the seed, sshd answers). Its NIC goes before the save:
		// a clone under another name must not restore a NIC it does not
		// own (docs/realch.md, "Wiring").
		if err := s.waitGuest(ctx, "base-src"); err != nil {
			return fmt.Errorf("stack: base snapshot: %w", err)
		}
		if _, err := s.Vmctl(ctx, "vm", "net", "base-src", "--nics", "0"); err != nil {
			return fmt.Errorf("stack: base snapshot: drop the NIC: %w", err)
		}
	}
	if _, err := s.Vmctl(ctx, "snapshot", "save", "--name", "base", vm.ID); err != nil {
		return fmt.Errorf("stack: base snapshot: %w", err)
	}
	r.BaseExport = filepath.Join(r.TmpDir, "base.export")
	if _, err := s.Vmctl(ctx, "snapshot", "export", "base", "-o", r.BaseExport); err != nil {
		return fmt.Errorf("stack: base snapshot: %w", err)
	}
	if _, err := s.Vmctl(ctx, "vm", "rm", "--force", vm.ID); err != nil {
		return fmt.Errorf("stack: base snapshot: %w", err)
	}
	return nil
}

// waitGuest waits until `vm exec name -- true` succeeds: the guest booted
// and logs the run's key in.
func (s *Stack) waitGuest(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, guestBootTimeout)
	defer cancel()
	for {
		_, err := s.Vmctl(ctx, "vm", "exec", name, "--", "true")
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("guest %s not reachable after %s: %w", name, guestBootTimeout, err)
		case <-time.After(2 * time.Second):
		}
	}
}

// netPool is the address pool of case n's store. Fake: a loopback /24 per
// case, so a leftover guest listener of an earlier case can never answer
// for this one. Real: a /24 of realch's default pool per case, since every
// store of the run plans its TAPs in the same namespace.
func (r *Run) netPool(n int) string {
	if r.Real != nil {
		return fmt.Sprintf("172.30.%d.0/24", n%256)
	}
	return fmt.Sprintf("127.%d.%d.0/24", 200+(n/256)%50, n%256)
}

// loopbackOf is stack n's own loopback address, the network address of
// its fake pool (no guest is given it): the agent's metrics endpoint and
// the case's registry listen there, on a port the kernel picks. On the
// shared 127.0.0.1 a port a dead agent or a restarting registry had held
// could be handed to another case's process meanwhile, and the harness
// then read that one: the stability run at 5 cases at once scraped
// another case's agent between a power cut and the restart (hibernate
// counters in a create case, then "went 1 → 0").
func loopbackOf(n int) string {
	return fmt.Sprintf("127.%d.%d.0", 200+(n/256)%50, n%256)
}

// Close tears the shared parts down; the namespace goes after the
// supervisor, once no VMM is left in it.
func (r *Run) Close() error {
	var err error
	if r.Sup != nil {
		err = r.Sup.Close()
	}
	if r.Real != nil {
		if e := r.Real.Close(); err == nil {
			err = e
		}
	}
	if r.TmpFS {
		// detached, not removed file by file: what it holds goes with it
		if e := unix.Unmount(r.TmpDir, unix.MNT_DETACH); e != nil && err == nil {
			err = fmt.Errorf("stack: unmount the run's tmpfs %s: %w", r.TmpDir, e)
		}
	}
	if e := os.RemoveAll(r.TmpDir); err == nil {
		err = e
	}
	return err
}

// Options configures one case's stack.
type Options struct {
	CaseDir      string        // report dir of the case (logs, trace, journal)
	RestartDelay time.Duration // scaled
	AgentFlags   []string
	Failpoints   string // VMCHAOS_FAILPOINTS of the armed stack
	Daemon       bool
	DaemonEvery  time.Duration // scaled
	Regress      []string      // VMCHAOS_REGRESS of the stack (selftest switches bugs per case)
	// Lazy, when set, puts the durable dirs on lazy filesystems before
	// anything is written to them (power-cut cases; see lazy.go).
	Lazy LazyMount
	// OCIRegistry runs a real OCI registry (the distribution server) for
	// the case, and the agent pushes and pulls through it (registry.go).
	OCIRegistry bool
	// SharedRegistryURL, when set, points the agent at a registry another
	// stack of the case runs (the second node of a cluster case: both
	// nodes push and pull through the one registry). Not with OCIRegistry.
	SharedRegistryURL string
	// SharedNet, when set, runs this node's agent (and its children and
	// VMMs) in another stack's node namespace (a cluster node of a
	// net-fault case: every node reaches the registry through the one
	// path, so a fault on it cuts or impairs them all). The stack does
	// not own it: the stack that made it removes it.
	SharedNet *NetPath
	// RegistryDisk puts the registry's storage on a tmpfs of its own that
	// the harness can fill (registry-storage-full; regdisk.go): root only.
	RegistryDisk bool
	// NetPath puts the agent (and with it its children and the VMMs) in a
	// node network namespace and the registry in one of its own, linked by
	// a veth pair the harness can cut or impair (the net-* faults;
	// netpath.go): root only.
	NetPath bool
	// NetMode is vmctl's --net-mode of the case on the fake backend ("":
	// fake; "tap": a TAP NIC per slot of the VM's name, fakech's guest
	// answering at the address the MAC derives from the case's loopback
	// pool). The real backend is always tap.
	NetMode string
	// FakeCHTiming is a FAKECH_TIMING overlay (JSON, fakech/timing.go) for
	// the case's fake VMMs ("": fakech's defaults); the real backend
	// ignores it.
	FakeCHTiming string
	// Cocoon, when set, runs the agent over a real cocoon instead of the
	// bundled vmctl (cocoon.go).
	Cocoon *CocoonOptions
}

// Stack is one case's node stack.
type Stack struct {
	run        *Run
	opts       Options
	Dir        string // temp dir of the case (sockets, store)
	CaseDir    string
	Root       string
	RunDir     string
	State      string
	Registry   string
	CtlDir     string
	LogDir     string
	NetPool    string
	Loopback   string // the stack's own loopback address (loopbackOf)
	Trace      *injector.Trace
	Agent      *AgentClient
	AgentUnit  string
	DaemonUnit string
	Ledger     *ledger.Ledger
	Firmware   string

	// RegistryUnit, RegistryURL ("http://127.0.0.1:PORT", or with a net
	// path "http://10.77.0.2:5000" inside the registry's namespace) and
	// RegistryStorage: the case's real registry (Options.OCIRegistry; URL
	// "" without).
	RegistryUnit    string
	RegistryURL     string
	RegistryStorage string
	// RegistryDisk is the tmpfs under RegistryStorage (Options.RegistryDisk;
	// nil without).
	RegistryDisk *RegistryDisk
	// Net is the node's path to the registry (Options.NetPath; nil without).
	Net *NetPath

	mu         sync.Mutex
	procs      map[*exec.Cmd]bool // processes the harness started itself, until reaped
	armed      bool
	unitsUp    map[string]bool
	harnessFPs string
	Observer   *Observer
	Lazy       Unmounter // the lazy filesystems of Options.Lazy (nil without)
	// Cocoon is the adapter of the case's cocoon store (Options.Cocoon;
	// nil: the agent drives vmctl).
	Cocoon *cocoon.Adapter
	// cocoonNet is the case's network for cocoon (cocoonnet.go; nil
	// without Options.Cocoon).
	cocoonNet *cocoonNet
	built     bool // New finished (else it unmounts Lazy again)
	netShared bool // Net is another stack's (Options.SharedNet): not removed here
}

// Image is the run's guest disk image (what `vm create` boots).
func (s *Stack) Image() string { return s.run.Image }

// New builds a case stack: dirs, trace, imported base snapshot, ledger.
func (r *Run) New(ctx context.Context, o Options) (*Stack, error) {
	r.mu.Lock()
	r.next++
	n := r.next
	r.mu.Unlock()
	dir := filepath.Join(r.TmpDir, fmt.Sprintf("c%d", n))
	s := &Stack{run: r, opts: o, Dir: dir, CaseDir: o.CaseDir,
		Root: filepath.Join(dir, "root"), RunDir: filepath.Join(dir, "run"), State: filepath.Join(dir, "state"),
		Registry: filepath.Join(dir, "registry"), CtlDir: filepath.Join(dir, "ctl"),
		// logs are written under /tmp (a sandboxed supervisor shares only
		// /tmp and /var) and copied into the case dir at teardown
		LogDir:    filepath.Join(dir, "logs"),
		NetPool:   r.netPool(n),
		Loopback:  loopbackOf(n),
		AgentUnit: fmt.Sprintf("vmchaos-c%d-agent", n), DaemonUnit: fmt.Sprintf("vmchaos-c%d-daemon", n),
		RegistryUnit: fmt.Sprintf("vmchaos-c%d-registry", n),
		unitsUp:      map[string]bool{}}
	for _, d := range []string{s.Root, s.RunDir, s.State, s.Registry, s.CtlDir, s.LogDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("stack: %w", err)
		}
	}
	if o.Lazy != nil {
		if err := s.mountLazy(o.Lazy); err != nil {
			return nil, err
		}
		defer func() {
			if !s.built {
				_ = s.Lazy.Unmount()
			}
		}()
	}
	if r.Real == nil {
		// fakech checks only that the firmware exists; the real backend's
		// firmware or kernel comes with r.Real.Vars
		s.Firmware = filepath.Join(dir, "CLOUDHV.fd")
		if err := os.WriteFile(s.Firmware, []byte("fake firmware\n"), 0o644); err != nil {
			return nil, err
		}
	}
	var err error
	if s.Trace, err = injector.ListenTrace(filepath.Join(dir, "trace.sock")); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	if o.Cocoon != nil {
		if err := s.setupCocoon(ctx); err != nil {
			s.Trace.Close()
			if s.unitsUp != nil {
				s.stopUnits()
			}
			return nil, err
		}
	} else if _, err := s.Vmctl(ctx, "snapshot", "import", "--name", "base", r.BaseExport); err != nil {
		s.Trace.Close()
		return nil, fmt.Errorf("stack: import base snapshot: %w", err)
	}
	if s.Ledger, err = ledger.Open(filepath.Join(o.CaseDir, "ledger.jsonl"), r.Key, filepath.Join(o.CaseDir, "known_hosts")); err != nil {
		s.Trace.Close()
		return nil, fmt.Errorf("stack: ledger: %w", err)
	}
	if r.Real != nil {
		s.Ledger.Dial = r.Real.Dial // guests sit on TAPs inside the run's namespace
	}
	if s.cocoonNet != nil {
		s.Ledger.Dial = s.cocoonDial // each guest inside its VM's netns
	}
	s.Agent = NewAgentClient(filepath.Join(s.State, agentapi.SocketName))
	if o.SharedRegistryURL != "" {
		s.RegistryURL = o.SharedRegistryURL
	}
	if o.SharedNet != nil {
		s.Net, s.netShared = o.SharedNet, true
		s.Ledger.Dial = o.SharedNet.DialNode // its fake guests listen there too
	}
	if o.NetPath {
		if err := s.startNet(n); err != nil {
			s.Trace.Close()
			return nil, err
		}
	}
	if o.OCIRegistry {
		if err := s.startRegistry(ctx); err != nil {
			s.closeNet()
			if s.unitsUp[s.RegistryUnit] {
				_ = r.Sup.Remove(context.Background(), s.RegistryUnit)
			}
			if s.RegistryDisk != nil {
				_ = s.RegistryDisk.Unmount()
			}
			s.Trace.Close()
			return nil, err
		}
	}
	s.built = true
	return s, nil
}

// baseEnv is the environment every stack process gets, without the trace
// and failpoints.
func (s *Stack) baseEnv() []string {
	env := []string{
		"PATH=" + s.run.BinDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + s.Dir,
		"VMCTL_ROOT_DIR=" + s.Root,
		"VMCTL_RUN_DIR=" + s.RunDir,
		"VMCTL_CH_BINARY=" + filepath.Join(s.run.BinDir, "cloud-hypervisor"),
		"VMCTL_NET_POOL=" + s.NetPool,
		"VMCHAOS_TIME_SCALE=" + strconv.FormatFloat(s.run.Scale, 'g', -1, 64),
		"FAKECH_JITTER_SEED=" + strconv.FormatInt(s.run.Seed, 10),
	}
	if s.Firmware != "" {
		env = append(env, "VMCTL_FIRMWARE="+s.Firmware)
	}
	if s.run.Key != nil {
		env = append(env, "VMCTL_SSH_KEY="+s.run.Key.PrivatePath(), "VMCTL_SEED_PUBKEY="+s.run.Key.AuthorizedKey())
	}
	if s.opts.NetMode != "" && s.run.Real == nil {
		env = append(env, "VMCTL_NET_MODE="+s.opts.NetMode)
	}
	if s.opts.FakeCHTiming != "" && s.run.Real == nil {
		env = append(env, "FAKECH_TIMING="+s.opts.FakeCHTiming)
	}
	if s.Cocoon != nil {
		// later entries win: cocoon's dirs, fakech first on PATH
		env = append(env, s.Cocoon.Env()...)
	}
	if s.run.Real != nil {
		// later entries win (exec and systemd keep the last of a name):
		// the real CH (wrapper), payload, tap mode, netns, seed key, and
		// this store's own slice of the pool
		env = append(env, s.run.Real.Vars...)
		env = append(env, "VMCTL_NET_POOL="+s.NetPool)
	}
	return env
}

// StackEnv is the environment of the processes under test: base env plus
// the trace, the control dir, the regress switches and (armed) failpoints.
func (s *Stack) StackEnv(failpoints string) []string {
	env := s.baseEnv()
	if s.Trace != nil {
		env = append(env, failpoint.EnvTrace+"="+s.Trace.Path())
	}
	env = append(env, failpoint.EnvCtl+"="+s.CtlDir)
	if failpoints != "" {
		env = append(env, failpoint.EnvFailpoints+"="+failpoints)
	}
	if len(s.opts.Regress) > 0 {
		env = append(env, "VMCHAOS_REGRESS="+strings.Join(s.opts.Regress, ","))
	}
	return env
}

// VmctlError is a failed harness-run vmctl.
type VmctlError struct {
	Args   []string
	Code   int
	Stderr string
}

func (e *VmctlError) Error() string {
	return fmt.Sprintf("vmctl %s: exit %d: %s", strings.Join(e.Args, " "), e.Code, strings.TrimSpace(e.Stderr))
}

// Vmctl runs vmctl with the harness environment (no trace, no failpoints,
// no regress switches: the harness reads the store, it is not under test).
func (s *Stack) Vmctl(ctx context.Context, args ...string) ([]byte, error) {
	return s.vmctlEnv(ctx, s.baseEnv(), args...)
}

func (s *Stack) vmctlEnv(ctx context.Context, env []string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := s.vmctlCmd(ctx, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		code := -1
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		return out.Bytes(), &VmctlError{Args: args, Code: code, Stderr: errb.String()}
	}
	return out.Bytes(), nil
}

// VmctlJSON runs vmctl and decodes its stdout.
func (s *Stack) VmctlJSON(ctx context.Context, out any, args ...string) error {
	b, err := s.Vmctl(ctx, args...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("vmctl %s: decode: %w (%.200s)", strings.Join(args, " "), err, b)
	}
	return nil
}

// ListVMs returns `vm list -o json`.
func (s *Stack) ListVMs(ctx context.Context) ([]vmctlapi.VM, error) {
	var vms []vmctlapi.VM
	err := s.VmctlJSON(ctx, &vms, "vm", "list", "-o", "json")
	return vms, err
}

// ListSnapshots returns `snapshot list -o json`.
func (s *Stack) ListSnapshots(ctx context.Context) ([]vmctlapi.Snapshot, error) {
	var ss []vmctlapi.Snapshot
	err := s.VmctlJSON(ctx, &ss, "snapshot", "list", "-o", "json")
	return ss, err
}

// VMByName finds the record of name in `vm list`.
func (s *Stack) VMByName(ctx context.Context, name string) (vmctlapi.VM, bool, error) {
	vms, err := s.ListVMs(ctx)
	if err != nil {
		return vmctlapi.VM{}, false, err
	}
	for _, v := range vms {
		if v.Name == name {
			return v, true, nil
		}
	}
	return vmctlapi.VM{}, false, nil
}

// agentSpec is the nodeagent unit of this stack.
func (s *Stack) agentSpec(failpoints string) injector.UnitSpec {
	argv := []string{filepath.Join(s.run.BinDir, "nodeagent"),
		"--state-dir", s.State}
	argv = append(argv, s.managerArgs()...)
	argv = append(argv, "--registry-dir", s.Registry, "--metrics-addr", net.JoinHostPort(s.Loopback, "0"))
	if s.RegistryURL != "" {
		argv = append(argv, "--registry", s.RegistryURL)
	}
	argv = append(argv, s.opts.AgentFlags...)
	rs := s.opts.RestartDelay
	if rs <= 0 {
		rs = time.Duration(float64(5*time.Second) * s.run.Scale)
	}
	if s.Net != nil {
		argv = Wrap(s.Net.NodeFile, argv) // the node's processes talk to the registry from its namespace
	}
	return injector.UnitSpec{Name: s.AgentUnit, Argv: argv, Env: s.StackEnv(failpoints), Dir: s.Dir,
		RestartSec: rs, TimeoutStopSec: 10 * time.Second, LogPath: filepath.Join(s.LogDir, "nodeagent.log")}
}

// StartAgent starts the agent unit (unarmed: no failpoints) and waits for
// its API.
func (s *Stack) StartAgent(ctx context.Context) error {
	return s.startAgent(ctx, "")
}

func (s *Stack) startAgent(ctx context.Context, fps string) error {
	if err := s.run.Sup.Start(ctx, s.agentSpec(fps)); err != nil {
		return fmt.Errorf("stack: start agent: %w", err)
	}
	s.unitsUp[s.AgentUnit] = true
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Agent.WaitUp(wctx); err != nil {
		return err
	}
	s.findNamespace(ctx)
	return nil
}

// Arm replaces the setup agent by one whose environment carries the case's
// failpoints (the setup must not park at the case's point), the way an
// operator restarts a service with a new configuration: `stop` (SIGTERM to
// the main process only; the VMMs keep running, KillMode=process) and a new
// unit with the new environment.
func (s *Stack) Arm(ctx context.Context, failpoints string) error {
	if err := s.run.Sup.Stop(ctx, s.AgentUnit); err != nil {
		return fmt.Errorf("stack: re-arm agent: stop: %w", err)
	}
	s.AgentUnit += "-armed"
	s.armed = true
	return s.startAgent(ctx, failpoints)
}

// RestartAgent is the operator's restart of the agent unit with
// failpoints: stop, and start with the new environment; not waited for (a
// case parks its startup).
func (s *Stack) RestartAgent(ctx context.Context, failpoints string) error {
	if err := s.run.Sup.Stop(ctx, s.AgentUnit); err != nil {
		return fmt.Errorf("stack: restart agent: stop: %w", err)
	}
	// a new unit with the new environment, as Arm does (a stopped unit's
	// name stays taken)
	s.AgentUnit += "-restarted"
	if err := s.run.Sup.Start(ctx, s.agentSpec(failpoints)); err != nil {
		return fmt.Errorf("stack: restart agent: %w", err)
	}
	s.unitsUp[s.AgentUnit] = true
	return nil
}

// StartDaemon starts `vmctl daemon` as a unit.
func (s *Stack) StartDaemon(ctx context.Context, every time.Duration) error {
	return s.StartDaemonFP(ctx, every, "")
}

// StartDaemonFP starts `vmctl daemon` as a unit with failpoints (a case
// whose points are the daemon's own).
func (s *Stack) StartDaemonFP(ctx context.Context, every time.Duration, failpoints string) error {
	argv := []string{filepath.Join(s.run.BinDir, "vmctl"), "daemon", "--interval", every.String()}
	spec := injector.UnitSpec{Name: s.DaemonUnit, Argv: argv, Env: s.StackEnv(failpoints), Dir: s.Dir,
		RestartSec: time.Duration(float64(5*time.Second) * s.run.Scale), TimeoutStopSec: 10 * time.Second,
		LogPath: filepath.Join(s.LogDir, "vmctl-daemon.log")}
	if err := s.run.Sup.Start(ctx, spec); err != nil {
		return fmt.Errorf("stack: start vmctl daemon: %w", err)
	}
	s.unitsUp[s.DaemonUnit] = true
	return nil
}

// Sup is the run's supervisor.
func (s *Stack) Sup() injector.Supervisor { return s.run.Sup }

// RealBackend reports whether the stack runs real cloud-hypervisor.
func (s *Stack) RealBackend() bool { return s.run != nil && s.run.Real != nil }

// Scale is the run's time scale.
func (s *Stack) Scale() float64 { return s.run.Scale }

// StartProc starts a vmctl process of the harness (direct clone, reconcile)
// with the stack environment, logging to logs/<name>.log; the caller waits
// it through the returned channel (exit code, -1 if killed by a signal).
func (s *Stack) StartProc(name string, args ...string) (*exec.Cmd, <-chan int, error) {
	return s.StartProcFP(name, s.armedFailpoints(), args...)
}

// StartProcFP is StartProc with its own VMCHAOS_FAILPOINTS.
func (s *Stack) StartProcFP(name, failpoints string, args ...string) (*exec.Cmd, <-chan int, error) {
	f, err := os.OpenFile(filepath.Join(s.LogDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	cmd := s.vmctlCmd(context.Background(), args...)
	cmd.Env = s.StackEnv(failpoints)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("stack: start vmctl %s: %w", strings.Join(args, " "), err)
	}
	s.mu.Lock()
	if s.procs == nil {
		s.procs = map[*exec.Cmd]bool{}
	}
	s.procs[cmd] = true
	s.mu.Unlock()
	ch := make(chan int, 1)
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		delete(s.procs, cmd) // reaped: Close kills only the rest
		s.mu.Unlock()
		f.Close()
		code := 0
		if err != nil {
			code = -1
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
		}
		ch <- code
	}()
	return cmd, ch, nil
}

// armedFailpoints is set by the runner for harness processes under test.
func (s *Stack) armedFailpoints() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.harnessFPs
}

// SetHarnessFailpoints sets the failpoints of harness-started processes.
func (s *Stack) SetHarnessFailpoints(fps string) {
	s.mu.Lock()
	s.harnessFPs = fps
	s.mu.Unlock()
}

// Close stops every unit and process of the case, writes the trace into the
// case dir and verifies that no process of the case is left.
func (s *Stack) Close(ctx context.Context) error {
	var errs []string
	if s.Observer != nil {
		s.Observer.Stop()
	}
	for u := range s.unitsUp {
		if err := s.run.Sup.Remove(ctx, u); err != nil {
			errs = append(errs, err.Error())
		}
	}
	s.mu.Lock()
	for c := range s.procs {
		_ = c.Process.Signal(syscall.SIGKILL) // os.Process: no-op once reaped
	}
	s.mu.Unlock()
	s.killLeftovers()
	if left := s.Processes(); len(left) > 0 {
		errs = append(errs, fmt.Sprintf("teardown left %d process(es): %v", len(left), left))
	}
	if err := copyDir(s.LogDir, filepath.Join(s.CaseDir, "logs")); err != nil {
		errs = append(errs, "copy logs: "+err.Error())
	}
	if err := s.traceAccounting(ctx); err != nil {
		errs = append(errs, err.Error())
	}
	if s.Trace != nil {
		if err := s.Trace.WriteJSONL(filepath.Join(s.CaseDir, "trace.jsonl")); err != nil {
			errs = append(errs, err.Error())
		}
		s.Trace.Close()
	}
	if s.Lazy != nil {
		if err := s.Lazy.Unmount(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if s.RegistryDisk != nil {
		if err := s.RegistryDisk.Unmount(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if err := s.closeNet(); err != nil {
		errs = append(errs, err.Error())
	}
	_ = os.RemoveAll(s.Dir)
	if len(errs) > 0 {
		return errors.New("stack teardown: " + strings.Join(errs, "; "))
	}
	return nil
}

// stopUnits removes the units New started and kills what they left, when
// New fails half-way (Close does the same for a built stack).
func (s *Stack) stopUnits() {
	for u := range s.unitsUp {
		_ = s.run.Sup.Remove(context.Background(), u)
	}
	s.killLeftovers()
}

// copyDir copies the regular files of src into dst.
func copyDir(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// LogRel lists the case's log files relative to the case dir (after Close).
func LogRel(caseDir string) map[string]string {
	out := map[string]string{}
	ents, _ := os.ReadDir(filepath.Join(caseDir, "logs"))
	for _, e := range ents {
		out[strings.TrimSuffix(e.Name(), ".log")] = filepath.Join("logs", e.Name())
	}
	for _, f := range []string{"trace.jsonl", "ledger.jsonl"} {
		if _, err := os.Stat(filepath.Join(caseDir, f)); err == nil {
			out[strings.TrimSuffix(f, ".jsonl")] = f
		}
	}
	return out
}

// vmctlCmd is a vmctl command in the stack's pid and mount namespaces
// (nsenter into the sandbox) or, without a sandbox, a plain one.
func (s *Stack) vmctlCmd(ctx context.Context, args ...string) *exec.Cmd {
	bin := filepath.Join(s.run.BinDir, "vmctl")
	s.run.mu.Lock()
	init := s.run.nsInit
	s.run.mu.Unlock()
	argv := append([]string{bin}, args...)
	if init != 0 {
		// nsenter opens every namespace file before it enters any: the
		// node's, a host path, is opened before the sandbox's mount ns
		ns := []string{"--target", strconv.Itoa(init), "--pid", "--mount"}
		if s.Net != nil {
			ns = append(ns, "--net="+s.Net.NodeFile)
		}
		return exec.CommandContext(ctx, nsenterPath, append(append(ns, "--"), argv...)...)
	}
	if s.Net != nil {
		// a VMM a harness vmctl starts sits with the agent's, and vm
		// exec reaches the guests' loopback SSH there
		argv = Wrap(s.Net.NodeFile, argv)
	}
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// findNamespace learns the sandbox's PID 1 from the agent's main process:
// the process of the same pid namespace whose pid there is 1.
func (s *Stack) findNamespace(ctx context.Context) {
	s.run.mu.Lock()
	known := s.run.nsInit != 0
	s.run.mu.Unlock()
	if known {
		return
	}
	pid, err := s.run.Sup.MainPID(ctx, s.AgentUnit)
	if err != nil || pid == 0 {
		return
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil {
		return
	}
	self, _ := os.Readlink("/proc/self/ns/pid")
	if ns == self {
		return
	}
	if init := nsPID1(ns); init > 0 {
		s.run.mu.Lock()
		s.run.nsInit = init
		s.run.mu.Unlock()
	}
}

// nsPID1 returns the host pid of PID 1 of pid namespace ns.
func nsPID1(ns string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, _ := os.Readlink("/proc/" + e.Name() + "/ns/pid"); l != ns {
			continue
		}
		if nsLocal(pid) == 1 {
			return pid
		}
	}
	return 0
}

// nsLocal is the innermost pid of a host pid (last NSpid field).
func nsLocal(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "NSpid:" {
			n, _ := strconv.Atoi(f[len(f)-1])
			return n
		}
	}
	return 0
}

// Namespaced reports whether the stack's processes run in a pid namespace
// of their own (sandbox): a vmctl the harness starts is then nsenter's child.
func (s *Stack) Namespaced() bool {
	s.run.mu.Lock()
	defer s.run.mu.Unlock()
	return s.run.nsInit != 0
}

// HostPID maps a pid as the stack reports it (trace events, park files) to
// the host pid.
func (s *Stack) HostPID(pid int) int {
	s.run.mu.Lock()
	init := s.run.nsInit
	s.run.mu.Unlock()
	if init == 0 {
		return pid
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", init))
	if err != nil {
		return 0
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		hp, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, _ := os.Readlink("/proc/" + e.Name() + "/ns/pid"); l == ns && nsLocal(hp) == pid {
			return hp
		}
	}
	return 0
}

// ParentOf is the host parent pid of a host pid.
func ParentOf(pid int) int {
	st, ok := stat(pid)
	if !ok {
		return 0
	}
	return st.PPID
}
