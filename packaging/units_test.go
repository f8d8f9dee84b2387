package packaging_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/internal/needs"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/stackbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	stackbin.Cleanup()
	os.Exit(code)
}

// sandbox starts a private systemd (PID 1 of its own namespaces) or skips
// with the reason this host cannot run one.
func sandbox(t *testing.T) injector.Supervisor {
	t.Helper()
	needs.Root(t, "a private systemd")
	if why := injector.SandboxPreflight(); why != "" {
		t.Skip("no sandbox supervisor here: " + why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sup, err := injector.NewSupervisor(ctx, injector.KindSandbox, t.TempDir())
	if err != nil {
		t.Fatalf("sandbox: %v", err)
	}
	t.Cleanup(func() {
		if err := sup.Close(); err != nil {
			t.Errorf("sandbox teardown: %v", err)
		}
	})
	return sup
}

// install writes the shipped unit file into the sandbox with only the lines
// that name host paths replaced (ExecStart=, Environment=), and fails if a
// replacement names a key the shipped file does not have: every other setting
// is tested exactly as shipped.
func install(t *testing.T, sup injector.Supervisor, unit string, replace map[string]string) {
	t.Helper()
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		key := line
		if k, v, ok := strings.Cut(line, "="); ok && k == "Environment" {
			env, _, _ := strings.Cut(v, "=")
			key = "Environment=" + env
		} else if ok {
			key = k
		}
		if r, ok := replace[key]; ok {
			line, used[key] = r, true
		}
		out = append(out, line)
	}
	for k := range replace {
		if !used[k] {
			t.Fatalf("%s has no %s line to replace", unit, k)
		}
	}
	dir := injector.UnitDir(sup)
	if dir == "" {
		t.Fatal("the sandbox reports no unit directory")
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(unit)), []byte(strings.Join(out, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	systemctl(t, sup, "daemon-reload")
}

// systemctl runs the real systemctl inside the sandbox against its systemd.
func systemctl(t *testing.T, sup injector.Supervisor, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := injector.Command(ctx, sup, append([]string{"systemctl"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// show returns the unit's properties as systemd reports them.
func show(t *testing.T, sup injector.Supervisor, unit string, props ...string) map[string]string {
	t.Helper()
	args := []string{"show", unit}
	for _, p := range props {
		args = append(args, "-p", p)
	}
	m := map[string]string{}
	for _, line := range strings.Split(systemctl(t, sup, args...), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

func expect(t *testing.T, unit string, got map[string]string, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s=%q, want %q (all: %v)", unit, k, got[k], v, got)
		}
	}
}

func waitFor(t *testing.T, what string, budget time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(budget)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", budget, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNodeagentUnit: the shipped nodeagent.service under a real systemd.
// Type=notify makes `systemctl start` return only after the agent's sd_notify
// READY=1 (so a start that returns proves readiness reached systemd); the
// settings seed 001's method note depends on are what systemd reports; a
// SIGKILL of MainPID is restarted after RestartSec=5s; stop leaves it inactive.
func TestNodeagentUnit(t *testing.T) {
	agent, err := stackbin.Path("nodeagent")
	if err != nil {
		t.Fatal(err)
	}
	sup := sandbox(t)
	d := t.TempDir()
	state, reg, root := filepath.Join(d, "state"), filepath.Join(d, "registry"), filepath.Join(d, "vmctl")
	install(t, sup, "nodeagent.service", map[string]string{
		"ExecStart":                  fmt.Sprintf("ExecStart=%s --state-dir %s --registry-dir %s --metrics-addr 127.0.0.1:0", agent, state, reg),
		"Environment=VMCTL_ROOT_DIR": "Environment=VMCTL_ROOT_DIR=" + root,
		"Environment=VMCTL_RUN_DIR":  "Environment=VMCTL_RUN_DIR=" + filepath.Join(root, "run"),
	})
	const unit = "nodeagent.service"
	systemctl(t, sup, "start", unit) // returns once READY=1 arrived (Type=notify)
	first := show(t, sup, unit, "ActiveState", "SubState", "Type", "NotifyAccess", "KillMode", "Restart", "RestartUSec", "TimeoutStopUSec", "MainPID", "NRestarts")
	expect(t, unit, first, map[string]string{
		"ActiveState": "active", "SubState": "running", "Type": "notify", "NotifyAccess": "main",
		"KillMode": "process", "Restart": "always", "RestartUSec": "5s", "TimeoutStopUSec": "30s", "NRestarts": "0",
	})
	if first["MainPID"] == "" || first["MainPID"] == "0" {
		t.Fatalf("no MainPID after start: %v", first)
	}

	// The agent it started serves: its metrics answer on the bound address.
	addr, err := os.ReadFile(filepath.Join(state, nodeagent.MetricsAddrName))
	if err != nil {
		t.Fatalf("the agent wrote no metrics address: %v", err)
	}
	resp, err := http.Get("http://" + strings.TrimSpace(string(addr)) + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "nodeagent_") {
		t.Fatalf("scrape: %s\n%.400s", resp.Status, body)
	}

	// A crash of the main process (the pid systemd just reported, signalled
	// inside the sandbox's pid namespace): Restart=always brings it back.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := injector.Command(ctx, sup, "kill", "-KILL", first["MainPID"]).CombinedOutput(); err != nil {
		t.Fatalf("kill -KILL %s: %v %s", first["MainPID"], err, out)
	}
	var again map[string]string
	waitFor(t, "the restart after RestartSec=5s", time.Minute, func() bool {
		again = show(t, sup, unit, "ActiveState", "MainPID", "NRestarts")
		return again["ActiveState"] == "active" && again["NRestarts"] == "1" && again["MainPID"] != "0"
	})
	if again["MainPID"] == first["MainPID"] {
		t.Fatalf("restarted with the same MainPID %s", again["MainPID"])
	}

	systemctl(t, sup, "stop", unit)
	expect(t, unit, show(t, sup, unit, "ActiveState", "MainPID"), map[string]string{"ActiveState": "inactive", "MainPID": "0"})
}

// TestVmctlDaemonUnit: the shipped vmctl-daemon.service under a real systemd
// runs one daemon that holds the store's daemon lock (a second daemon on the
// same root is refused while the unit runs and accepted after it stopped).
func TestVmctlDaemonUnit(t *testing.T) {
	vmctl, err := stackbin.Path("vmctl")
	if err != nil {
		t.Fatal(err)
	}
	sup := sandbox(t)
	root := filepath.Join(t.TempDir(), "vmctl")
	install(t, sup, "vmctl-daemon.service", map[string]string{
		"ExecStart":                  "ExecStart=" + vmctl + " daemon --interval 5s",
		"Environment=VMCTL_ROOT_DIR": "Environment=VMCTL_ROOT_DIR=" + root,
	})
	const unit = "vmctl-daemon.service"
	systemctl(t, sup, "start", unit)
	expect(t, unit, show(t, sup, unit, "Type", "KillMode", "Restart", "RestartUSec"), map[string]string{
		"Type": "simple", "KillMode": "process", "Restart": "always", "RestartUSec": "5s",
	})

	// Type=simple: active as soon as it forked, so wait until the store's
	// daemon lock is held (/proc/locks: looking takes no lock of our own).
	lock := filepath.Join(root, "locks", "daemon.lock")
	waitFor(t, "the unit's daemon to take "+lock, time.Minute, func() bool { return flockHeld(t, lock) })
	second := func(timeout time.Duration) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, vmctl, "daemon", "--interval", "5s")
		cmd.Env = append(os.Environ(), "VMCTL_ROOT_DIR="+root)
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			return string(out), ctx.Err()
		}
		return string(out), err
	}
	if out, err := second(30 * time.Second); err == nil || !strings.Contains(out, "already running") {
		t.Fatalf("a second daemon on the unit's store was not refused (err %v): %s", err, out)
	}
	expect(t, unit, show(t, sup, unit, "ActiveState", "NRestarts"), map[string]string{"ActiveState": "active", "NRestarts": "0"})

	systemctl(t, sup, "stop", unit)
	// With the unit stopped the lock is free: a daemon starts and is still
	// running when our deadline ends it.
	if out, err := second(2 * time.Second); err != context.DeadlineExceeded {
		t.Fatalf("a daemon after the unit stopped did not keep running (err %v): %s", err, out)
	}
}

// flockHeld reports whether some process holds a flock on path, from
// /proc/locks ("1: FLOCK ADVISORY WRITE 1234 08:01:5678 0 EOF").
func flockHeld(t *testing.T, path string) bool {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return false
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(":%d", st.Ino)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[1] == "FLOCK" && strings.HasSuffix(f[5], want) {
			return true
		}
	}
	return false
}
