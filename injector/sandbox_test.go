package injector

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/stackbin"
	"golang.org/x/sys/unix"
)

// hostSnapshot is what a sandbox must leave exactly as it found it.
func hostSnapshot(t *testing.T, canary string) string {
	t.Helper()
	var b strings.Builder
	for _, k := range []string{"fs/file-max", "fs/nr_open", "net/unix/max_dgram_qlen", "kernel/core_pattern", "kernel/hostname", "kernel/pid_max"} {
		v, _ := os.ReadFile("/proc/sys/" + k)
		fmt.Fprintf(&b, "sysctl %s=%s", k, v)
	}
	ls := func(d string) {
		ents, _ := os.ReadDir(d)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		fmt.Fprintf(&b, "ls %s: %s\n", d, strings.Join(names, " "))
	}
	ls("/dev")
	ls("/run")
	ls("/etc")
	ls("/etc/systemd/system")
	// The mount table, less the mounts of other vmchaos runs going on at the
	// same time (`go test ./...` runs packages side by side: a power-cut
	// case's lazy filesystems under /tmp/vmchaos-*, a run's netns). This
	// sandbox's own leftovers would be elsewhere: it mounts nothing there.
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	fmt.Fprintln(&b, "mountinfo:")
	for _, line := range strings.Split(strings.TrimSpace(string(mi)), "\n") {
		if f := strings.Fields(line); len(f) > 4 && otherRunsMount(f[4]) {
			continue
		}
		fmt.Fprintln(&b, line)
	}
	// a /tmp canary: tmpfiles-setup of a booted host unit would wipe it
	c, err := os.ReadFile(canary)
	fmt.Fprintf(&b, "canary %q %v\n", c, err)
	return b.String()
}

// otherRunsMount: a mount point of a vmchaos run's case dirs or netns.
func otherRunsMount(mountPoint string) bool {
	return strings.HasPrefix(mountPoint, filepath.Join(os.TempDir(), "vmchaos-")) || strings.HasPrefix(mountPoint, "/run/netns/vmchaos-")
}

// TestSandboxRunsNodeagentAndLeavesHostUnchanged boots a sandbox, runs the
// real nodeagent as a unit in it, tears it down and compares the host.
func TestSandboxRunsNodeagentAndLeavesHostUnchanged(t *testing.T) {
	if why := SandboxPreflight(); why != "" {
		t.Skip("sandbox unavailable: " + why)
	}
	bin, err := stackbin.Dir()
	if err != nil {
		t.Skipf("stack binaries: %v", err)
	}
	canaryDir, err := os.MkdirTemp("", "vmchaos-canary-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(canaryDir) })
	canary := filepath.Join(canaryDir, "canary")
	if err := os.WriteFile(canary, []byte("still here"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := hostSnapshot(t, canary)
	nsBefore := map[string]bool{}
	for _, p := range allPIDs() {
		nsBefore[pidNS(p)] = true
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Setenv(EnvRegistry, filepath.Join(t.TempDir(), "registry"))
	sup, err := NewSupervisor(ctx, KindSandbox, filepath.Join(t.TempDir(), "sandbox"))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			sup.Close()
		}
	})
	t.Logf("sandbox up in %v", SandboxStarted)
	initNS := ""
	if s, ok := sup.(*dbusSup); ok {
		initNS = s.rec.PidNS
	}

	dir := t.TempDir()
	tr, err := ListenTrace(filepath.Join(dir, "trace.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	state, reg, root, run := filepath.Join(dir, "agent"), filepath.Join(dir, "registry"), filepath.Join(dir, "root"), filepath.Join(dir, "run")
	for _, d := range []string{state, reg, root, run} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	spec := UnitSpec{Name: "nodeagent", Argv: []string{filepath.Join(bin, "nodeagent"), "--state-dir", state, "--registry-dir", reg,
		"--vmctl", filepath.Join(bin, "vmctl")},
		Env: []string{"VMCTL_ROOT_DIR=" + root, "VMCTL_RUN_DIR=" + run, "VMCTL_CH_BINARY=" + filepath.Join(bin, "cloud-hypervisor"),
			failpoint.EnvTrace + "=" + tr.Path()},
		RestartSec: 100 * time.Millisecond, LogPath: filepath.Join(dir, "nodeagent.log")}
	if err := sup.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.WaitPoint(ctx, 0, "agent.started", 1, ""); err != nil {
		b, _ := os.ReadFile(spec.LogPath)
		t.Fatalf("nodeagent did not start: %v\n%s", err, b)
	}
	main, err := sup.MainPID(ctx, "nodeagent")
	if err != nil || main == 0 {
		t.Fatalf("main pid %d %v", main, err)
	}
	if pidNS(main) != initNS {
		t.Fatalf("nodeagent (host pid %d) is not in the sandbox pid namespace", main)
	}
	// its intent API answers the host over the shared /tmp
	hc := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(state, "agent.sock"))
	}}}
	var resp *http.Response
	waitFor(t, "the agent API", 30*time.Second, func() bool {
		resp, err = hc.Get("http://agent/v1/vms")
		return err == nil
	})
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/vms: %d %s", resp.StatusCode, body)
	}

	if err := sup.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	for _, p := range allPIDs() {
		if ns := pidNS(p); ns == initNS || (!nsBefore[ns] && ns != "" && environHas(p, EnvRunTag+"=")) {
			t.Fatalf("pid %d left in the sandbox namespace", p)
		}
	}
	// Its cgroup is gone (other sandboxes of parallel tests may come and go).
	if s, ok := sup.(*dbusSup); ok {
		if _, err := os.Stat(s.rec.Cgroup); !os.IsNotExist(err) {
			t.Fatalf("the sandbox's cgroup %s is still there (%v)", s.rec.Cgroup, err)
		}
	}
	after := hostSnapshot(t, canary)
	if before != after {
		t.Fatalf("host changed by the sandbox:\n--- before\n%s\n--- after\n%s", before, after)
	}
}

