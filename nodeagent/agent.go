// Package nodeagent is the bundled node agent: it keeps durable VM intents
// (create, hibernate, wake, delete) received over an HTTP API on a unix
// socket, drives vmctl as child processes to reach them, and converges by
// itself after any crash or stop (docs/architecture.md §6, seed 001).
package nodeagent

import (
	"context"
	"fmt"
	"github.com/vmchaos/vmchaos/regress"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/nodeagent/api"
	"golang.org/x/sys/unix"
)

// Files inside the state dir.
const (
	SocketName      = api.SocketName
	MetricsAddrName = api.MetricsAddrName
	lockName        = "agent.lock"
)

// Agent is one running node agent.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	store    *store
	metrics  *metrics
	events   *eventLog // wedge reports served on GET /v1/events
	children *childSet
	plan     *Plan // what the agent does without its manager's missing verbs; nil: all present

	mu      sync.Mutex
	workers map[string]*worker
	claims  map[string]bool   // names whose resumed operation is in flight
	busy    map[string]bool   // VM ids the startup verb answered busy for
	listed  map[string]string // VM id → state in the startup listing
	died    map[string]string // name → id of the VM the watcher saw die (checked once its operation is over)

	wg     sync.WaitGroup
	ctx    context.Context // lifecycle context: cancelled by SIGINT/SIGTERM
	watchN float64         // vm status -n, unscaled seconds
}

// childSet tracks in-flight vmctl children (for logs and for tests).
type childSet struct {
	mu sync.Mutex
	m  map[int][]string
}

func (c *childSet) add(pid int, argv []string) {
	c.mu.Lock()
	c.m[pid] = argv
	c.mu.Unlock()
}

func (c *childSet) remove(pid int) {
	c.mu.Lock()
	delete(c.m, pid)
	c.mu.Unlock()
}

func (c *childSet) pids() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int, 0, len(c.m))
	for p := range c.m {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

// Run runs the agent until ctx ends (SIGINT/SIGTERM in the command). It
// returns nil after a clean shutdown.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	watchN := cfg.WatchInterval.Seconds() // vmctl scales -n itself
	cfg = cfg.Scaled()
	lf, err := lockStateDir(cfg)
	if err != nil {
		return err
	}
	defer lf.Close()
	if regress.On("agent-pidfile-lock") {
		pid, err := takePidfile(cfg)
		if err != nil {
			return err
		}
		defer os.Remove(pid)
	}
	start := time.Now() // the wedge watch's clock starts before agent.started
	a, err := newAgent(ctx, cfg, log, watchN)
	if err != nil {
		return err
	}
	if a.plan, err = a.managerPlan(ctx); err != nil {
		return fmt.Errorf("nodeagent: %w", err)
	}
	if err := failpoint.Hit(ctx, "agent.started", nil); err != nil {
		return fmt.Errorf("nodeagent: %w", err)
	}
	log.Info("nodeagent started", "pid", os.Getpid(), "state_dir", cfg.StateDir, "vmctl", cfg.VMCtl, "intents", len(a.store.names()))

	var servers []*http.Server
	defer func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}()
	if cfg.MetricsAddr != "" {
		srv, err := a.serveMetrics()
		if err != nil {
			return err
		}
		servers = append(servers, srv)
	}

	sem := make(chan struct{}, cfg.StartupFanout)
	if err := a.startup(ctx, sem); err != nil {
		if ctx.Err() != nil {
			return a.shutdown()
		}
		return err
	}
	if err := failpoint.Hit(ctx, "agent.startup.reconciled", nil); err != nil {
		return fmt.Errorf("nodeagent: %w", err)
	}

	sock, srv, err := a.serveAPI()
	if err != nil {
		return err
	}
	servers = append(servers, srv)
	a.wg.Add(2)
	go func() {
		defer a.wg.Done()
		a.watch(ctx)
	}()
	go func() {
		defer a.wg.Done()
		a.watchWedges(ctx, start)
	}()
	if cfg.ControlPlane != "" {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.syncControlPlane(ctx)
		}()
	}
	a.serveUntilDone(ctx, sock)
	for _, s := range servers {
		_ = s.Close()
	}
	_ = os.Remove(sock)
	return a.shutdown()
}

