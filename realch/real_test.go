package realch

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/cidata"
	"github.com/vmchaos/vmchaos/vmnet"
	"github.com/vmchaos/vmchaos/vmnet/vmnettest"
)

// EnvRequireReal makes the real-backend tests fail instead of skipping when
// the preflight says no: set on KVM runners, where a skip would hide a broken
// runner.
const EnvRequireReal = "VMCHAOS_REQUIRE_REAL"

// realEnv returns the discovered environment, or skips (fails when
// VMCHAOS_REQUIRE_REAL=1) with the preflight's precise reason.
func realEnv(t *testing.T) *Env {
	t.Helper()
	env, r, err := Preflight(Options{})
	if err == nil && r.OK {
		return env
	}
	msg := fmt.Sprintf("real backend unavailable: %s", r)
	if os.Getenv(EnvRequireReal) == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return nil
}

// The real thing, on a KVM runner: boot the guest image through firmware or
// kernel with the seed, on a TAP inside a namespace, and log in over SSH at
// the address the seed gave it, with the key the seed carried.
func TestRealCHBootsGuestReachableOverSSH(t *testing.T) {
	env := realEnv(t)
	vmnettest.NeedNetAdmin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	ns, err := vmnet.NewNetns(vmnettest.UniqueName("vmchaos-r"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	nic, gi, guestIP, err := vmnet.PlanNIC("192.168.246.0/24", 0, vmnettest.UniqueName("vcr"))
	if err != nil {
		t.Fatal(err)
	}
	// CH assigns ip=/mask= to the tap itself; the tap exists beforehand so
	// it is created inside the namespace.
	if err := ns.AddTap(nic.Tap, ""); err != nil {
		t.Fatal(err)
	}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vmchaos-real-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("VM dir kept for inspection: %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	v, err := Launch(ctx, env, LaunchSpec{
		Dir: filepath.Join(dir, "vm"), CPUs: 2, MemoryMiB: 1024, Netns: ns, NICs: []vmnet.NIC{nic},
		CloudInit: &cidata.CloudInit{Hostname: "vmchaos-real", SSHAuthorizedKeys: []string{strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))},
			Interfaces: []cidata.GuestInterface{gi}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := v.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	info, err := v.Client().Info(ctx)
	if err != nil || info.State != chapi.StateRunning {
		t.Fatalf("vm.info: %+v %v", info.State, err)
	}

	cfg := &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		// First contact with a freshly booted guest: pin whatever it presents
		// and require the same key on every later connection.
		HostKeyCallback: pinFirst(), Timeout: 20 * time.Second}
	addr := net.JoinHostPort(guestIP, "22")
	var out string
	for {
		out, err = sshRun(ctx, ns, addr, cfg, "hostname && cat /proc/sys/kernel/random/boot_id")
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("guest at %s never answered SSH: %v\nserial: %s", addr, err, tailFile(v.Serial))
		case <-v.Done():
			t.Fatalf("VMM exited while booting: %v\nserial: %s", v.ExitErr(), tailFile(v.Serial))
		case <-time.After(2 * time.Second):
		}
	}
	lines := strings.Fields(out)
	if len(lines) != 2 || lines[0] != "vmchaos-real" {
		t.Fatalf("guest answered %q: want its hostname from the seed and a boot id", out)
	}
	t.Logf("guest %s up: hostname %s boot_id %s", addr, lines[0], lines[1])
}

func pinFirst() ssh.HostKeyCallback {
	var pinned ssh.PublicKey
	return func(_ string, _ net.Addr, key ssh.PublicKey) error {
		if pinned == nil {
			pinned = key
			return nil
		}
		if string(pinned.Marshal()) != string(key.Marshal()) {
			return fmt.Errorf("guest host key changed")
		}
		return nil
	}
}

func sshRun(ctx context.Context, ns *vmnet.Netns, addr string, cfg *ssh.ClientConfig, cmd string) (string, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := ns.DialContext(dctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	cc, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		return "", err
	}
	c := ssh.NewClient(cc, chans, reqs)
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		return "", err
	}
	defer s.Close()
	b, err := s.Output(cmd)
	return string(b), err
}

