package injector

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/internal/ownedtemp"
)

// isolateRegistries gives the test a private registry and registry index,
// so doctor calls below see only what the test made.
func isolateRegistries(t *testing.T) (reg string) {
	t.Helper()
	t.Setenv(EnvRegistryIndex, t.TempDir())
	reg = filepath.Join(t.TempDir(), "registry")
	t.Setenv(EnvRegistry, reg)
	return reg
}

// startRunner starts a child harness (the "runner" helper: a builtin
// supervisor with one unit of a main and a child), waits for its unit and
// returns it with the unit's processes.
func startRunner(t *testing.T, extraEnv ...string) (*exec.Cmd, []Proc) {
	t.Helper()
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	self, _ := os.Executable()
	runner := exec.Command(self)
	runner.Env = append(append(os.Environ(), envHelper+"=runner", "HELPER_KIND="+KindBuiltin,
		"HELPER_STATE="+filepath.Join(dir, "state"), "HELPER_READY="+ready), extraEnv...)
	runner.Stderr = os.Stderr
	if err := runner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = runner.Process.Kill(); _ = runner.Wait() })
	waitFor(t, "the runner's unit", 60*time.Second, func() bool { _, err := os.Stat(ready); return err == nil })
	b, err := os.ReadFile(ready)
	if err != nil {
		t.Fatal(err)
	}
	var procs []Proc
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		p, err := Identify(pid)
		if err != nil {
			t.Fatalf("unit pid %s: %v", f, err)
		}
		procs = append(procs, p)
	}
	if len(procs) < 2 {
		t.Fatalf("runner reported %q, want its unit's main and child", b)
	}
	return runner, procs
}

// TestBuiltinUnitsDieWithKilledHarness: a SIGKILLed harness takes its
// builtin units with it (the watchdog reads EOF on its pipe), with no
// doctor run.
func TestBuiltinUnitsDieWithKilledHarness(t *testing.T) {
	isolateRegistries(t)
	runner, procs := startRunner(t)
	var fds []*PidFD
	for _, p := range procs {
		fd, err := OpenPidFD(p)
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		fds = append(fds, fd)
	}
	_ = runner.Process.Signal(syscall.SIGKILL)
	_ = runner.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // safety net
	defer cancel()
	for _, fd := range fds {
		if err := fd.WaitExit(ctx); err != nil {
			t.Fatalf("unit process outlived its harness: %v", err)
		}
	}
}

// TestDoctorCleansKilledBenchHarness: a bench-style harness (builtin units,
// its registry in a temp dir) is SIGKILLed with its watchdog; doctor, given
// another registry, finds the run through the registry index, lists its
// unit, and --clean returns only once every process of it is dead.
func TestDoctorCleansKilledBenchHarness(t *testing.T) {
	reg := isolateRegistries(t)
	runner, procs := startRunner(t, "HELPER_KILL_WATCHDOG=1")
	_ = runner.Process.Signal(syscall.SIGKILL)
	_ = runner.Wait()
	t.Setenv(EnvRegistry, "") // doctor does not know the bench's registry
	primary := t.TempDir()
	ls, err := FindAllLeftovers(primary)
	if err != nil || len(ls) != 1 {
		t.Fatalf("leftovers = %v, %v; want the bench run of registry %s", ls, err, reg)
	}
	listed := map[int]bool{}
	for _, p := range ls[0].Procs {
		listed[p.PID] = true
	}
	for _, p := range procs {
		if !listed[p.PID] {
			t.Fatalf("doctor did not list unit pid %d: %s", p.PID, ls[0])
		}
	}
	if c := TakeCensus(CensusOptions{Registry: primary, RunID: ls[0].Record.RunID}); c.Procs < len(procs) {
		t.Fatalf("census of the dead run: %d processes, want %d or more\n%s", c.Procs, len(procs), c.Table())
	}
	cleaned, err := CleanAllLeftovers(context.Background(), primary)
	if err != nil || len(cleaned) != 1 {
		t.Fatalf("clean: %v %v", cleaned, err)
	}
	// Right after the return: a correctness check, not a timing one.
	for _, p := range procs {
		if p.Alive() {
			t.Fatalf("pid %d alive after doctor --clean returned", p.PID)
		}
	}
	if c := TakeCensus(CensusOptions{Registry: primary, RunID: ls[0].Record.RunID}); c.Leaks() != 0 {
		t.Fatalf("census after clean:\n%s", c.Table())
	}
	if ls, _ := FindAllLeftovers(primary); len(ls) != 0 {
		t.Fatalf("still listed after clean: %v", ls)
	}
}

