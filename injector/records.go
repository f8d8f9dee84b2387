package injector

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/durable"
)

// EnvRegistry overrides where runs record what they started.
const EnvRegistry = "VMCHAOS_INJECTOR_REGISTRY"

// Environment tags every unit process inherits: they let a later run (or
// `vmchaos doctor`) find processes of a run whose runner was SIGKILLed, even
// after they were reparented and changed session.
const (
	EnvRunTag  = "VMCHAOS_INJECTOR_RUN"
	EnvUnitTag = "VMCHAOS_INJECTOR_UNIT"
)

// EnvRegistryIndex overrides where registries outside the default one are
// indexed (tests point it at a temp dir).
const EnvRegistryIndex = "VMCHAOS_INJECTOR_INDEX"

// defaultRegistry is outside /run and /tmp cleaners and shared with a sandbox.
const defaultRegistry = "/var/tmp/vmchaos-injector"

// Registry is the directory of run records: $VMCHAOS_INJECTOR_REGISTRY or
// /var/tmp/vmchaos-injector.
func Registry() string {
	if d := os.Getenv(EnvRegistry); d != "" {
		return d
	}
	return defaultRegistry
}

// RegistryIndex is the one well-known place where every registry other than
// the default is named ($VMCHAOS_INJECTOR_INDEX or
// /var/tmp/vmchaos-injector/index): a run whose registry is a temp dir (a
// bench, a test) indexes it before its first record, so doctor finds that
// run's leftovers whatever registry it used.
func RegistryIndex() string {
	if d := os.Getenv(EnvRegistryIndex); d != "" {
		return d
	}
	return filepath.Join(defaultRegistry, "index")
}

// indexRegistry names dir in the index (one file per registry, named by
// a hash of its absolute path, holding that path).
func indexRegistry(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil || abs == defaultRegistry {
		return err
	}
	idx := RegistryIndex()
	sum := sha256.Sum256([]byte(abs))
	f := filepath.Join(idx, hex.EncodeToString(sum[:8]))
	if b, err := os.ReadFile(f); err == nil && string(b) == abs {
		return nil
	}
	if err := os.MkdirAll(idx, 0o1777); err != nil {
		return fmt.Errorf("registry index: %w", err)
	}
	if err := durable.WriteFile(f, []byte(abs), 0o644); err != nil {
		return fmt.Errorf("registry index: %w", err)
	}
	return nil
}

// Registries lists primary, the default registry and every indexed registry
// that still exists, each once. Index entries of registries that are gone
// (a removed temp dir) are pruned. With $VMCHAOS_INJECTOR_INDEX set (a
// test's private world) the default registry is left out: only primary and
// what that index names are read.
func Registries(primary string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(d string) {
		if abs, err := filepath.Abs(d); err == nil && !seen[abs] {
			seen[abs] = true
			out = append(out, abs)
		}
	}
	add(primary)
	if os.Getenv(EnvRegistryIndex) == "" {
		add(defaultRegistry)
	}
	files, _ := filepath.Glob(filepath.Join(RegistryIndex(), "*"))
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		d := string(b)
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			_ = os.Remove(f) // its registry is gone, and every record in it
			continue
		}
		add(d)
	}
	return out
}

// Record is what a supervisor writes before it starts anything, so that the
// next run can clean up after a runner that was SIGKILLed.
type Record struct {
	RunID    string `json:"run_id"`
	Kind     string `json:"kind"`
	StateDir string `json:"state_dir"`
	Runner   Proc   `json:"runner"`
	// RunnerPidNS is the runner's pid namespace: its pid means nothing in
	// another one (a run inside `vmchaos sandbox` shares this registry).
	RunnerPidNS string    `json:"runner_pid_ns,omitempty"`
	Created     time.Time `json:"created"`
	// sandbox
	Init   *Proc    `json:"init,omitempty"`   // the namespaced systemd (host pid)
	PidNS  string   `json:"pid_ns,omitempty"` // its pid namespace
	Cgroup string   `json:"cgroup,omitempty"` // host path of its cgroup2 subtree
	Units  []string `json:"units,omitempty"`  // systemd kind: transient units on the host
	// Paths are the dirs the run made outside its report dir (the stack's
	// temp dir: stores, VM disks, sockets, logs before they are copied),
	// Netns the network namespaces (/run/netns/NAME); RecordPaths adds them.
	Paths []string `json:"paths,omitempty"`
	Netns []string `json:"netns,omitempty"`
}

