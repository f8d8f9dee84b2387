package realch

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const (
	cpuinfoGuestNoVMX = "processor\t: 0\nflags\t\t: fpu vme sse2 hypervisor lm\n\nprocessor\t: 1\nflags\t\t: fpu vmx\n"
	cpuinfoGuestVMX   = "processor\t: 0\nflags\t\t: fpu vme vmx hypervisor lm\n"
	cpuinfoMetalNoVMX = "processor\t: 0\nflags\t\t: fpu vme sse2 lm\n"
	cpuinfoMetalSVM   = "processor\t: 0\nflags\t\t: fpu svm lm\n"
)

// fakeKVM is an injected kernel: open/ioctl answers and the fds it handed out.
type fakeKVM struct {
	openErr   error
	apiVer    int
	apiErr    error
	createErr error
	cpuinfo   string
	modules   []string
	open      map[int]bool
	next      int
}

func (f *fakeKVM) sys() kvmSys {
	f.open = map[int]bool{}
	f.next = 10
	return kvmSys{
		open: func(string) (int, error) {
			if f.openErr != nil {
				return -1, f.openErr
			}
			f.next++
			f.open[f.next] = true
			return f.next, nil
		},
		ioctl: func(fd int, req uintptr) (int, error) {
			if !f.open[fd] {
				return -1, unix.EBADF
			}
			switch req {
			case kvmGetAPIVersion:
				if f.apiErr != nil {
					return -1, f.apiErr
				}
				return f.apiVer, nil
			case kvmCreateVM:
				if f.createErr != nil {
					return -1, f.createErr
				}
				f.next++
				f.open[f.next] = true
				return f.next, nil
			}
			return -1, unix.ENOTTY
		},
		close: func(fd int) error {
			if !f.open[fd] {
				return unix.EBADF
			}
			delete(f.open, fd)
			return nil
		},
		cpuinfo: func() ([]byte, error) {
			if f.cpuinfo == "" {
				return nil, os.ErrNotExist
			}
			return []byte(f.cpuinfo), nil
		},
		module: func(name string) bool { return slices.Contains(f.modules, name) },
	}
}

func TestPreflightKVMReasonPerKernelAnswer(t *testing.T) {
	cases := []struct {
		name       string
		k          fakeKVM
		wantOK     bool
		wantReason string
		wantDetail string
	}{
		{"working kvm", fakeKVM{apiVer: 12, cpuinfo: cpuinfoMetalSVM}, true, ReasonOK, "KVM_CREATE_VM works"},
		{"no device on bare metal with vmx off", fakeKVM{openErr: unix.ENOENT, cpuinfo: cpuinfoMetalNoVMX}, false, ReasonAbsent, "enable VT-x/AMD-V"},
		{"no device, module not loaded", fakeKVM{openErr: unix.ENOENT, cpuinfo: cpuinfoMetalSVM}, false, ReasonAbsent, "modprobe kvm_intel"},
		{"device node without a driver", fakeKVM{openErr: unix.ENXIO, cpuinfo: cpuinfoGuestVMX}, false, ReasonAbsent, "modprobe"},
		{"no device in a guest without vmx", fakeKVM{openErr: unix.ENOENT, cpuinfo: cpuinfoGuestNoVMX}, false, ReasonNestedVirtOff, "nested=1"},
		{"permission denied", fakeKVM{openErr: unix.EACCES}, false, ReasonPermission, "kvm group"},
		{"operation not permitted", fakeKVM{openErr: unix.EPERM}, false, ReasonPermission, "kvm group"},
		{"not a kvm device", fakeKVM{apiErr: unix.ENOTTY}, false, ReasonAPIVersion, "not a KVM device"},
		{"wrong api version", fakeKVM{apiVer: 11}, false, ReasonAPIVersion, "KVM API version 11"},
		{"kvm_pvm in a guest without vmx", fakeKVM{apiVer: 12, cpuinfo: cpuinfoGuestNoVMX, modules: []string{"kvm", "kvm_pvm"}}, false, ReasonPVM, "KVM_EXIT_INTERNAL_ERROR"},
		{"kvm_pvm loaded next to hardware kvm", fakeKVM{apiVer: 12, cpuinfo: cpuinfoGuestVMX, modules: []string{"kvm", "kvm_intel", "kvm_pvm"}}, true, ReasonOK, "KVM_CREATE_VM works"},
		{"create vm busy", fakeKVM{apiVer: 12, createErr: unix.EBUSY, cpuinfo: cpuinfoMetalSVM}, false, ReasonCreateVM, "another hypervisor"},
		{"create vm out of memory", fakeKVM{apiVer: 12, createErr: unix.ENOMEM, cpuinfo: cpuinfoGuestVMX}, false, ReasonCreateVM, "out of memory"},
		{"create vm fails in a guest without vmx", fakeKVM{apiVer: 12, createErr: unix.EOPNOTSUPP, cpuinfo: cpuinfoGuestNoVMX}, false, ReasonNestedVirtOff, "KVM_CREATE_VM"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := tc.k
			r := preflightKVM(k.sys(), "/dev/kvm-test")
			if r.OK != tc.wantOK || r.Reason != tc.wantReason {
				t.Fatalf("got OK=%v reason=%q (%s), want OK=%v reason=%q", r.OK, r.Reason, r.Detail, tc.wantOK, tc.wantReason)
			}
			if !strings.Contains(r.Detail, tc.wantDetail) || !strings.Contains(r.Detail, "/dev/kvm-test") {
				t.Fatalf("detail %q: want it to name the device and contain %q", r.Detail, tc.wantDetail)
			}
			if len(k.open) != 0 {
				t.Fatalf("preflight leaked fds %v", k.open)
			}
		})
	}
}

