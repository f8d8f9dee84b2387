package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/stackbin"
)

// TestDoctorCleanRemovesEverythingOfASIGKILLedRun starts a real `vmchaos
// run`, SIGKILLs the runner while a case's stack is up, and requires
// `doctor --clean` to leave nothing of that run: no process, no cgroup, no
// stack dir, no netns, no record. The run uses a private registry and
// TMPDIR, so this doctor only ever sees (and cleans) the run this test
// started, never a live run of anyone else on the host.
func TestDoctorCleanRemovesEverythingOfASIGKILLedRun(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a real run")
	}
	bins, err := stackbin.Dir()
	if err != nil {
		t.Fatalf("stack binaries: %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	reg, out := t.TempDir(), t.TempDir()
	// a short TMPDIR: the stack's sockets live under it (sun_path is 108 bytes)
	tmp, err := os.MkdirTemp("/tmp", "vmcdr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	t.Setenv(injector.EnvRegistry, reg)              // the doctor below and any cleanup read only this registry
	t.Setenv(injector.EnvRegistryIndex, t.TempDir()) // no other registry: not the default one, none indexed
	netnsBefore := listNetns()

	runner := exec.Command(self, "run", "--label-filter", "speed:fast && fault:sigkill-main", "--time-scale", "0.05",
		"--report-dir", filepath.Join(out, "results"))
	runner.Env = append(os.Environ(), envAsVmchaos+"=1", "TMPDIR="+tmp, stackbin.Env+"="+bins)
	var logs bytes.Buffer
	runner.Stdout, runner.Stderr = &logs, &logs
	if err := runner.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = runner.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = runner.Process.Kill()
		<-exited
		_, _ = injector.CleanLeftovers(t.Context(), reg) // only this test's run is in reg
	})

	// mid-case: a case stack's agent is up (its socket exists)
	var stackDir string
	deadline := time.Now().Add(3 * time.Minute)
	for stackDir == "" {
		select {
		case <-exited:
			t.Fatalf("the runner ended before a case stack came up:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no case stack came up within 3m; runner output:\n%s", logs.String())
		}
		if m, _ := filepath.Glob(filepath.Join(tmp, "vmchaos-*", "c*", "state", "agent.sock")); len(m) > 0 {
			stackDir = filepath.Dir(filepath.Dir(filepath.Dir(m[0])))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// as root on the fake backend the run's dir is a tmpfs of its own
	// (--stack-fs auto): the SIGKILL leaves it mounted for doctor to find
	if os.Geteuid() == 0 && !slices.Contains(mountsUnder(tmp), stackDir) {
		t.Fatalf("the run's dir %s is not a mount point (mounts under %s: %v): --stack-fs auto should have put it on a tmpfs", stackDir, tmp, mountsUnder(tmp))
	}
	if err := runner.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited

	doctor := func(args ...string) (string, error) {
		c := newDoctorCmd()
		var b bytes.Buffer
		c.SetOut(&b)
		c.SetErr(&b)
		c.SetArgs(append(args, "--registry", reg))
		err := c.Execute()
		return b.String(), err
	}
	before, err := doctor()
	t.Logf("doctor before --clean (exit %d):\n%s", exitCode(err), before)
	if exitCode(err) != 1 || !strings.Contains(before, "found: run ") || !strings.Contains(before, "dirs "+stackDir) {
		t.Fatalf("doctor did not report the killed run with its stack dir %s", stackDir)
	}
	ls, err := injector.FindLeftovers(reg)
	if err != nil || len(ls) != 1 {
		t.Fatalf("leftovers = %v, %v; want exactly this test's run", ls, err)
	}
	l := ls[0]
	if len(l.Procs) == 0 {
		t.Fatalf("the killed run left no process to clean: %s (the runner died before its case stack started?)", l)
	}

	cleaned, err := doctor("--clean")
	t.Logf("doctor --clean:\n%s", cleaned)
	if err != nil || !strings.Contains(cleaned, "cleaned: run "+l.Record.RunID) || !strings.Contains(cleaned, "dirs "+stackDir) {
		t.Fatalf("doctor --clean: %v", err)
	}
	after, err := doctor()
	t.Logf("doctor after --clean:\n%s", after)
	if err != nil || !strings.Contains(after, "leftovers (records in "+reg+"):\n  none") {
		t.Fatalf("doctor after --clean: %v", err)
	}

	for _, p := range l.Procs {
		if p.Alive() {
			t.Errorf("pid %d of the killed run is alive", p.PID)
		}
	}
	if pids := tagged(l.Record.Tag()); len(pids) > 0 {
		t.Errorf("processes still carry %s: %v", l.Record.Tag(), pids)
	}
	if l.Record.Cgroup != "" {
		if _, err := os.Stat(l.Record.Cgroup); !os.IsNotExist(err) {
			t.Errorf("cgroup %s still there (%v)", l.Record.Cgroup, err)
		}
	}
	if m := mountsUnder(tmp); len(m) != 0 {
		t.Errorf("mounts of the killed run left under %s: %v", tmp, m)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Errorf("the run's TMPDIR still holds %v", names)
	}
	for n := range listNetns() {
		if !netnsBefore[n] && strings.HasPrefix(n, filepath.Base(stackDir)) {
			t.Errorf("netns %s of the run still there", n)
		}
	}
	if files, _ := filepath.Glob(filepath.Join(reg, "*.json")); len(files) != 0 {
		t.Errorf("records left: %v", files)
	}
}

// mountsUnder lists the mount points below dir in this mount namespace.
func mountsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, ln := range strings.Split(string(b), "\n") {
		if f := strings.Fields(ln); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

func listNetns() map[string]bool {
	out := map[string]bool{}
	es, _ := os.ReadDir("/run/netns")
	for _, e := range es {
		out[e.Name()] = true
	}
	return out
}

// tagged lists the pids whose environment holds tag (KEY=VALUE).
func tagged(tag string) []int {
	var out []int
	es, _ := os.ReadDir("/proc")
	for _, e := range es {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(b, []byte{0}) {
			if string(kv) == tag {
				out = append(out, pid)
			}
		}
	}
	return out
}