// Tag is the KEY=VALUE every process of this run carries.
func (r *Record) Tag() string { return EnvRunTag + "=" + r.RunID }

func newRunID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
}

func newRecord(kind, stateDir string) (*Record, error) {
	self, err := Identify(os.Getpid())
	if err != nil {
		return nil, err
	}
	return &Record{RunID: newRunID(), Kind: kind, StateDir: stateDir, Runner: self, RunnerPidNS: pidNS(os.Getpid()),
		Created: time.Now().UTC()}, nil
}

func (r *Record) path() string { return filepath.Join(Registry(), r.RunID+".json") }

// save writes the record durably; it is written before the thing it describes
// is started, so a crash never leaves an unrecorded process.
func (r *Record) save() error {
	if err := os.MkdirAll(Registry(), 0o1777); err != nil {
		return fmt.Errorf("run record: %w", err)
	}
	if err := indexRegistry(Registry()); err != nil {
		return fmt.Errorf("run record: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("run record: %w", err)
	}
	if err := durable.WriteFile(r.path(), b, 0o644); err != nil {
		return fmt.Errorf("run record: %w", err)
	}
	return nil
}

func (r *Record) remove() {
	_ = os.Remove(r.path())
	_ = durable.SyncDir(Registry())
}

// Leftover is a run whose runner is gone, with what it left behind.
type Leftover struct {
	Record Record   `json:"record"`
	File   string   `json:"file"`
	Procs  []Proc   `json:"procs"`            // live processes of that run
	Cgroup string   `json:"cgroup,omitempty"` // a cgroup dir that still exists
	Paths  []string `json:"paths,omitempty"`  // recorded dirs that still exist
	Netns  []string `json:"netns,omitempty"`  // recorded namespaces that still exist
}

// String is one human line.
func (l Leftover) String() string {
	var pids []string
	for _, p := range l.Procs {
		pids = append(pids, fmt.Sprint(p.PID))
	}
	s := fmt.Sprintf("run %s (%s, runner pid %d gone): %d process(es) [%s]", l.Record.RunID, l.Record.Kind,
		l.Record.Runner.PID, len(l.Procs), strings.Join(pids, " "))
	if l.Cgroup != "" {
		s += ", cgroup " + l.Cgroup
	}
	if len(l.Record.Units) > 0 {
		s += ", host units " + strings.Join(l.Record.Units, " ")
	}
	if len(l.Paths) > 0 {
		s += ", dirs " + strings.Join(l.Paths, " ")
	}
	if len(l.Netns) > 0 {
		s += ", netns " + strings.Join(l.Netns, " ")
	}
	return s
}

// removeRecordsOfNS removes the records in registry dir whose runner lived in
// pid namespace ns, once that namespace is gone (and every process with it).
func removeRecordsOfNS(dir, ns string) {
	if ns == "" {
		return
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, f := range files {
		var r Record
		if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &r) == nil && r.RunnerPidNS == ns {
			_ = os.Remove(f)
		}
	}
	_ = durable.SyncDir(dir)
}

// FindLeftovers reads every record in dir whose runner no longer exists and
// lists the processes and cgroups of that run still present. Records of
// runners in another pid namespace are not judged: from inside a sandbox the
// host's runner is invisible, and from the host a sandboxed runner's pid names
// some other process, so either side would take a live run for dead and kill
// its processes. A sandbox's teardown removes the records made inside it.
func FindLeftovers(dir string) ([]Leftover, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("leftovers: %w", err)
	}
	sort.Strings(files)
	var out []Leftover
	var all []int
	ownNS := pidNS(os.Getpid())
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var r Record
		if err := json.Unmarshal(b, &r); err != nil || r.RunID == "" {
			continue
		}
		if r.RunnerPidNS != "" && r.RunnerPidNS != ownNS {
			continue // not ours to judge (see above)
		}
		if r.Runner.Alive() {
			continue // a live run owns it (a zombie runner is dead: an
			// orphaned runner may wait a while for init to reap it)
		}
		if all == nil {
			all = allPIDs()
		}
		l := Leftover{Record: r, File: f}
		l.Procs = runProcs(&r, all)
		if r.Cgroup != "" {
			if _, err := os.Stat(r.Cgroup); err == nil {
				l.Cgroup = r.Cgroup
			}
		}
		l.Paths, l.Netns = presentPaths(&r, f)
		out = append(out, l)
	}
	return out, nil
}

