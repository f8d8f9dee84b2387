package injector

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Supervisor kinds.
const (
	KindSystemd = "systemd" // the host's systemd over D-Bus
	KindSandbox = "sandbox" // a private systemd as PID 1 of new namespaces
	KindBuiltin = "builtin" // in-process, same semantics, no root needed
	KindAuto    = "auto"
)

// Kinds lists the concrete kinds in the order auto tries them.
var Kinds = []string{KindSystemd, KindSandbox, KindBuiltin}

// UnitSpec describes one supervised service.
type UnitSpec struct {
	Name string   // unit name; ".service" is appended when missing
	Argv []string // argv[0] is an absolute path
	Env  []string // added to (and overriding) the caller's environment
	Dir  string   // working directory ("" = the caller's)
	//lint:ignore ST1011 named after the systemd settings they carry
	RestartSec time.Duration
	//lint:ignore ST1011 named after the systemd settings they carry
	TimeoutStopSec time.Duration // 0 = 10s
	LogPath        string        // stdout+stderr of every incarnation appended here ("" = discarded)
}

// Supervisor runs services with systemd's semantics for KillMode=process,
// Restart=always (docs/architecture.md §7, seed 001 method note: `stop` and a SIGKILL
// of the main pid leave different damage, so both must be faithful).
type Supervisor interface {
	Kind() string
	// Start starts a transient unit: KillMode=process, Restart=always.
	Start(ctx context.Context, spec UnitSpec) error
	// Stop is `systemctl stop`: SIGTERM to the main pid only, SIGKILL after
	// TimeoutStopSec; other processes of the unit survive; no restart.
	Stop(ctx context.Context, unit string) error
	// StartAgain is `systemctl start` after a Stop.
	StartAgain(ctx context.Context, unit string) error
	// Restart is `systemctl restart` (stop semantics, then start).
	Restart(ctx context.Context, unit string) error
	// KillMain sends sig to the main pid directly, as a crash or the OOM
	// killer would: Restart=always restarts it after RestartSec.
	KillMain(ctx context.Context, unit string, sig syscall.Signal) error
	// KillAll is `systemctl kill --kill-who=all -s sig`.
	KillAll(ctx context.Context, unit string, sig syscall.Signal) error
	// MainPID is the host pid of the current main process (0 when none).
	MainPID(ctx context.Context, unit string) (int, error)
	// WaitActive waits until the unit is active with a main process.
	WaitActive(ctx context.Context, unit string) error
	// Remove stops the unit, kills everything left in it and forgets it.
	Remove(ctx context.Context, unit string) error
	// Close removes every unit and tears the supervisor down: no process,
	// cgroup or mount of it is left.
	Close() error

	// Owns reports whether the host pid p is a process of this supervisor's
	// units (or a descendant of one): the only processes the injector signals.
	Owns(p Proc) bool
	// HostPID maps a pid as a unit's process sees it (from a trace event) to
	// the host pid.
	HostPID(ctx context.Context, pid int) (int, error)
	// Procs lists the live processes of a unit, main first.
	Procs(ctx context.Context, unit string) ([]Proc, error)
}

// ErrUnavailable wraps the reason a supervisor kind cannot run on this host.
var ErrUnavailable = errors.New("supervisor unavailable")

// ErrUnknownUnit is returned for a unit this supervisor did not start.
var ErrUnknownUnit = errors.New("unknown unit")

// NewSupervisor creates a supervisor of the given kind with its state (and
// records for crash cleanup) under stateDir, which must not be under /run,
// /dev or /etc. "auto" tries systemd, sandbox, builtin in that order; Kind()
// says which one it got. Before starting, leftovers of runs whose runner was
// SIGKILLed are cleaned up from their records.
func NewSupervisor(ctx context.Context, kind, stateDir string) (Supervisor, error) {
	if stateDir == "" {
		return nil, fmt.Errorf("new supervisor: empty state dir")
	}
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, fmt.Errorf("new supervisor: %w", err)
	}
	for _, bad := range []string{"/run", "/dev", "/etc", "/proc", "/sys"} {
		if abs == bad || strings.HasPrefix(abs, bad+"/") {
			return nil, fmt.Errorf("new supervisor: state dir %s is under %s, which a sandbox does not share with the host", abs, bad)
		}
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("new supervisor: %w", err)
	}
	// A previous runner that was SIGKILLed left processes behind; its records
	// say what they are. Errors here must not block a new run.
	_, _ = CleanLeftovers(ctx, Registry())
	switch kind {
	case KindSystemd:
		return newSystemd(ctx, abs)
	case KindSandbox:
		return newSandbox(ctx, abs)
	case KindBuiltin:
		return newBuiltin(abs)
	case KindAuto, "":
		var reasons []string
		for _, k := range Kinds {
			s, err := NewSupervisor(ctx, k, filepath.Join(abs, k))
			if err == nil {
				return s, nil
			}
			reasons = append(reasons, fmt.Sprintf("%s: %v", k, err))
		}
		return nil, fmt.Errorf("new supervisor auto: none works: %s", strings.Join(reasons, "; "))
	default:
		return nil, fmt.Errorf("new supervisor: unknown kind %q (want auto, systemd, sandbox or builtin)", kind)
	}
}

// unitName normalises a unit name to NAME.service.
func unitName(n string) string {
	if strings.HasSuffix(n, ".service") {
		return n
	}
	return n + ".service"
}

func validateSpec(spec UnitSpec) error {
	if spec.Name == "" || strings.ContainsAny(spec.Name, "/ \t\n") {
		return fmt.Errorf("unit spec: bad name %q", spec.Name)
	}
	if len(spec.Argv) == 0 || !filepath.IsAbs(spec.Argv[0]) {
		return fmt.Errorf("unit %s: argv[0] must be an absolute path", spec.Name)
	}
	if spec.RestartSec < 0 || spec.TimeoutStopSec < 0 {
		return fmt.Errorf("unit %s: negative RestartSec or TimeoutStopSec", spec.Name)
	}
	for _, e := range spec.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("unit %s: env entry %q is not KEY=VALUE", spec.Name, e)
		}
	}
	return nil
}

func timeoutStop(spec UnitSpec) time.Duration {
	if spec.TimeoutStopSec <= 0 {
		return 10 * time.Second
	}
	return spec.TimeoutStopSec
}

// mergeEnv is the caller's environment with extra entries overriding.
func mergeEnv(base, extra []string) []string {
	idx := map[string]int{}
	out := make([]string, 0, len(base)+len(extra))
	for _, kv := range append(append([]string(nil), base...), extra...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// removeAll is the first step of a supervisor's Close: remove every unit it
// still holds under one minute's budget, going on past failures so one stuck
// unit does not leak the others.
func removeAll(sup Supervisor, names []string) []error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, n := range names {
		if err := sup.Remove(ctx, n); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
