package injector

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// dbusSup drives a systemd over D-Bus with transient units. The host's
// systemd (kind systemd) and the private one of a sandbox share it; they
// differ in how the connection is made, where the unit cgroups are seen from
// the host, and how pids are translated.
type dbusSup struct {
	kind   string
	conn   *sd.Conn
	rec    *Record
	cgRoot string // host path of the manager's cgroup root
	self   int
	// toHost maps a pid as the manager (and its units) see it to a host pid.
	toHost func(pid int) (int, error)
	// inScope reports whether a host process is inside this manager's world
	// (sandbox: its pid namespace).
	inScope func(p Proc) bool
	// teardown runs after every unit is removed (sandbox: kill the namespace).
	teardown func() error
	// managerPID is the manager's pid as the harness sees it: a unit's main
	// process is its child (see quickMainPID).
	managerPID int

	mu     sync.Mutex
	units  map[string]UnitSpec
	cgDirs map[string]string // unit name → its control group dir, see cgroupDir
	closed bool
}

// cgroup2Mount returns where the unified cgroup hierarchy is mounted
// (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host). The last
// usable entry wins: a later mount hides an earlier one at or above its path
// (a sandbox's /sys is rebound over the host's, whose cgroup2 submount stays
// listed first but is no longer reachable).
func cgroup2Mount() string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		pre, post, ok := strings.Cut(lines[i], " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		f := strings.Fields(pre)
		if len(f) < 5 {
			continue
		}
		if _, err := os.Stat(filepath.Join(f[4], "cgroup.procs")); err == nil {
			return f[4]
		}
	}
	return ""
}

// systemdIsPID1 reports whether the host's PID 1 is systemd.
func systemdIsPID1() bool {
	fi, err := os.Stat("/run/systemd/system")
	return err == nil && fi.IsDir() && strings.Contains(strings.Join(cmdline(1), " "), "systemd")
}