// runProcs finds the live processes of a recorded run: its namespaced init
// (sandbox) and everything that started after its runner and carries its
// tag or names one of its dirs in its command line (a command the runner
// ran itself, outside any unit, carries no tag).
func runProcs(r *Record, all []int) []Proc {
	var out []Proc
	seen := map[int]bool{}
	if r.Init != nil && r.Init.Exists() {
		out = append(out, *r.Init)
		seen[r.Init.PID] = true
	}
	tag := r.Tag()
	for _, pid := range all {
		if seen[pid] || pid == os.Getpid() {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.start < r.Runner.Start {
			continue
		}
		// A namespace inode can be reused once freed: the pid namespace
		// counts only together with the run's own cgroup.
		inNS := r.PidNS != "" && pidNS(pid) == r.PidNS && inCgroupTree(pid, r.Cgroup)
		if inNS || environHas(pid, tag) || namesPath(pid, r.Paths) {
			out = append(out, Proc{PID: pid, Start: st.start})
			seen[pid] = true
		}
	}
	return out
}

// inCgroupTree reports whether pid's cgroup2 path is dir or below it.
func inCgroupTree(pid int, dir string) bool {
	root := cgroup2Mount()
	if dir == "" || root == "" || !strings.HasPrefix(dir, root) {
		return false
	}
	rel := strings.TrimPrefix(dir, root)
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	for _, ln := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(ln, "0::"); ok {
			return p == rel || strings.HasPrefix(p, rel+"/")
		}
	}
	return false
}

// CleanLeftovers kills what FindLeftovers finds (SIGKILL through verified
// pidfds), removes the run's cgroups and record, and returns what it cleaned.
func CleanLeftovers(ctx context.Context, dir string) ([]Leftover, error) {
	ls, err := FindLeftovers(dir)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, l := range ls {
		if err := cleanLeftover(ctx, l); err != nil {
			errs = append(errs, fmt.Errorf("run %s: %w", l.Record.RunID, err))
		}
	}
	return ls, errors.Join(errs...)
}

// FindAllLeftovers is FindLeftovers over every registry Registries(primary)
// names: a run with a temp registry (a bench) is found too.
func FindAllLeftovers(primary string) ([]Leftover, error) {
	var out []Leftover
	var errs []error
	for _, d := range Registries(primary) {
		ls, err := FindLeftovers(d)
		out = append(out, ls...)
		if err != nil {
			errs = append(errs, fmt.Errorf("registry %s: %w", d, err))
		}
	}
	return out, errors.Join(errs...)
}

// CleanAllLeftovers is CleanLeftovers over every registry Registries(primary)
// names.
func CleanAllLeftovers(ctx context.Context, primary string) ([]Leftover, error) {
	var out []Leftover
	var errs []error
	for _, d := range Registries(primary) {
		ls, err := CleanLeftovers(ctx, d)
		out = append(out, ls...)
		if err != nil {
			errs = append(errs, fmt.Errorf("registry %s: %w", d, err))
		}
	}
	return out, errors.Join(errs...)
}

