package realch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSnapshotBlock is the decision table: CH version × KVM_CAP_NESTED_STATE
// × kvm_pvm → the snapshot reason ("" = snapshot can work).
func TestSnapshotBlock(t *testing.T) {
	for _, tc := range []struct {
		version string
		cap     int
		pvm     bool
		want    []string // substrings; nil = no reason
	}{
		{"v53.0", 0, true, []string{ReasonNestedState + ": cloud-hypervisor v53.0 (≥ v49, PR #7380) calls KVM_GET_NESTED_STATE", "this kvm_pvm host", "KVM_CAP_NESTED_STATE = 0"}},
		{"v49.0", 0, true, []string{ReasonNestedState + ": cloud-hypervisor v49.0 (≥ v49"}},
		{"v49.0-12-gabcdef-dirty", 0, false, []string{ReasonNestedState, "which this host does not"}},
		{"v48.1", 0, true, nil},
		{"v40.0", 0, true, nil},
		{"v53.0", 1, true, nil},
		{"v53.0", 8192, false, nil}, // hardware KVM answers the state size
		{"v53.0", -1, true, nil},    // unknown: nothing claimed
		{"", 0, true, []string{ReasonNestedState + ": no cloud-hypervisor binary found", "v49 and later"}},
		{"", 1, true, nil},
		{"garbage", 0, true, []string{ReasonNestedState + ": cannot read the cloud-hypervisor version \"garbage\""}},
	} {
		got := SnapshotBlock(tc.version, tc.cap, tc.pvm)
		if tc.want == nil {
			if got != "" {
				t.Errorf("SnapshotBlock(%q, %d, %v) = %q, want none", tc.version, tc.cap, tc.pvm, got)
			}
			continue
		}
		if !strings.HasPrefix(got, ReasonNestedState+": ") {
			t.Errorf("SnapshotBlock(%q, %d, %v) = %q, want a %s reason", tc.version, tc.cap, tc.pvm, got, ReasonNestedState)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("SnapshotBlock(%q, %d, %v) = %q, lacks %q", tc.version, tc.cap, tc.pvm, got, w)
			}
		}
	}
}

// TestProbeNestedStateFake: the capability is asked on /dev/kvm and on a VM
// fd, with the capability number, and every fd is closed.
func TestProbeNestedStateFake(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sysCap    int
		vmCap     int
		createErr error
		wantCap   int
		wantErr   bool
	}{
		{"pvm: zero on both", 0, 0, nil, 0, false},
		{"hardware: state size", 8192, 8192, nil, 8192, false},
		{"VM fd wins", 0, 4096, nil, 4096, false},
		{"no VM: system answer", 0, 0, unix.ENOMEM, 0, true},
	} {
		f := &fakeKVM{apiVer: 12, createErr: tc.createErr}
		sys := f.sys()
		sys.checkExt = func(fd int, c uintptr) (int, error) {
			if !f.open[fd] {
				return -1, unix.EBADF
			}
			if c != kvmCapNestedState {
				return -1, unix.EINVAL
			}
			if fd == 11 { // the /dev/kvm fd the fake hands out first
				return tc.sysCap, nil
			}
			return tc.vmCap, nil
		}
		n := probeNestedState(sys, "")
		if n.Cap() != tc.wantCap || (n.Err != nil) != tc.wantErr {
			t.Errorf("%s: probe = %+v (cap %d), want cap %d, err %v", tc.name, n, n.Cap(), tc.wantCap, tc.wantErr)
		}
		if len(f.open) != 0 {
			t.Errorf("%s: fds left open: %v", tc.name, f.open)
		}
	}
	f := &fakeKVM{openErr: unix.ENOENT}
	sys := f.sys()
	sys.checkExt = func(int, uintptr) (int, error) { return 0, nil }
	if n := probeNestedState(sys, ""); n.Cap() != -1 || !errors.Is(n.Err, unix.ENOENT) {
		t.Errorf("no /dev/kvm: probe = %+v, want unknown and ENOENT", n)
	}
}

