package injector

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// builtin is the in-process supervisor for hosts without root or systemd. It
// keeps systemd's semantics for KillMode=process, Restart=always: stop sends
// SIGTERM to the main pid only (SIGKILL after TimeoutStopSec) and never
// restarts; any other exit of the main process restarts it after RestartSec.
// The runner is a child subreaper, so orphans of a unit become its children
// and are reaped here instead of by init.
type builtin struct {
	rec  *Record
	self int

	mu     sync.Mutex
	units  map[string]*bunit
	closed bool

	watch *watchdog
}

type bunit struct {
	name  string
	spec  UnitSpec
	log   *os.File
	state string // active | deactivating | auto-restart | inactive
	gen   int    // incarnation counter; a stale monitor does nothing
	main  *PidFD // nil when there is no main process
	exit  chan struct{}
	timer *time.Timer
	sids  map[int]bool // sessions of every incarnation (a stand-in for the unit's cgroup)
}

func newBuiltin(stateDir string) (*builtin, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("builtin supervisor: PR_SET_CHILD_SUBREAPER: %w", err)
	}
	rec, err := newRecord(KindBuiltin, stateDir)
	if err != nil {
		return nil, fmt.Errorf("builtin supervisor: %w", err)
	}
	if err := rec.save(); err != nil {
		return nil, fmt.Errorf("builtin supervisor: %w", err)
	}
	b := &builtin{rec: rec, self: os.Getpid(), units: map[string]*bunit{}}
	if b.watch, err = startWatchdog(rec); err != nil {
		rec.remove()
		return nil, fmt.Errorf("builtin supervisor: %w", err)
	}
	reaper.add(b)
	return b, nil
}

func (b *builtin) Kind() string { return KindBuiltin }

func (b *builtin) unit(name string) (*bunit, error) {
	u := b.units[unitName(name)]
	if u == nil {
		return nil, fmt.Errorf("unit %s: %w", unitName(name), ErrUnknownUnit)
	}
	return u, nil
}

func (b *builtin) Start(ctx context.Context, spec UnitSpec) error {
	if err := validateSpec(spec); err != nil {
		return err
	}
	name := unitName(spec.Name)
	logf, err := openLog(spec.LogPath)
	if err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		logf.Close()
		return fmt.Errorf("start %s: supervisor closed", name)
	}
	if b.units[name] != nil {
		logf.Close()
		return fmt.Errorf("start %s: unit already exists", name)
	}
	u := &bunit{name: name, spec: spec, log: logf, state: "inactive", sids: map[int]bool{}}
	if err := b.spawn(u); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	b.units[name] = u
	return nil
}

func openLog(path string) (*os.File, error) {
	if path == "" {
		return os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	}
	return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
}

// spawn starts one incarnation; called with b.mu held.
func (b *builtin) spawn(u *bunit) error {
	env := mergeEnv(os.Environ(), append(append([]string(nil), u.spec.Env...), b.rec.Tag(), EnvUnitTag+"="+u.name))
	cmd := &exec.Cmd{
		Path: u.spec.Argv[0], Args: u.spec.Argv, Env: env, Dir: u.spec.Dir,
		Stdout: u.log, Stderr: u.log,
		// Its own session: the session id marks every process of this
		// incarnation that does not start a session of its own.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	reaper.mains.Store(pid, true)
	// The child is not reaped before cmd.Wait, so pid still names it here.
	p, err := Identify(pid)
	var fd *PidFD
	if err == nil {
		fd, err = OpenPidFD(p)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		reaper.mains.Delete(pid)
		return fmt.Errorf("identify main pid %d: %w", pid, err)
	}
	u.gen++
	u.main, u.exit, u.state = fd, make(chan struct{}), "active"
	u.sids[pid] = true
	go b.monitor(u, cmd, fd, u.gen, u.exit)
	return nil
}

// monitor waits for one incarnation and applies Restart=always.
func (b *builtin) monitor(u *bunit, cmd *exec.Cmd, fd *PidFD, gen int, exit chan struct{}) {
	_ = cmd.Wait()
	reaper.mains.Delete(fd.PID)
	b.mu.Lock()
	defer b.mu.Unlock()
	fd.Close()
	close(exit)
	if u.gen != gen {
		return
	}
	u.main = nil
	if u.state == "deactivating" || u.state == "inactive" || b.closed {
		u.state = "inactive"
		return
	}
	// An exit nobody asked for: Restart=always.
	u.state = "auto-restart"
	u.timer = time.AfterFunc(u.spec.RestartSec, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if u.state == "auto-restart" && u.gen == gen && !b.closed {
			if err := b.spawn(u); err != nil {
				fmt.Fprintf(u.log, "vmchaos builtin supervisor: restart %s: %v\n", u.name, err)
				u.state = "inactive"
			}
		}
	})
}