// killWait bounds how long doctor waits for what it SIGKILLed to die.
const killWait = 10 * time.Second

// killRun SIGKILLs the run's processes (the namespaced init first: the
// kernel then kills its whole pid namespace) and returns only once each is
// dead, seen through its pidfd, rescanning for processes forked meanwhile.
// A process still alive after killWait (half of it before, half after
// aborting orphaned FUSE connections) is an error naming it.
func killRun(ctx context.Context, l Leftover) error {
	done := map[Proc]bool{}
	procs := l.Procs
	for len(procs) > 0 {
		var fds []*PidFD
		for _, p := range procs {
			done[p] = true
			if fd, err := OpenPidFD(p); err == nil {
				_ = fd.Signal(syscall.SIGKILL)
				fds = append(fds, fd)
			}
		}
		alive := waitDead(ctx, fds, killWait/2)
		if len(alive) > 0 {
			// Hung on a dead run's FUSE server: abort its connection.
			if conns := abortOrphanFuse(); len(conns) > 0 {
				alive = waitDead(ctx, alive, killWait/2)
			}
		}
		for _, fd := range fds {
			reapOrphan(fd.Proc)
			fd.Close()
		}
		if len(alive) > 0 {
			var pids []string
			for _, fd := range alive {
				pids = append(pids, fmt.Sprint(fd.PID))
			}
			return fmt.Errorf("pid %s alive after SIGKILL (%v)", strings.Join(pids, " "), killWait)
		}
		procs = procs[:0]
		for _, p := range runProcs(&l.Record, allPIDs()) {
			if !done[p] {
				procs = append(procs, p)
			}
		}
	}
	return nil
}

// waitDead waits up to d for each pidfd's process to exit and returns those
// still alive.
func waitDead(ctx context.Context, fds []*PidFD, d time.Duration) []*PidFD {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var alive []*PidFD
	for _, fd := range fds {
		if fd.WaitExit(ctx) != nil {
			alive = append(alive, fd)
		}
	}
	return alive
}

// reapOrphan reaps p if it was reparented to this process (a subreaper), or
// it would stay a zombie of ours.
func reapOrphan(p Proc) {
	if st, err := readStat(p.PID); err == nil && st.start == p.Start && st.ppid == os.Getpid() {
		var ws unix.WaitStatus
		_, _ = unix.Wait4(p.PID, &ws, unix.WNOHANG, nil)
	}
}

func cleanLeftover(ctx context.Context, l Leftover) error {
	if err := killRun(ctx, l); err != nil {
		return err
	}
	if len(l.Record.Units) > 0 {
		cleanHostUnits(ctx, l.Record.Units)
	}
	if l.Cgroup != "" {
		if err := removeCgroupTree(ctx, l.Cgroup); err != nil {
			return err
		}
	}
	if l.Record.Kind == KindSandbox && l.Record.StateDir != "" {
		removeSandboxScratch(l.Record.StateDir)
	}
	if err := removeRunPaths(l); err != nil {
		return err
	}
	if l.Record.Kind == KindSandbox {
		removeRecordsOfNS(filepath.Dir(l.File), l.Record.PidNS) // runs made inside died with it
	}
	if err := os.Remove(l.File); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// removeCgroupTree removes a cgroup2 directory tree bottom-up, waiting for
// dying processes to leave it.
func removeCgroupTree(ctx context.Context, root string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		var last error
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
				last = err
			}
		}
		if _, err := os.Stat(root); os.IsNotExist(err) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("remove cgroup %s: %v", root, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// namesPath reports whether pid's command line names one of dirs or a path
// below it. Run dirs are vmchaos-<random>, so no other process names them.
func namesPath(pid int, dirs []string) bool {
	if len(dirs) == 0 {
		return false
	}
	for _, arg := range cmdline(pid) {
		for _, d := range dirs {
			if i := strings.Index(arg, d); i >= 0 && (len(arg) == i+len(d) || arg[i+len(d)] == '/') {
				return true
			}
		}
	}
	return false
}