func newSystemd(ctx context.Context, stateDir string) (Supervisor, error) {
	if !systemdIsPID1() {
		return nil, fmt.Errorf("%w: PID 1 is %q, not systemd", ErrUnavailable, filepath.Base(firstOr(cmdline(1), "?")))
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: systemd supervisor needs root (transient system units)", ErrUnavailable)
	}
	cg := cgroup2Mount()
	if cg == "" {
		return nil, fmt.Errorf("%w: no cgroup2 mount", ErrUnavailable)
	}
	// Not sd.NewSystemdConnectionContext(ctx): it binds the connection to
	// ctx (dbus.WithContext), so a connect timeout closed it as soon as this
	// function returned ("dbus: connection closed by user" on the first
	// call). Found by running the systemd contract under a sandbox's PID 1.
	conn, err := dialPrivate("/run/systemd/private")
	if err != nil {
		return nil, fmt.Errorf("%w: connect to systemd: %v", ErrUnavailable, err)
	}
	rec, err := newRecord(KindSystemd, stateDir)
	if err == nil {
		err = rec.save()
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	s := &dbusSup{kind: KindSystemd, conn: conn, rec: rec, cgRoot: cg, self: os.Getpid(), units: map[string]UnitSpec{},
		toHost: func(pid int) (int, error) { return pid, nil }, managerPID: 1}
	s.inScope = func(p Proc) bool { return s.inOurUnits(p.PID) }
	return s, nil
}

func firstOr(s []string, def string) string {
	if len(s) == 0 {
		return def
	}
	return s[0]
}

func (s *dbusSup) Kind() string { return s.kind }

// job runs a systemd job and waits for its JobRemoved result.
func (s *dbusSup) job(ctx context.Context, what string, f func(chan<- string) (int, error)) error {
	ch := make(chan string, 1)
	if _, err := f(ch); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	select {
	case r := <-ch:
		if r != "done" {
			return fmt.Errorf("%s: job %s", what, r)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
}

func usec(d time.Duration) uint64 { return uint64(d / time.Microsecond) }

func (s *dbusSup) props(spec UnitSpec) []sd.Property {
	env := mergeEnv(os.Environ(), append(append([]string(nil), spec.Env...), s.rec.Tag(), EnvUnitTag+"="+unitName(spec.Name)))
	// systemd refuses assignments it cannot represent; a caller's odd env
	// entry must not make the unit fail to start.
	clean := env[:0]
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); ok && k != "" && !strings.ContainsAny(kv, "\n\x00") {
			clean = append(clean, kv)
		}
	}
	p := []sd.Property{
		sd.PropDescription("vmchaos " + spec.Name),
		sd.PropExecStart(spec.Argv, false),
		// exec: the start job completes once execve succeeded, so MainPID
		// is the service binary, not systemd's forked child before exec.
		{Name: "Type", Value: dbus.MakeVariant("exec")},
		{Name: "KillMode", Value: dbus.MakeVariant("process")},
		{Name: "Restart", Value: dbus.MakeVariant("always")},
		{Name: "RestartUSec", Value: dbus.MakeVariant(usec(spec.RestartSec))},
		{Name: "TimeoutStopUSec", Value: dbus.MakeVariant(usec(timeoutStop(spec)))},
		// Chaos kills a unit many times a second; systemd's start rate limit
		// would otherwise put it into `failed`.
		{Name: "StartLimitIntervalUSec", Value: dbus.MakeVariant(uint64(0))},
		{Name: "Environment", Value: dbus.MakeVariant(clean)},
	}
	if spec.Dir != "" {
		p = append(p, sd.Property{Name: "WorkingDirectory", Value: dbus.MakeVariant(spec.Dir)})
	}
	if spec.LogPath != "" {
		p = append(p,
			sd.Property{Name: "StandardOutputFileToAppend", Value: dbus.MakeVariant(spec.LogPath)},
			sd.Property{Name: "StandardErrorFileToAppend", Value: dbus.MakeVariant(spec.LogPath)})
	} else {
		p = append(p,
			sd.Property{Name: "StandardOutput", Value: dbus.MakeVariant("null")},
			sd.Property{Name: "StandardError", Value: dbus.MakeVariant("null")})
	}
	return p
}

func (s *dbusSup) Start(ctx context.Context, spec UnitSpec) error {
	if err := validateSpec(spec); err != nil {
		return err
	}
	name := unitName(spec.Name)
	if spec.LogPath != "" {
		// systemd opens it as root in its own mount namespace; create it here
		// so that it exists with the caller's ownership.
		if f, err := openLog(spec.LogPath); err == nil {
			f.Close()
		}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("start %s: supervisor closed", name)
	}
	if _, ok := s.units[name]; ok {
		s.mu.Unlock()
		return fmt.Errorf("start %s: unit already exists", name)
	}
	s.units[name] = spec
	if s.kind == KindSystemd {
		s.rec.Units = append(s.rec.Units, name)
		_ = s.rec.save()
	}
	s.mu.Unlock()
	return s.startTransient(ctx, name, spec)
}

func (s *dbusSup) startTransient(ctx context.Context, name string, spec UnitSpec) error {
	return s.job(ctx, "start "+name, func(ch chan<- string) (int, error) {
		return s.conn.StartTransientUnitContext(ctx, name, "fail", s.props(spec), ch)
	})
}

func (s *dbusSup) spec(unit string) (string, UnitSpec, error) {
	name := unitName(unit)
	s.mu.Lock()
	defer s.mu.Unlock()
	spec, ok := s.units[name]
	if !ok {
		return name, spec, fmt.Errorf("unit %s: %w", name, ErrUnknownUnit)
	}
	return name, spec, nil
}

func (s *dbusSup) Stop(ctx context.Context, unit string) error {
	name, _, err := s.spec(unit)
	if err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	err = s.job(ctx, "stop "+name, func(ch chan<- string) (int, error) {
		return s.conn.StopUnitContext(ctx, name, "replace", ch)
	})
	if err != nil && isNoSuchUnit(err) {
		return nil // a stopped transient unit may already be garbage-collected
	}
	return err
}

func isNoSuchUnit(err error) bool {
	var de dbus.Error
	if errors.As(err, &de) && strings.HasSuffix(de.Name, ".NoSuchUnit") {
		return true
	}
	return err != nil && (strings.Contains(err.Error(), "not loaded") || strings.Contains(err.Error(), "not found"))
}

func (s *dbusSup) StartAgain(ctx context.Context, unit string) error {
	name, spec, err := s.spec(unit)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	err = s.job(ctx, "start "+name, func(ch chan<- string) (int, error) {
		return s.conn.StartUnitContext(ctx, name, "replace", ch)
	})
	if err != nil && isNoSuchUnit(err) {
		// Transient units are unloaded once inactive: define it again.
		_ = s.conn.ResetFailedUnitContext(ctx, name)
		return s.startTransient(ctx, name, spec)
	}
	return err
}

func (s *dbusSup) Restart(ctx context.Context, unit string) error {
	name, spec, err := s.spec(unit)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	err = s.job(ctx, "restart "+name, func(ch chan<- string) (int, error) {
		return s.conn.RestartUnitContext(ctx, name, "replace", ch)
	})
	if err != nil && isNoSuchUnit(err) {
		return s.startTransient(ctx, name, spec)
	}
	return err
}

func (s *dbusSup) mainNS(ctx context.Context, name string) (int, error) {
	p, err := s.conn.GetServicePropertyContext(ctx, name, "MainPID")
	if err != nil {
		return 0, fmt.Errorf("main pid of %s: %w", name, err)
	}
	v, _ := p.Value.Value().(uint32)
	return int(v), nil
}

func (s *dbusSup) MainPID(ctx context.Context, unit string) (int, error) {
	name, _, err := s.spec(unit)
	if err != nil {
		return 0, err
	}
	ns, err := s.mainNS(ctx, name)
	if err != nil || ns == 0 {
		return 0, err
	}
	h, err := s.toHost(ns)
	if errors.Is(err, ErrGone) {
		// systemd has reaped its main process but not yet processed the
		// exit: there is no main process right now.
		return 0, nil
	}
	return h, err
}

// KillMain signals the main pid directly (not through systemd), so systemd
// sees an unexpected death exactly as after a crash.
func (s *dbusSup) KillMain(ctx context.Context, unit string, sig syscall.Signal) error {
	pid, err := s.MainPID(ctx, unit)
	if err != nil {
		return fmt.Errorf("kill main: %w", err)
	}
	if pid == 0 {
		return fmt.Errorf("kill main %s: no main process", unitName(unit))
	}
	p, err := Identify(pid)
	if err != nil {
		return fmt.Errorf("kill main %s: %w", unitName(unit), err)
	}
	if !s.Owns(p) {
		return fmt.Errorf("kill main %s: pid %d: %w", unitName(unit), pid, ErrNotOwned)
	}
	return signalProc(p, sig)
}

func (s *dbusSup) KillAll(ctx context.Context, unit string, sig syscall.Signal) error {
	name, _, err := s.spec(unit)
	if err != nil {
		return fmt.Errorf("kill all: %w", err)
	}
	if err := s.conn.KillUnitWithTarget(ctx, name, sd.All, int32(sig)); err != nil {
		return fmt.Errorf("kill all %s: %w", name, err)
	}
	return nil
}

func (s *dbusSup) WaitActive(ctx context.Context, unit string) error {
	name, _, err := s.spec(unit)
	if err != nil {
		return err
	}
	for {
		p, err := s.conn.GetUnitPropertyContext(ctx, name, "ActiveState")
		if err == nil && p.Value.Value() == "active" {
			if pid, err := s.mainNS(ctx, name); err == nil && pid != 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait active %s: %w", name, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// cgroupDir is the host path of the unit's cgroup.
func (s *dbusSup) cgroupDir(ctx context.Context, name string) string {
	// A unit's control group is fixed by its name: asked once. A D-Bus
	// round trip costs 1 ms to tens of ms while systemd is busy, and a
	// power cut lists the units' processes between its trigger and its stop.
	s.mu.Lock()
	dir, ok := s.cgDirs[name]
	s.mu.Unlock()
	if ok {
		return dir
	}
	p, err := s.conn.GetServicePropertyContext(ctx, name, "ControlGroup")
	cg, _ := func() (string, bool) {
		if err != nil {
			return "", false
		}
		v, ok := p.Value.Value().(string)
		return v, ok
	}()
	if cg == "" {
		cg = "/system.slice/" + name
	} else {
		s.mu.Lock()
		if s.cgDirs == nil {
			s.cgDirs = map[string]string{}
		}
		s.cgDirs[name] = filepath.Join(s.cgRoot, cg)
		s.mu.Unlock()
	}
	return filepath.Join(s.cgRoot, cg)
}

// quickMainPID names a unit's main process from /proc alone, for a fault
// that must not wait for a D-Bus round trip between its trigger and its call
// (a restart in a recovery: tens of ms while systemd is busy restarting
// units). The main process is the manager's child in the unit's cgroup that
// runs the unit's argv and leads its own session (systemd makes a service's
// process a session leader). Processes an earlier main left behind
// (KillMode is process) are the manager's children too once orphaned, and
// may run the same argv, but sit in that main's session; of several, the
// youngest wins. 0: no such process, or the cgroup is not known yet (ask
// MainPID then).
func (s *dbusSup) quickMainPID(unit string) int {
	name, spec, err := s.spec(unit)
	if err != nil || s.managerPID == 0 {
		return 0
	}
	s.mu.Lock()
	dir, ok := s.cgDirs[name]
	s.mu.Unlock()
	if !ok {
		return 0
	}
	best, bestStart := 0, uint64(0)
	for _, pid := range cgroupProcs(dir) {
		st, err := readStat(pid)
		if err != nil || st.state == 'Z' || st.ppid != s.managerPID || st.sid != pid || st.start < bestStart {
			continue
		}
		if slices.Equal(cmdline(pid), spec.Argv) {
			best, bestStart = pid, st.start
		}
	}
	return best
}

// warmMain learns ahead of need what quickMainPID reads: the unit's cgroup.
func (s *dbusSup) warmMain(ctx context.Context, unit string) {
	if name, _, err := s.spec(unit); err == nil {
		s.cgroupDir(ctx, name)
	}
}

// cgroupProcs lists the host pids in a cgroup tree.
func cgroupProcs(dir string) []int {
	var out []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
		return nil
	})
	return out
}

func (s *dbusSup) Procs(ctx context.Context, unit string) ([]Proc, error) {
	name, _, err := s.spec(unit)
	if err != nil {
		return nil, err
	}
	main, _ := s.MainPID(ctx, unit)
	var out, rest []Proc
	for _, pid := range cgroupProcs(s.cgroupDir(ctx, name)) {
		st, err := readStat(pid)
		if err != nil || st.state == 'Z' {
			continue
		}
		p := Proc{PID: pid, Start: st.start}
		if pid == main {
			out = append(out, p)
		} else {
			rest = append(rest, p)
		}
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].PID < rest[j].PID })
	return append(out, rest...), nil
}