// BenchmarkSandboxStart measures clone → a running manager answering on D-Bus,
// and the teardown.
func BenchmarkSandboxStart(b *testing.B) {
	if why := SandboxPreflight(); why != "" {
		b.Skip(why)
	}
	b.Setenv(EnvRegistry, filepath.Join(b.TempDir(), "registry"))
	var up, down time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		s, err := NewSupervisor(context.Background(), KindSandbox, filepath.Join(b.TempDir(), fmt.Sprint(i)))
		if err != nil {
			b.Fatal(err)
		}
		up += time.Since(t0)
		t1 := time.Now()
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		down += time.Since(t1)
	}
	b.ReportMetric(float64(up.Milliseconds())/float64(b.N), "ms-start")
	b.ReportMetric(float64(down.Milliseconds())/float64(b.N), "ms-teardown")
}

// TestCommandSeesTheUnitsView: a command run through Command reads /proc as
// the sandbox's units do (a pid a unit reports is that unit there).
func TestCommandSeesTheUnitsView(t *testing.T) {
	for _, kind := range []string{KindSandbox, KindBuiltin} {
		t.Run(kind, func(t *testing.T) {
			sup := newSup(t, kind)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dir := t.TempDir()
			logp := filepath.Join(dir, "sig.log")
			if err := sup.Start(ctx, UnitSpec{Name: "svc", Argv: helperArgv(t), Env: []string{envHelper + "=svc", "HELPER_SIGLOG=" + logp}}); err != nil {
				t.Fatal(err)
			}
			var main int
			waitFor(t, "the unit's log line", 30*time.Second, func() bool {
				m, _ := sup.MainPID(ctx, "svc")
				main = nsView(m)
				_, ok := startedChild(sigLog(t, logp), main)
				return m != 0 && ok
			})
			out, err := Command(ctx, sup, "/bin/sh", "-c", "tr '\\0' ' ' </proc/"+itoa(main)+"/environ").CombinedOutput()
			if err != nil {
				t.Fatalf("command: %v %s", err, out)
			}
			if !strings.Contains(string(out), envHelper+"=svc") {
				t.Fatalf("pid %d as the unit reports it is not the unit here: %q", main, out)
			}
		})
	}
}

// TestSandboxCloseReapsCommandsOrphanedToTheHost: a command entered into the
// sandbox whose nsenter was killed first is reparented to this process (a
// child subreaper, as every runner is). Its zombie would keep the sandbox's
// PID 1 from finishing its exit; Close must reap it and leave nothing behind.
func TestSandboxCloseReapsCommandsOrphanedToTheHost(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	sb := newSup(t, KindSandbox) // its Cleanup Close is a no-op after ours
	ctx, cancel := context.WithCancel(context.Background())
	c := Command(ctx, sb, "/bin/sh", "-c", "sleep 300")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	ns := sb.(*dbusSup).rec.PidNS
	waitFor(t, "the entered command", 30*time.Second, func() bool {
		for _, pid := range allPIDs() {
			if st, err := readStat(pid); err == nil && st.ppid == c.Process.Pid && pidNS(pid) == ns {
				return true
			}
		}
		return false
	})
	cancel() // kills nsenter only: its child lives on, reparented to us
	_ = c.Wait()
	t0 := time.Now()
	if err := sb.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	t.Logf("closed in %v", time.Since(t0))
	for _, pid := range allPIDs() {
		if pidNS(pid) == ns {
			t.Fatalf("pid %d left in the sandbox pid namespace", pid)
		}
	}
}
