package realch

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// PVM hosts (docs/realch.md "PVM hosts"): /dev/kvm is served by kvm_pvm on a
// machine without VT-x/AMD-V. Two things differ from hardware KVM there, and
// the preflight names each with its own reason:
//   - boot: only a PVM guest kernel runs (ReasonPVM, kvm.go; kernel.go reads one);
//   - snapshot: virt-pvm leaves the nested-state ops empty, so
//     KVM_CAP_NESTED_STATE is 0 and KVM_GET_NESTED_STATE fails with EINVAL.
//     cloud-hypervisor from v49 (PR #7380, commit 690741de1,
//     hypervisor/src/kvm/mod.rs) calls it for every vCPU when it saves the
//     vCPU state, without checking the capability, so vm.snapshot fails.

// ReasonNestedState is the snapshot reason: every case that takes a snapshot
// (save, hibernate, clone, wake) is expected to fail with it. Keep it stable.
const ReasonNestedState = "snapshot-needs-nested-state"

// NestedStateSince is the first cloud-hypervisor release that reads the
// nested state unconditionally when it snapshots.
const NestedStateSince = 49

// kvmCapNestedState is KVM_CAP_NESTED_STATE (include/uapi/linux/kvm.h), and
// kvmCheckExtension is KVM_CHECK_EXTENSION = _IO(KVMIO, 0x03).
const (
	kvmCapNestedState  = 157
	kvmCheckExtension  = 0xAE03
	nestedStateUnknown = -1
)

// checkExtension is KVM_CHECK_EXTENSION with its argument.
func checkExtension(fd int, capability uintptr) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), kvmCheckExtension, capability)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

// NestedState is what KVM_CHECK_EXTENSION(KVM_CAP_NESTED_STATE) answered on
// /dev/kvm and on a VM fd (x86 answers on both; the VM fd is what a VMM
// sees). -1 = not asked (the device or the VM could not be opened).
type NestedState struct {
	System, VM int
	Err        error // why a probe could not be made
}

// Cap is the capability as a VMM sees it: the VM fd's answer, else the
// system's; -1 when neither was read.
func (n NestedState) Cap() int {
	if n.VM >= 0 {
		return n.VM
	}
	return n.System
}

// ProbeNestedState asks devPath (empty → /dev/kvm) for KVM_CAP_NESTED_STATE.
func ProbeNestedState(devPath string) NestedState {
	return probeNestedState(realKVMSys, devPath)
}

func probeNestedState(sys kvmSys, devPath string) NestedState {
	n := NestedState{System: nestedStateUnknown, VM: nestedStateUnknown}
	if devPath == "" {
		devPath = DevKVM
	}
	if sys.checkExt == nil {
		n.Err = fmt.Errorf("KVM_CHECK_EXTENSION not available")
		return n
	}
	fd, err := sys.open(devPath)
	if err != nil {
		n.Err = fmt.Errorf("open %s: %w", devPath, err)
		return n
	}
	defer sys.close(fd)
	if v, err := sys.checkExt(fd, kvmCapNestedState); err != nil {
		n.Err = fmt.Errorf("%s: KVM_CHECK_EXTENSION(KVM_CAP_NESTED_STATE): %w", devPath, err)
	} else {
		n.System = v
	}
	vm, err := sys.ioctl(fd, kvmCreateVM)
	if err != nil {
		n.Err = fmt.Errorf("%s: KVM_CREATE_VM: %w", devPath, err)
		return n
	}
	defer sys.close(vm)
	if v, err := sys.checkExt(vm, kvmCapNestedState); err != nil {
		n.Err = fmt.Errorf("%s: VM fd KVM_CHECK_EXTENSION(KVM_CAP_NESTED_STATE): %w", devPath, err)
	} else {
		n.VM = v
	}
	return n
}

// IsPVMHost reports /dev/kvm served by kvm_pvm: the module is loaded and the
// CPU has no vmx/svm (next to hardware KVM, kvm_intel/kvm_amd serve it).
func IsPVMHost() bool { return pvmHost(realKVMSys) }

func pvmHost(sys kvmSys) bool {
	f := cpuFlags(sys)
	return f != nil && !f["vmx"] && !f["svm"] && sys.module != nil && sys.module("kvm_pvm")
}

// SnapshotBlock decides whether a snapshot can work: "" when it can (or
// nothing says it cannot), else ReasonNestedState with the detail. chVersion
// is `cloud-hypervisor --version`'s token ("" = no binary found); nestedCap
// is KVM_CAP_NESTED_STATE (-1 = unknown: then nothing is claimed).
func SnapshotBlock(chVersion string, nestedCap int, pvm bool) string {
	if nestedCap != 0 {
		return ""
	}
	host := "this host"
	if pvm {
		host = "this kvm_pvm host"
	}
	if chVersion == "" {
		return fmt.Sprintf("%s: no cloud-hypervisor binary found to read its version; v%d and later (PR #7380) call KVM_GET_NESTED_STATE when snapshotting, which %s does not support (KVM_CAP_NESTED_STATE = 0)",
			ReasonNestedState, NestedStateSince, host)
	}
	_, v, err := ParseVersion(chVersion)
	if err != nil {
		return fmt.Sprintf("%s: cannot read the cloud-hypervisor version %q; v%d and later (PR #7380) call KVM_GET_NESTED_STATE when snapshotting, which %s does not support (KVM_CAP_NESTED_STATE = 0)",
			ReasonNestedState, chVersion, NestedStateSince, host)
	}
	if v.Major < NestedStateSince {
		return ""
	}
	return fmt.Sprintf("%s: cloud-hypervisor %s (≥ v%d, PR #7380) calls KVM_GET_NESTED_STATE, which %s does not support (KVM_CAP_NESTED_STATE = 0)",
		ReasonNestedState, chVersion, NestedStateSince, host)
}

// snapshotCheck is the snapshot half of the preflight: the CH version (from
// env, else from the binary discovery would pick) against the capability.
func snapshotCheck(o Options, env *Env) string {
	n := ProbeNestedState(DevKVM)
	if n.Cap() < 0 {
		return "" // no KVM at all: the boot reason already says so
	}
	return SnapshotBlock(chVersionFor(o, env), n.Cap(), IsPVMHost())
}

// chVersionFor is the version token of the binary the run would use, even
// when discovery failed for another item (payload, image) or the range.
func chVersionFor(o Options, env *Env) string {
	if env != nil && env.CHVersion != "" {
		return env.CHVersion
	}
	chEnv := EnvCHBinary
	if os.Getenv(EnvCHBinary) == "" && os.Getenv(EnvCHShort) != "" {
		chEnv = EnvCHShort
	}
	bin, _ := resolve(o.CHBinary, chEnv, wellKnown()["ch"], true)
	if bin == "" {
		return ""
	}
	// Any range: the version is what matters here, not whether it is supported.
	tok, err := CheckVersion(bin, "v0", "v999")
	if err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	return tok
}