// inOurUnits: the process sits in the cgroup of a unit we started.
func (s *dbusSup) inOurUnits(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ln := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(ln, "0::") {
			continue
		}
		for name := range s.units {
			if strings.Contains(ln, "/"+name) {
				return true
			}
		}
	}
	return false
}

func (s *dbusSup) Owns(p Proc) bool {
	if !p.Exists() || p.PID == s.self {
		return false
	}
	// A process carrying this run's tag descends from a unit we started even
	// where it left the unit's cgroup (vmctl gives each VMM a cgroup of its
	// own, so killing the agent's unit spares it).
	return s.inScope(p) || descendsFrom(p.PID, s.self) || environHas(p.PID, s.rec.Tag())
}

func (s *dbusSup) HostPID(ctx context.Context, pid int) (int, error) { return s.toHost(pid) }

func (s *dbusSup) Remove(ctx context.Context, unit string) error {
	name, _, err := s.spec(unit)
	if err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	dir := s.cgroupDir(ctx, name)
	if err := s.Stop(ctx, unit); err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(cgroupProcs(dir)) > 0 {
		_ = s.conn.KillUnitWithTarget(ctx, name, sd.All, int32(syscall.SIGKILL))
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("remove %s: processes survive SIGKILL in %s", name, dir)
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = s.conn.ResetFailedUnitContext(ctx, name)
	s.mu.Lock()
	delete(s.units, name)
	s.mu.Unlock()
	return nil
}

func (s *dbusSup) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	names := slices.Collect(maps.Keys(s.units))
	s.mu.Unlock()
	errs := removeAll(s, names)
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.conn.Close()
	if s.teardown != nil {
		if err := s.teardown(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		s.rec.remove()
	}
	return errors.Join(errs...)
}

// cleanHostUnits kills and forgets transient units a dead run left in the
// host's systemd.
func cleanHostUnits(ctx context.Context, units []string) {
	if !systemdIsPID1() {
		return
	}
	conn, err := sd.NewSystemdConnectionContext(ctx)
	if err != nil {
		return
	}
	defer conn.Close()
	for _, u := range units {
		_ = conn.KillUnitWithTarget(ctx, u, sd.All, int32(syscall.SIGKILL))
		ch := make(chan string, 1)
		if _, err := conn.StopUnitContext(ctx, u, "replace", ch); err == nil {
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
			}
		}
		_ = conn.ResetFailedUnitContext(ctx, u)
	}
}
