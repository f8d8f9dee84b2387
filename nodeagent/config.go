package nodeagent

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/vmchaos/vmchaos/timescale"
)

// Config holds every tunable of the agent. Durations are given at time scale 1
// and scaled by VMCHAOS_TIME_SCALE when the agent starts (Scaled), so a fast
// suite keeps the shape of every window.
type Config struct {
	StateDir    string // agent.sock, intents, status markers, metrics
	VMCtl       string // manager binary (--vmctl, --manager-bin)
	Manager     string // manager adapter (--manager): "vmctl" (default, also "") or "cocoon"
	RegistryDir string // local registry: hibernate snapshots pushed/pulled here (with RegistryURL: staging only)
	// RegistryURL ("http://host:port"), when set, is a real OCI registry:
	// hibernate pushes <name>:hibernate there and wake pulls it.
	RegistryURL string
	MetricsAddr string // "" disables the metrics listener
	NICs        int    // NICs a clone or wake gets

	StartupFanout    int           // bounded fan-out of resumed work at startup
	BusyCreateBudget time.Duration // how long a busy creating record is watched
	BusyCreateTick   time.Duration // first tick of the busy-create watch backoff
	RetryBase        time.Duration // first backoff of a failed intent
	RetryMax         time.Duration // backoff cap
	RetryAttempts    int           // automatic retries per generation before parking
	LeaseWait        time.Duration // how long a lease-held snapshot rm is retried
	WatchInterval    time.Duration // vm status -n of the watcher child
	ReadyBudget      time.Duration // post-clone readiness budget (guest exec retries)
	ReadyTick        time.Duration // interval between readiness probes
	ShutdownGrace    time.Duration // how long SIGTERM waits for workers to unwind
	RegistryTimeout  time.Duration // connect and answer wait of one registry request
	// ControlPlane (the unix socket of the cluster's control plane) and
	// Node (this node's name there), when set, make the agent reconcile
	// the VMs the control plane places against it (cpsync.go).
	ControlPlane     string
	Node             string
	ControlPlaneTick time.Duration // interval between two syncs with the control plane
}

// DefaultConfig returns the documented defaults (scale 1).
func DefaultConfig() Config {
	return Config{
		NICs:             1,
		StartupFanout:    8,
		BusyCreateBudget: 10 * time.Minute,
		BusyCreateTick:   time.Second,
		RetryBase:        2 * time.Second,
		RetryMax:         time.Minute,
		RetryAttempts:    5,
		LeaseWait:        30 * time.Second,
		WatchInterval:    time.Second,
		ReadyBudget:      2 * time.Minute,
		ReadyTick:        500 * time.Millisecond,
		ShutdownGrace:    5 * time.Second,
		RegistryTimeout:  10 * time.Second,
		ControlPlaneTick: time.Second,
	}
}

// Scaled returns c with every timer multiplied by VMCHAOS_TIME_SCALE.
func (c Config) Scaled() Config {
	for _, d := range []*time.Duration{&c.BusyCreateBudget, &c.BusyCreateTick, &c.RetryBase, &c.RetryMax,
		&c.LeaseWait, &c.WatchInterval, &c.ReadyBudget, &c.ReadyTick, &c.ShutdownGrace, &c.RegistryTimeout, &c.ControlPlaneTick} {
		*d = timescale.D(*d)
		if *d < time.Millisecond {
			*d = time.Millisecond
		}
	}
	return c
}

// Validate checks the configuration before anything is started.
func (c Config) Validate() error {
	if c.StateDir == "" {
		return fmt.Errorf("--state-dir is required")
	}
	if c.RegistryDir == "" {
		return fmt.Errorf("--registry-dir is required")
	}
	if c.RegistryURL != "" {
		if u, err := url.Parse(c.RegistryURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("--registry %q: want http://HOST:PORT or https://HOST:PORT", c.RegistryURL)
		}
	}
	if (c.ControlPlane == "") != (c.Node == "") {
		return fmt.Errorf("--control-plane and --node go together")
	}
	if c.VMCtl == "" {
		return fmt.Errorf("--vmctl is empty")
	}
	if err := validManager(c.Manager); err != nil {
		return err
	}
	if c.StartupFanout < 1 {
		return fmt.Errorf("--startup-fanout must be >= 1")
	}
	if c.RetryAttempts < 0 {
		return fmt.Errorf("--retry-attempts must be >= 0")
	}
	// cocoon's clone reads --nics 0 as "the snapshot's own NICs", so 0 is
	// a count only there; vmctl's clone would make a VM without a NIC.
	if c.NICs < 1 && !(c.Manager == ManagerCocoon && c.NICs == 0) {
		return fmt.Errorf("--nics must be >= 1 (0 only with --manager cocoon: the snapshot's own NICs)")
	}
	return nil
}

// DefaultVMCtl is the vmctl next to the running executable (the bundled
// stack installs them side by side), else the one on PATH.
func DefaultVMCtl() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "vmctl")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	if p, err := exec.LookPath("vmctl"); err == nil {
		return p
	}
	return "vmctl"
}