// Real device files, real syscalls: a path that does not exist, and a char
// device that is not KVM (/dev/null answers the KVM ioctl with ENOTTY).
func TestPreflightKVMOnFakeDeviceFiles(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "kvm")
	if r := PreflightKVM(missing); r.OK || (r.Reason != ReasonAbsent && r.Reason != ReasonNestedVirtOff) || !strings.Contains(r.Detail, missing) {
		t.Fatalf("missing device: %+v", r)
	}
	if r := PreflightKVM("/dev/null"); r.OK || r.Reason != ReasonAPIVersion || !strings.Contains(r.Detail, "not a KVM device") {
		t.Fatalf("/dev/null: %+v", r)
	}
	regular := filepath.Join(t.TempDir(), "kvm")
	if err := os.WriteFile(regular, []byte("not a device"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := PreflightKVM(regular); r.OK || r.Reason != ReasonAPIVersion {
		t.Fatalf("regular file: %+v", r)
	}
}

// A mode-000 device file refuses a non-root opener with EACCES. Root ignores
// file modes, so this runs only for an unprivileged user; the injected EACCES
// case above covers root.
func TestPreflightKVMPermissionOnRealFile(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root bypasses file permissions; EACCES is covered by injection")
	}
	p := filepath.Join(t.TempDir(), "kvm")
	if err := os.WriteFile(p, nil, 0); err != nil {
		t.Fatal(err)
	}
	if r := PreflightKVM(p); r.Reason != ReasonPermission {
		t.Fatalf("got %+v, want permission", r)
	}
}

// The machine's own /dev/kvm: whatever it says must be one of the reasons.
func TestPreflightKVMOnThisMachineGivesAKnownReason(t *testing.T) {
	r := PreflightKVM("")
	t.Logf("this machine: %s", r)
	switch r.Reason {
	case ReasonOK, ReasonAbsent, ReasonPermission, ReasonNestedVirtOff, ReasonAPIVersion, ReasonCreateVM, ReasonPVM:
	default:
		t.Fatalf("unknown reason %q", r.Reason)
	}
	if r.OK != (r.Reason == ReasonOK) {
		t.Fatalf("OK=%v with reason %q", r.OK, r.Reason)
	}
}

func TestParseCPUFlagsReadsFirstProcessor(t *testing.T) {
	f := ParseCPUFlags(cpuinfoGuestNoVMX)
	if !f["hypervisor"] || f["vmx"] {
		t.Fatalf("flags %v: want the first processor's set", f)
	}
	if ParseCPUFlags("processor: 0\n") != nil {
		t.Fatal("no flags line must give nil")
	}
}

func TestPreflightReportsMissingBeforeKVM(t *testing.T) {
	isolate(t)
	env, r, err := Preflight(Options{})
	if env != nil || err == nil || !errors.Is(err, ErrMissing) || r.Reason != ReasonMissing {
		t.Fatalf("env=%v r=%+v err=%v", env, r, err)
	}
	v := Verdict(Options{})
	if !strings.HasPrefix(v, "real backend: unavailable (missing)") || !strings.Contains(v, "cloud-hypervisor binary") || !strings.Contains(v, "kvm: ") {
		t.Fatalf("verdict %q", v)
	}
}

// /proc/cpuinfo is read from the machine: outside input.
func FuzzParseCPUFlags(f *testing.F) {
	for _, s := range []string{cpuinfoGuestNoVMX, cpuinfoMetalSVM, "", "flags", "flags:", ":::\n flags : a b\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		flags := ParseCPUFlags(s)
		for k := range flags {
			if k == "" || strings.ContainsAny(k, " \t\n") {
				t.Fatalf("flag %q", k)
			}
		}
	})
}

func TestKVMSkipReasonAgreesWithPreflight(t *testing.T) {
	r := PreflightKVM(DevKVM)
	got := KVMSkipReason()
	if r.OK != (got == "") || (!r.OK && !strings.HasPrefix(got, r.Reason+": ")) {
		t.Fatalf("KVMSkipReason %q vs preflight %+v", got, r)
	}
}