// TestProbeNestedStateHost asks this machine's /dev/kvm. On a kvm_pvm host
// the capability must be read and be 0 (virt-pvm has no nested ops); the
// test says what it found either way.
func TestProbeNestedStateHost(t *testing.T) {
	if _, err := os.Stat(DevKVM); err != nil {
		t.Skipf("no %s: %v", DevKVM, err)
	}
	n := ProbeNestedState("")
	pvm := IsPVMHost()
	t.Logf("%s: KVM_CAP_NESTED_STATE system %d, VM %d (err %v); kvm_pvm host %v", DevKVM, n.System, n.VM, n.Err, pvm)
	if errors.Is(n.Err, unix.EACCES) || errors.Is(n.Err, unix.EPERM) {
		t.Skipf("cannot open %s: %v", DevKVM, n.Err)
	}
	if n.Cap() < 0 {
		t.Fatalf("capability not read: %v", n.Err)
	}
	if pvm && n.Cap() != 0 {
		t.Errorf("kvm_pvm host answers KVM_CAP_NESTED_STATE = %d, want 0 (virt-pvm leaves nested ops empty)", n.Cap())
	}
	if pvm {
		r := SnapshotBlock("v53.0", n.Cap(), pvm)
		t.Logf("snapshot reason with CH v53.0: %s", r)
		if !strings.HasPrefix(r, ReasonNestedState) {
			t.Errorf("kvm_pvm host, CH v53.0: snapshot reason %q", r)
		}
	}
}

// TestPreflightReportsSnapshotAndKernel runs the whole preflight on this
// host with a stand-in cloud-hypervisor that prints a version, and a
// synthetic PVM guest vmlinux: the snapshot reason follows this host's
// KVM_CAP_NESTED_STATE and the version, the kernel verdict is reported.
func TestPreflightReportsSnapshotAndKernel(t *testing.T) {
	if _, err := os.Stat(DevKVM); err != nil {
		t.Skipf("no %s: %v", DevKVM, err)
	}
	n := ProbeNestedState("")
	if n.Cap() < 0 {
		t.Skipf("KVM_CAP_NESTED_STATE unreadable here: %v", n.Err)
	}
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinux")
	if err := os.WriteFile(kernel, minimalELF(t, note("Xen", 18, []byte{0, 0, 0, 1}), ikconfigBlock(t, pvmConfig)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"initrd.img", "guest.raw"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(EnvCHBinary, "")
	t.Setenv(EnvFirmware, "")
	t.Setenv(EnvKernel, kernel)
	t.Setenv(EnvInitramfs, filepath.Join(dir, "initrd.img"))
	t.Setenv(EnvImage, filepath.Join(dir, "guest.raw"))
	for _, version := range []string{"v53.0", "v48.0"} {
		ch := filepath.Join(dir, "cloud-hypervisor-"+version)
		if err := os.WriteFile(ch, []byte("#!/bin/sh\necho cloud-hypervisor "+version+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Setenv(EnvCHShort, ch)
		_, r, err := Preflight(Options{})
		if err != nil {
			t.Fatalf("%s: %v", version, err)
		}
		t.Logf("%s, KVM_CAP_NESTED_STATE %d: boot %s; snapshot %q; kernel %q", version, n.Cap(), r, r.Snapshot, r.Kernel)
		want := ""
		if version == "v53.0" && n.Cap() == 0 {
			want = SnapshotBlock(version, 0, IsPVMHost())
		}
		if r.Snapshot != want {
			t.Errorf("%s: snapshot reason %q, want %q", version, r.Snapshot, want)
		}
		if !strings.Contains(r.Kernel, ": PVM guest yes: CONFIG_PVM_GUEST=y, CONFIG_X86_PIE=y") {
			t.Errorf("%s: kernel verdict %q", version, r.Kernel)
		}
		if v := Verdict(Options{}); want != "" && !strings.Contains(v, "snapshot cases expected to fail: "+want) {
			t.Errorf("%s: doctor verdict lacks the snapshot reason: %q", version, v)
		}
	}
}