// TestDoctorFindsStackDirOfHarnessKilledBeforeItsSupervisor: a harness
// SIGKILLed after it reserved its stack dir, before any supervisor or case,
// leaves a dir doctor lists and --clean removes.
func TestDoctorFindsStackDirOfHarnessKilledBeforeItsSupervisor(t *testing.T) {
	isolateRegistries(t)
	tmp, dir := t.TempDir(), t.TempDir()
	ready := filepath.Join(dir, "ready")
	self, _ := os.Executable()
	h := exec.Command(self)
	h.Env = append(os.Environ(), envHelper+"=reserve", "HELPER_TMP="+tmp, "HELPER_READY="+ready)
	h.Stderr = os.Stderr
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Process.Kill(); _ = h.Wait() })
	waitFor(t, "the reserved dir", 60*time.Second, func() bool { _, err := os.Stat(ready); return err == nil })
	_ = h.Process.Signal(syscall.SIGKILL)
	_ = h.Wait()
	b, _ := os.ReadFile(ready)
	stackDir, tailPID, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(tailPID)
	tail, err := Identify(pid)
	if err != nil {
		t.Fatalf("the runner's command: %v", err)
	}
	t.Cleanup(func() { _ = signalProc(tail, syscall.SIGKILL) })
	ls, err := FindAllLeftovers(Registry())
	if err != nil || len(ls) != 1 || len(ls[0].Paths) != 1 || ls[0].Paths[0] != stackDir {
		t.Fatalf("leftovers = %v, %v; want the dir %s", ls, err, stackDir)
	}
	if len(ls[0].Procs) != 1 || ls[0].Procs[0] != tail {
		t.Fatalf("leftover processes %v, want the untagged command naming the dir (pid %d)", ls[0].Procs, pid)
	}
	opts := CensusOptions{TempDirs: []string{tmp}}
	if c := TakeCensus(opts); c.TempDirs != 1 || c.TempBytes < 4096 || c.Procs < 1 {
		t.Fatalf("census before clean: want 1 dir of 4096+ bytes and the command naming it\n%s", c.Table())
	}
	if _, err := CleanAllLeftovers(context.Background(), Registry()); err != nil {
		t.Fatal(err)
	}
	if tail.Alive() {
		t.Fatalf("pid %d naming the dir alive after clean returned", pid)
	}
	if _, err := os.Stat(stackDir); !os.IsNotExist(err) {
		t.Fatalf("stack dir %s after clean: %v", stackDir, err)
	}
	if c := TakeCensus(opts); c.TempDirs != 0 || c.Mounts != 0 || c.TempBytes != 0 {
		t.Fatalf("census after clean:\n%s", c.Table())
	}
}

// TestCensusCountsWhatADeadRunLeft plants what a dead run leaves (a tagged
// process, its stack dir with a file and, as root, a mount below it) and
// a pidfd held by this process: the census counts each, and nothing once
// they are gone.
func TestCensusCountsWhatADeadRunLeft(t *testing.T) {
	reg := isolateRegistries(t)
	tmp := t.TempDir()
	fdsBefore := TakeCensus(CensusOptions{TempDirs: []string{tmp}}).FDs
	rec, err := newRecord(KindBuiltin, "")
	if err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	rec.Runner = Proc{PID: dead.Process.Pid, Start: 1} // a runner that is gone
	stack := filepath.Join(tmp, "vmchaos-census")
	if err := os.Mkdir(stack, 0o700); err != nil {
		t.Fatal(err)
	}
	rec.Paths = []string{stack}
	if err := rec.save(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stack, "store"), make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	left := exec.Command("/bin/sleep", "600")
	left.Env = append(os.Environ(), rec.Tag())
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = left.Process.Kill(); _ = left.Wait() })
	lp, _ := Identify(left.Process.Pid)
	fd, err := OpenPidFD(lp)
	if err != nil {
		t.Fatal(err)
	}
	mounted := os.Geteuid() == 0 && unix.Mount("census", stack, "tmpfs", 0, "size=1m") == nil
	if mounted {
		t.Cleanup(func() { _ = unix.Unmount(stack, unix.MNT_DETACH) })
	} else {
		t.Log("not root: the mount count is not exercised")
	}
	// Host-wide counts (processes, cgroups) also see other runs on this
	// host, which this test's private registries do not know alive: the
	// process is checked through a census of this run only.
	opts := CensusOptions{Registry: reg, TempDirs: []string{tmp}}
	c := TakeCensus(opts)
	t.Logf("with leaks:\n%s", c.Table())
	if c.TempDirs != 1 || c.FDs <= fdsBefore || (mounted && c.Mounts != 1) {
		t.Fatalf("census missed a planted leak:\n%s", c.Table())
	}
	if !mounted && c.TempBytes < 1000 {
		t.Fatalf("census temp bytes %d, want 1000+", c.TempBytes)
	}
	if r := TakeCensus(CensusOptions{Registry: reg, RunID: rec.RunID}); r.Procs != 1 || r.TempDirs != 1 {
		t.Fatalf("census of run %s:\n%s", rec.RunID, r.Table())
	}
	fd.Close()
	if n := TakeCensus(opts).FDs; n != c.FDs-1 {
		t.Fatalf("harness fds %d after closing the pidfd, want %d", n, c.FDs-1)
	}
	ls, err := CleanAllLeftovers(context.Background(), reg)
	if err != nil || len(ls) != 1 {
		t.Fatalf("clean: %v %v", ls, err)
	}
	_ = left.Wait()
	if r := TakeCensus(CensusOptions{Registry: reg, RunID: rec.RunID}); r.Leaks() != 0 {
		t.Fatalf("census of run %s after clean:\n%s", rec.RunID, r.Table())
	}
	c = TakeCensus(opts)
	t.Logf("after clean:\n%s", c.Table())
	if c.TempDirs != 0 || c.TempBytes != 0 || c.Mounts != 0 {
		t.Fatalf("census not back to zero:\n%s", c.Table())
	}
	var seen Census
	if b, err := json.Marshal(c); err != nil || json.Unmarshal(b, &seen) != nil {
		t.Fatalf("census json: %v", err)
	}
}