// lockStateDir creates the state and registry dirs and takes the state
// dir's lock, which the caller holds (open) until it returns.
func lockStateDir(cfg Config) (*os.File, error) {
	for _, d := range []string{cfg.StateDir, cfg.RegistryDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("nodeagent: %w", err)
		}
	}
	// One agent per state dir: two would race on every marker. The lock file
	// is never deleted, and the kernel frees the lock when we die.
	lf, err := os.OpenFile(filepath.Join(cfg.StateDir, lockName), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("nodeagent: %w", err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lf.Close()
		return nil, fmt.Errorf("nodeagent: another nodeagent holds %s: %w", cfg.StateDir, err)
	}
	return lf, nil
}

// takePidfile is the planted bug agent-pidfile-lock: the state dir locked
// by a pid file created exclusively and removed when Run returns, so an
// agent killed (SIGKILL, power cut) leaves it, and every later start
// refuses the state dir.
func takePidfile(cfg Config) (string, error) {
	p := filepath.Join(cfg.StateDir, "agent.pid")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return "", fmt.Errorf("nodeagent: another nodeagent holds %s (pid file): %w", cfg.StateDir, err)
	}
	_, _ = fmt.Fprintf(f, "%d\n", os.Getpid())
	return p, f.Close()
}

// newAgent opens the durable store and the metrics of the locked state dir.
func newAgent(ctx context.Context, cfg Config, log *slog.Logger, watchN float64) (*Agent, error) {
	st, err := openStore(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	ev, err := openEventLog(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	return &Agent{cfg: cfg, log: log, store: st, metrics: m, events: ev, children: &childSet{m: map[int][]string{}},
		workers: map[string]*worker{}, claims: map[string]bool{}, busy: map[string]bool{},
		listed: map[string]string{}, died: map[string]string{}, ctx: ctx, watchN: watchN}, nil
}

// serveMetrics serves /metrics on cfg.MetricsAddr and records the address
// it bound in the state dir.
func (a *Agent) serveMetrics() (*http.Server, error) {
	ln, err := net.Listen("tcp", a.cfg.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("nodeagent: metrics listener: %w", err)
	}
	if err := durable.WriteFile(filepath.Join(a.cfg.StateDir, MetricsAddrName), []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
		ln.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", a.metrics)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}

// serveAPI serves the agent's API on its unix socket in the state dir.
func (a *Agent) serveAPI() (string, *http.Server, error) {
	sock := filepath.Join(a.cfg.StateDir, SocketName)
	_ = os.Remove(sock) // left by a killed predecessor; we hold the state-dir lock
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return sock, nil, fmt.Errorf("nodeagent: api listener: %w", err)
	}
	srv := &http.Server{Handler: a.handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return sock, srv, nil
}

// serveUntilDone tells systemd the agent is ready and waits for ctx to end,
// then tells it the agent is stopping.
func (a *Agent) serveUntilDone(ctx context.Context, sock string) {
	if ok, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		a.log.Warn("sd_notify READY failed", "err", err)
	} else if ok {
		a.log.Info("sd_notify READY=1 sent")
	}
	a.log.Info("nodeagent serving", "socket", sock)
	<-ctx.Done()
	a.log.Info("nodeagent stopping", "in_flight_children", a.children.pids())
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
}

// shutdown waits (bounded) for workers: their children were killed by the
// cancelled lifecycle context, and their markers stay as written so the next
// start resumes the owed work.
func (a *Agent) shutdown() error {
	done := make(chan struct{})
	go func() {
		a.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(a.cfg.ShutdownGrace):
		a.log.Warn("workers did not stop within the grace period", "children", a.children.pids())
	}
	return nil
}