func tailFile(p string) string {
	b, _ := os.ReadFile(p)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// The runner's verdict, as `vmchaos doctor` prints it; scripts/kvm-preflight.sh
// runs this with VMCHAOS_REQUIRE_REAL=1 so a broken KVM runner fails loudly.
//
// It asserts the KVM half against what the test itself gets from the kernel
// (open, KVM_GET_API_VERSION, KVM_CREATE_VM done here with raw syscalls):
// usable → the preflight says ok; not usable → the reason that matches the
// kernel's answer, with the device and the errno in the detail. A device
// that does not exist must read "absent" (or "nested-virt-off" in a guest
// without vmx/svm) naming ENOENT, on every host.
func TestRealBackendPreflight(t *testing.T) {
	usable, why, reasons := kvmOracle(DevKVM)
	r := PreflightKVM(DevKVM)
	t.Logf("kernel: usable=%v %s; preflight: %s", usable, why, r)
	// The test's own look at the host: PVM serves /dev/kvm without vmx/svm.
	pvm := false
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil && os.Getenv(EnvAllowPVM) != "1" {
		cpuinfo, _ := os.ReadFile("/proc/cpuinfo")
		pvm = !strings.Contains(string(cpuinfo), " vmx") && !strings.Contains(string(cpuinfo), " svm")
	}
	if usable && pvm {
		if r.OK || r.Reason != ReasonPVM || !strings.Contains(r.Detail, DevKVM) || !strings.Contains(KVMSkipReason(), ReasonPVM) {
			t.Errorf("%s is kvm_pvm here (module loaded, no vmx/svm) but the preflight says %s (skip reason %q)", DevKVM, r, KVMSkipReason())
		}
	} else if usable {
		if !r.OK || r.Reason != ReasonOK || KVMSkipReason() != "" {
			t.Errorf("%s is usable here (%s) but the preflight says %s (skip reason %q)", DevKVM, why, r, KVMSkipReason())
		}
	} else {
		if r.OK || !slices.Contains(reasons, r.Reason) || !strings.Contains(r.Detail, DevKVM) || !strings.Contains(r.Detail, why) {
			t.Errorf("%s is not usable (%s): want reason %v naming %q, got %s", DevKVM, why, reasons, why, r)
		}
		if KVMSkipReason() != r.String() {
			t.Errorf("KVMSkipReason %q, want %q", KVMSkipReason(), r.String())
		}
	}
	missing := filepath.Join(t.TempDir(), "kvm")
	if r := PreflightKVM(missing); r.OK || (r.Reason != ReasonAbsent && r.Reason != ReasonNestedVirtOff) ||
		!strings.Contains(r.Detail, "open "+missing+": "+unix.ENOENT.Error()) {
		t.Errorf("without a KVM device: preflight %s, want absent (or nested-virt-off) naming open %s: %v", r, missing, unix.ENOENT)
	}
	if r := PreflightKVM(os.DevNull); r.OK || r.Reason != ReasonAPIVersion || !strings.Contains(r.Detail, os.DevNull+" is not a KVM device") {
		t.Errorf("on %s: preflight %s, want api-version: not a KVM device", os.DevNull, r)
	}

	v := Verdict(Options{})
	t.Logf("preflight: %s", v)
	if usable && !pvm && strings.Contains(v, "unavailable (") && !strings.Contains(v, "; kvm: ok: ") {
		t.Errorf("verdict blames KVM on a host where it is usable: %s", v)
	}
	if os.Getenv(EnvRequireReal) == "1" {
		env := realEnv(t)
		t.Logf("preflight: cloud-hypervisor %s at %s", env.CHVersion, env.CHBinary)
	}
}

// kvmOracle asks the kernel directly whether dev is a usable KVM device,
// and when not, the errno (or API version) that says why and the preflight
// reasons that answer may read as.
func kvmOracle(dev string) (usable bool, why string, reasons []string) {
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		switch {
		case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
			return false, err.Error(), []string{ReasonPermission}
		default:
			return false, err.Error(), []string{ReasonAbsent, ReasonNestedVirtOff}
		}
	}
	defer unix.Close(fd)
	v, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), kvmGetAPIVersion, 0)
	if errno != 0 {
		return false, errno.Error(), []string{ReasonAPIVersion}
	}
	if v != KVMAPIVersion {
		return false, fmt.Sprintf("KVM API version %d", v), []string{ReasonAPIVersion}
	}
	vm, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), kvmCreateVM, 0)
	if errno != 0 {
		return false, errno.Error(), []string{ReasonCreateVM, ReasonNestedVirtOff}
	}
	unix.Close(int(vm))
	return true, fmt.Sprintf("KVM API %d, KVM_CREATE_VM gave fd %d", v, vm), nil
}