func (b *builtin) Stop(ctx context.Context, unit string) error {
	b.mu.Lock()
	u, err := b.unit(unit)
	if err != nil {
		b.mu.Unlock()
		return fmt.Errorf("stop: %w", err)
	}
	if u.timer != nil {
		u.timer.Stop()
	}
	if u.main == nil {
		u.state = "inactive"
		b.mu.Unlock()
		return nil
	}
	u.state = "deactivating"
	main, exit, tmo := u.main.Proc, u.exit, timeoutStop(u.spec)
	b.mu.Unlock()
	// KillMode=process: SIGTERM to the main process only.
	if err := signalProc(main, syscall.SIGTERM); err != nil && !errors.Is(err, ErrGone) {
		return fmt.Errorf("stop %s: %w", unitName(unit), err)
	}
	t := time.NewTimer(tmo)
	defer t.Stop()
	select {
	case <-exit:
	case <-t.C:
		_ = signalProc(main, syscall.SIGKILL)
		select {
		case <-exit:
		case <-ctx.Done():
			return fmt.Errorf("stop %s: %w", unitName(unit), ctx.Err())
		}
	case <-ctx.Done():
		return fmt.Errorf("stop %s: %w", unitName(unit), ctx.Err())
	}
	b.mu.Lock()
	if u.state == "deactivating" {
		u.state = "inactive"
	}
	b.mu.Unlock()
	return nil
}

func (b *builtin) StartAgain(ctx context.Context, unit string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	u, err := b.unit(unit)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	switch u.state {
	case "active":
		return nil
	case "deactivating":
		return fmt.Errorf("start %s: unit is stopping", u.name)
	}
	if u.timer != nil {
		u.timer.Stop()
	}
	if err := b.spawn(u); err != nil {
		return fmt.Errorf("start %s: %w", u.name, err)
	}
	return nil
}

func (b *builtin) Restart(ctx context.Context, unit string) error {
	if err := b.Stop(ctx, unit); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return b.StartAgain(ctx, unit)
}

func (b *builtin) KillMain(ctx context.Context, unit string, sig syscall.Signal) error {
	b.mu.Lock()
	u, err := b.unit(unit)
	if err != nil {
		b.mu.Unlock()
		return fmt.Errorf("kill main: %w", err)
	}
	if u.main == nil {
		b.mu.Unlock()
		return fmt.Errorf("kill main %s: no main process", u.name)
	}
	err = u.main.Signal(sig)
	b.mu.Unlock()
	return err
}