// TestCensusSkipsALiveOwnersTempDirAndCountsADeadOnes: stackbin's build
// dir of a `go test` run that still runs is no leak; the same dir of a
// killed one is, and `doctor --clean` (ownedtemp.CleanDead) removes it.
func TestCensusSkipsALiveOwnersTempDirAndCountsADeadOnes(t *testing.T) {
	reg := isolateRegistries(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	live, err := ownedtemp.Mkdir("vmchaos-bin-")
	if err != nil {
		t.Fatal(err)
	}
	opts := CensusOptions{Registry: reg, TempDirs: []string{tmp}}
	if c := TakeCensus(opts); c.TempDirs != 0 {
		t.Fatalf("a live owner's dir %s counted as a leak:\n%s", live, c.Table())
	}
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(tmp, "vmchaos-bin-gone")
	if err := os.Mkdir(gone, 0o700); err != nil {
		t.Fatal(err)
	}
	// the owner file as ownedtemp writes it, of a process that exited
	if err := os.WriteFile(filepath.Join(gone, ".vmchaos-owner"), fmt.Appendf(nil, "%d 1\n", dead.Process.Pid), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := TakeCensus(opts); c.TempDirs != 1 {
		t.Fatalf("a dead owner's dir not counted once:\n%s", c.Table())
	}
	if removed, err := ownedtemp.CleanDead([]string{tmp}); err != nil || len(removed) != 1 || removed[0] != gone {
		t.Fatalf("CleanDead = %v, %v; want [%s]", removed, err, gone)
	}
	if c := TakeCensus(opts); c.TempDirs != 0 {
		t.Fatalf("after the clean:\n%s", c.Table())
	}
}

// TestCleanOrphanCgroups: --clean removes an empty vmchaos-* cgroup no run
// record names (a sandbox's, left busy when its run removed its record),
// keeps one a record names, and leaves, without an error, one that holds
// a process or is younger than the minimum age (a live run this doctor's
// registries do not show). On a plain directory tree: the rule, not the
// kernel's cgroupfs.
func TestCleanOrphanCgroups(t *testing.T) {
	reg := isolateRegistries(t)
	root := t.TempDir()
	orphan := filepath.Join(root, "vmchaos-sb-orphan")
	named := filepath.Join(root, "vmchaos-sb-named")
	busy := filepath.Join(root, "vmchaos-sb-busy")
	for _, d := range []string{filepath.Join(orphan, "unit"), named, filepath.Join(busy, "unit")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(busy, "unit", "cgroup.procs"), []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec, err := newRecord(KindSandbox, "")
	if err != nil {
		t.Fatal(err)
	}
	rec.Cgroup = named
	if err := rec.save(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rec.remove)
	if removed, err := cleanOrphanCgroups(t.Context(), root, reg, time.Hour); len(removed) != 0 || err != nil {
		t.Errorf("an hour's minimum age: removed %v (%v), want nothing: every cgroup here is new", removed, err)
	}
	removed, err := cleanOrphanCgroups(t.Context(), root, reg, 0)
	if len(removed) != 1 || removed[0] != orphan || err != nil {
		t.Errorf("removed %v (%v), want only %s", removed, err, orphan)
	}
	for _, d := range []string{named, busy} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s removed: %v", d, err)
		}
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("orphan %s still there: %v", orphan, err)
	}
}
