package vmctl

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/internal/needs"
)

// TestVMMBornInItsOwnCgroup: a VMM is started inside <cgroup2>/vmctl-<store>/<ID>
// (so stopping the caller's unit does not reach it), without the builtin
// supervisor's unit tag, and vm rm removes that cgroup.
func TestVMMBornInItsOwnCgroup(t *testing.T) {
	needs.Root(t, "per-VM cgroups (cgroup v2 writes)")
	if _, err := cgroup2Root(); err != nil {
		t.Skipf("missing host feature: no cgroup2 mount (%v): mount cgroup2 at /sys/fs/cgroup", err)
	}
	if unitTagEnv != injector.EnvUnitTag {
		t.Fatalf("unitTagEnv %q must be the builtin supervisor's tag %q", unitTagEnv, injector.EnvUnitTag)
	}
	s := newStack(t, "0.05", unitTagEnv+"=agent-under-test")
	v := s.runVM("a")
	dir := s.m.vmCgroupDir(v.ID)
	root, _ := cgroup2Root()
	b, err := os.ReadFile("/proc/" + itoa(v.Pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			got = p
		}
	}
	if want := strings.TrimPrefix(dir, root); got != want {
		t.Fatalf("VMM %d is in cgroup %q, want %q", v.Pid, got, want)
	}
	env, _ := os.ReadFile("/proc/" + itoa(v.Pid) + "/environ")
	if strings.Contains(string(env), unitTagEnv+"=") {
		t.Fatalf("VMM carries %s: a builtin kill-all of the caller's unit would reach it", unitTagEnv)
	}
	if !strings.Contains(string(env), "VMCTL_ROOT_DIR="+s.root) {
		t.Fatal("VMM lost the rest of vmctl's environment")
	}
	s.ok("vm", "rm", "--force", "a")
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("vm rm left the cgroup %s (%v)", dir, err)
	}

	// off: the VMM stays in the caller's cgroup.
	v = s.runVMEnv("b", "VMCTL_VMM_CGROUP=off")
	self, _ := os.ReadFile("/proc/self/cgroup")
	vmm, _ := os.ReadFile("/proc/" + itoa(v.Pid) + "/cgroup")
	if string(self) != string(vmm) {
		t.Fatalf("off: VMM cgroups %q, ours %q", vmm, self)
	}
	s.ok("vm", "rm", "--force", "b")
	_ = syscall.Rmdir(filepath.Dir(dir))
}

// TestVMMCgroupOnNeedsWritableCgroupV2: where cgroup v2 is not writable (an
// unprivileged user), --vmm-cgroup on fails the launch with a clear error and
// auto launches in the caller's cgroup, saying why.
func TestVMMCgroupOnNeedsWritableCgroupV2(t *testing.T) {
	needs.Root(t, "running vmctl as an unprivileged user")
	s := newStack(t, "0.05")
	d, err := os.MkdirTemp("", "vccg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o777); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(d, "guest.img")
	if err := copyFile(s.image, img); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(img, 0o644)
	run := func(mode string) (string, error) {
		cmd := exec.Command(filepath.Join(s.bin, "vmctl"), "vm", "run", "--name", "u-"+mode, img)
		cmd.Env = append(append(os.Environ(), s.env...), "VMCTL_ROOT_DIR="+filepath.Join(d, "root"), "VMCTL_VMM_CGROUP="+mode, "HOME="+d)
		// The fake guest listens on port 22, where a real guest does; the
		// one privilege it needs is handed down, so what this test sees is
		// the cgroup rule alone.
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534},
			AmbientCaps: []uintptr{unix.CAP_NET_BIND_SERVICE}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("on")
	if err == nil || !strings.Contains(out, "cgroup v2 is not writable here") {
		t.Fatalf("on, unprivileged: want the clear error, got %v: %s", err, out)
	}
	out, err = run("auto")
	if err != nil || !strings.Contains(out, "launching in the caller's cgroup") {
		t.Fatalf("auto, unprivileged: want a launch that says why it has no cgroup, got %v: %s", err, out)
	}
	m, err := New(Config{RootDir: filepath.Join(d, "root"), CHBinary: filepath.Join(s.bin, "cloud-hypervisor")})
	if err != nil {
		t.Fatal(err)
	}
	for id, pids := range m.findVMMs() {
		for _, p := range pids {
			_ = m.killVMM(t.Context(), p, id)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// runVMEnv is runVM with extra environment for the run.
func (s *stack) runVMEnv(name string, env ...string) *VM {
	s.t.Helper()
	r := s.runEnv(env, "vm", "run", "--name", name, s.image)
	if r.code != 0 {
		s.t.Fatalf("vm run %s: %s", name, r)
	}
	id := strings.TrimSpace(r.stdout)
	s.waitGuest(id)
	return s.vm(id)
}