func (b *builtin) KillAll(ctx context.Context, unit string, sig syscall.Signal) error {
	procs, err := b.Procs(ctx, unit)
	if err != nil {
		return fmt.Errorf("kill all: %w", err)
	}
	var errs []error
	for _, p := range procs {
		if err := signalProc(p, sig); err != nil && !errors.Is(err, ErrGone) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (b *builtin) MainPID(ctx context.Context, unit string) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	u, err := b.unit(unit)
	if err != nil {
		return 0, err
	}
	if u.main == nil {
		return 0, nil
	}
	return u.main.PID, nil
}

func (b *builtin) WaitActive(ctx context.Context, unit string) error {
	for {
		b.mu.Lock()
		u, err := b.unit(unit)
		active := err == nil && u.state == "active" && u.main != nil
		b.mu.Unlock()
		if err != nil {
			return err
		}
		if active {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait active %s: %w", unitName(unit), ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Procs lists the live processes of the unit: the main process first, then
// every process of any incarnation's session or carrying the unit's tag.
func (b *builtin) Procs(ctx context.Context, unit string) ([]Proc, error) {
	b.mu.Lock()
	u, err := b.unit(unit)
	if err != nil {
		b.mu.Unlock()
		return nil, err
	}
	var out []Proc
	seen := map[int]bool{}
	if u.main != nil && u.main.Alive() {
		out = append(out, u.main.Proc)
		seen[u.main.PID] = true
	}
	sids := make(map[int]bool, len(u.sids))
	for s := range u.sids {
		sids[s] = true
	}
	tag, utag := b.rec.Tag(), EnvUnitTag+"="+u.name
	b.mu.Unlock()
	var rest []Proc
	for _, pid := range allPIDs() {
		if seen[pid] || pid == b.self {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.state == 'Z' || st.start < b.rec.Runner.Start {
			continue
		}
		if sids[st.sid] || (environHas(pid, utag) && environHas(pid, tag)) {
			rest = append(rest, Proc{PID: pid, Start: st.start})
		}
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].PID < rest[j].PID })
	return append(out, rest...), nil
}

// Owns: a process this runner started or a descendant of one (also after it
// was reparented, which the run tag shows).
func (b *builtin) Owns(p Proc) bool {
	if !p.Exists() || p.PID == b.self {
		return false
	}
	return descendsFrom(p.PID, b.self) || environHas(p.PID, b.rec.Tag())
}

func (b *builtin) HostPID(ctx context.Context, pid int) (int, error) { return pid, nil }

func (b *builtin) Remove(ctx context.Context, unit string) error {
	if err := b.Stop(ctx, unit); err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	if err := b.killRest(ctx, unit); err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	b.mu.Lock()
	if u := b.units[unitName(unit)]; u != nil {
		u.log.Close()
		delete(b.units, unitName(unit))
	}
	b.mu.Unlock()
	return nil
}

// killRest SIGKILLs what KillMode=process left in the unit and waits until
// it is gone.
func (b *builtin) killRest(ctx context.Context, unit string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs, err := b.Procs(ctx, unit)
		if err != nil {
			return err
		}
		if len(procs) == 0 {
			return nil
		}
		for _, p := range procs {
			_ = signalProc(p, syscall.SIGKILL)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("unit %s: %d process(es) survive SIGKILL", unitName(unit), len(procs))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (b *builtin) Close() error {
	b.mu.Lock()
	names := slices.Collect(maps.Keys(b.units))
	b.mu.Unlock()
	errs := removeAll(b, names)
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	// Let the reaper collect the last zombies before we stop claiming them.
	reaper.sweep()
	reaper.remove(b)
	if err := b.watch.stop(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		b.rec.remove()
	}
	return errors.Join(errs...)
}

// reaper collects zombie children of this process that belong to a builtin
// supervisor's units (orphans reparented to us as subreaper). It never reaps a
// child it cannot attribute to a unit: those belong to os/exec callers.
var reaper = &reaperT{sups: map[*builtin]bool{}}

type reaperT struct {
	mu      sync.Mutex
	running bool
	sups    map[*builtin]bool
	ours    map[Proc]bool // children seen alive carrying a run tag or a unit session
	foreign map[Proc]bool // children seen alive that belong to someone else
	mains   sync.Map      // pid → true: main processes, reaped by their monitor
	// comms: task names (/proc/PID/comm) of orphans registered by
	// ReapOrphans (a manager case's VMMs), with their registration count
	comms map[string]int
}

func (r *reaperT) add(b *builtin) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sups[b] = true
	r.startLocked()
}

// startLocked starts the sweeping goroutine unless it runs; called with
// r.mu held.
func (r *reaperT) startLocked() {
	if r.running {
		return
	}
	// One goroutine while any builtin supervisor (or a zombie it owned)
	// remains; it stops itself after the last one.
	r.running = true
	if r.ours == nil {
		r.ours, r.foreign = map[Proc]bool{}, map[Proc]bool{}
	}
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		defer signal.Stop(ch)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ch:
			case <-t.C:
			}
			if !r.sweep() {
				return
			}
		}
	}()
}

func (r *reaperT) remove(b *builtin) {
	r.mu.Lock()
	delete(r.sups, b)
	r.mu.Unlock()
}

// sweep reaps attributable zombie children; it reports whether the reaper
// should keep running.
func (r *reaperT) sweep() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sups) == 0 && len(r.ours) == 0 && len(r.comms) == 0 {
		r.running = false
		return false
	}
	self := os.Getpid()
	seen := map[Proc]bool{}
	for _, pid := range childrenOf(self) {
		if _, isMain := r.mains.Load(pid); isMain {
			continue
		}
		st, err := readStat(pid)
		if err != nil {
			continue
		}
		p := Proc{PID: pid, Start: st.start}
		seen[p] = true
		if st.state != 'Z' {
			if !r.ours[p] && !r.foreign[p] {
				if r.tagged(pid, st.sid) {
					r.ours[p] = true
				} else {
					r.foreign[p] = true
				}
			}
			continue
		}
		if r.ours[p] || (!r.foreign[p] && r.tagged(pid, st.sid)) || r.orphanComm(pid) {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			delete(r.ours, p)
		}
	}
	for p := range r.ours {
		if !seen[p] {
			delete(r.ours, p)
		}
	}
	for p := range r.foreign {
		if !seen[p] {
			delete(r.foreign, p)
		}
	}
	return true
}

// tagged: the pid carries a live supervisor's run tag, or is in the session
// of one of its units' incarnations. Called with r.mu held.
func (r *reaperT) tagged(pid, sid int) bool {
	for b := range r.sups {
		if environHas(pid, b.rec.Tag()) {
			return true
		}
		b.mu.Lock()
		for _, u := range b.units {
			if u.sids[sid] {
				b.mu.Unlock()
				return true
			}
		}
		b.mu.Unlock()
	}
	return false
}
