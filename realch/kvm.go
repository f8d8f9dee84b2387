package realch

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// DevKVM is the KVM device every preflight opens by default.
const DevKVM = "/dev/kvm"

// Preflight reasons. They are the words the real-backend specs skip with and
// `vmchaos doctor` prints; keep them stable.
const (
	ReasonOK            = "ok"
	ReasonAbsent        = "absent"          // no /dev/kvm, or no KVM driver behind it
	ReasonPermission    = "permission"      // /dev/kvm exists but this user may not open it
	ReasonNestedVirtOff = "nested-virt-off" // a guest whose hypervisor hides vmx/svm
	ReasonAPIVersion    = "api-version"     // not a KVM device, or KVM_GET_API_VERSION != 12
	ReasonCreateVM      = "create-vm"       // KVM_CREATE_VM refused
	ReasonPVM           = "kvm-pvm"         // /dev/kvm is the PVM backend (no vmx/svm): stock guest kernels die in it
	ReasonMissing       = "missing"         // Preflight only: binary, payload or image not found
	ReasonVersion       = "ch-version"      // Preflight only: cloud-hypervisor version out of range
)

// KVMAPIVersion is the only KVM API version Linux has ever shipped and the one
// cloud-hypervisor requires.
const KVMAPIVersion = 12

// ioctl request numbers: _IO(KVMIO=0xAE, nr).
const (
	kvmGetAPIVersion = 0xAE00
	kvmCreateVM      = 0xAE01
)

// PreflightResult is the verdict of a preflight: OK, or a Reason from the
// list above with a human Detail naming the errno and the remedy.
//
// Snapshot and Kernel are separate from the boot verdict: Snapshot is ""
// or a ReasonNestedState line (the cases that take a snapshot are expected to
// fail with it even where a guest boots); Kernel says whether the kernel
// discovery picked is a PVM guest ("" when booting firmware or none found).
type PreflightResult struct {
	OK       bool
	Reason   string
	Detail   string
	Snapshot string
	Kernel   string
}

func (r PreflightResult) String() string {
	if r.OK {
		return "ok: " + r.Detail
	}
	return r.Reason + ": " + r.Detail
}

// kvmSys is the system interface the probe uses, replaceable in tests to
// inject each errno the kernel can return.
type kvmSys struct {
	open    func(path string) (int, error)
	ioctl   func(fd int, req uintptr) (int, error)
	close   func(fd int) error
	cpuinfo func() ([]byte, error)
	// module reports whether a kernel module is loaded (/sys/module/NAME).
	module func(name string) bool
	// checkExt is KVM_CHECK_EXTENSION(capability) on fd; nil = not probed.
	checkExt func(fd int, capability uintptr) (int, error)
}

// EnvAllowPVM lets the real backend run on a kvm_pvm /dev/kvm anyway (for a
// guest kernel built as a PVM guest, which the Debian kernel is not).
const EnvAllowPVM = "VMCHAOS_ALLOW_PVM"

var realKVMSys = kvmSys{
	open: func(path string) (int, error) {
		return unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	},
	ioctl: func(fd int, req uintptr) (int, error) {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, 0)
		if errno != 0 {
			return -1, errno
		}
		return int(r), nil
	},
	close:   unix.Close,
	cpuinfo: func() ([]byte, error) { return os.ReadFile("/proc/cpuinfo") },
	module: func(name string) bool {
		_, err := os.Stat("/sys/module/" + name)
		return err == nil
	},
	checkExt: checkExtension,
}

// PreflightKVM probes devPath (empty → /dev/kvm) the way cloud-hypervisor
// will: open it read-write, ask KVM_GET_API_VERSION (must be 12), create and
// close a VM. Each failure maps to a distinct reason.
func PreflightKVM(devPath string) PreflightResult {
	return preflightKVM(realKVMSys, devPath)
}

func preflightKVM(sys kvmSys, devPath string) PreflightResult {
	if devPath == "" {
		devPath = DevKVM
	}
	fd, err := sys.open(devPath)
	if err != nil {
		return openFailure(sys, devPath, err)
	}
	defer sys.close(fd)

	v, err := sys.ioctl(fd, kvmGetAPIVersion)
	if err != nil {
		if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) {
			return PreflightResult{Reason: ReasonAPIVersion, Detail: fmt.Sprintf("%s is not a KVM device (KVM_GET_API_VERSION: %v)", devPath, err)}
		}
		return PreflightResult{Reason: ReasonAPIVersion, Detail: fmt.Sprintf("%s: KVM_GET_API_VERSION: %v", devPath, err)}
	}
	if v != KVMAPIVersion {
		return PreflightResult{Reason: ReasonAPIVersion, Detail: fmt.Sprintf("%s: KVM API version %d, cloud-hypervisor needs %d", devPath, v, KVMAPIVersion)}
	}

	vm, err := sys.ioctl(fd, kvmCreateVM)
	if err != nil {
		// A hypervisor that exposes /dev/kvm but no hardware virtualization
		// (some nested setups) fails here rather than at open.
		if nestedOff(sys) {
			return PreflightResult{Reason: ReasonNestedVirtOff, Detail: fmt.Sprintf("%s: KVM_CREATE_VM: %v; this machine is a guest whose CPU flags lack vmx/svm: enable nested virtualization on the host (kvm_intel nested=1 / kvm_amd nested=1, or the cloud's nested-virt option)", devPath, err)}
		}
		detail := fmt.Sprintf("%s: KVM_CREATE_VM: %v", devPath, err)
		switch {
		case errors.Is(err, unix.EBUSY):
			detail += " (another hypervisor holds hardware virtualization, e.g. VirtualBox)"
		case errors.Is(err, unix.ENOMEM):
			detail += " (out of memory)"
		case errors.Is(err, unix.EMFILE), errors.Is(err, unix.ENFILE):
			detail += " (out of file descriptors)"
		}
		return PreflightResult{Reason: ReasonCreateVM, Detail: detail}
	}
	_ = sys.close(vm)
	// PVM (kvm_pvm) serves /dev/kvm on machines without hardware
	// virtualization: the API answers, but a guest that is not a PVM guest
	// runs in emulation (here: the Debian cloud kernel took 160 s of guest
	// time to reach mem_init and then the vCPU stopped with
	// KVM_EXIT_INTERNAL_ERROR). CH's own check stops at KVM_CREATE_VM.
	if pvmHost(sys) && os.Getenv(EnvAllowPVM) != "1" {
		return PreflightResult{Reason: ReasonPVM, Detail: fmt.Sprintf("%s: KVM API %d and KVM_CREATE_VM work, but KVM here is kvm_pvm (the CPU flags have no vmx/svm): "+
			"an ordinary guest kernel runs emulated and dies with KVM_EXIT_INTERNAL_ERROR before userspace; use a host with VT-x/AMD-V (or nested virtualization), "+
			"or set %s=1 with a PVM guest kernel", devPath, v, EnvAllowPVM)}
	}
	return PreflightResult{OK: true, Reason: ReasonOK, Detail: fmt.Sprintf("%s: KVM API %d, KVM_CREATE_VM works", devPath, v)}
}

func openFailure(sys kvmSys, devPath string, err error) PreflightResult {
	switch {
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return PreflightResult{Reason: ReasonPermission, Detail: fmt.Sprintf("open %s: %v: add the runner's user to the kvm group (usermod -aG kvm $USER, then log in again) or run as root", devPath, err)}
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENXIO), errors.Is(err, unix.ENODEV):
		if nestedOff(sys) {
			return PreflightResult{Reason: ReasonNestedVirtOff, Detail: fmt.Sprintf("open %s: %v; this machine is a guest whose CPU flags lack vmx/svm: enable nested virtualization on the host (kvm_intel nested=1 / kvm_amd nested=1, or the cloud's nested-virt option)", devPath, err)}
		}
		hint := "load the module: modprobe kvm_intel (or kvm_amd)"
		if flags := cpuFlags(sys); flags != nil && !flags["vmx"] && !flags["svm"] {
			hint = "the CPU reports no vmx/svm: enable VT-x/AMD-V in the firmware setup"
		}
		return PreflightResult{Reason: ReasonAbsent, Detail: fmt.Sprintf("open %s: %v: %s", devPath, err, hint)}
	}
	return PreflightResult{Reason: ReasonAbsent, Detail: fmt.Sprintf("open %s: %v", devPath, err)}
}

// nestedOff reports a guest (the "hypervisor" CPU flag) without vmx or svm:
// its host does not pass hardware virtualization through.
func nestedOff(sys kvmSys) bool {
	f := cpuFlags(sys)
	return f != nil && f["hypervisor"] && !f["vmx"] && !f["svm"]
}

// cpuFlags returns the flag set of the first processor in /proc/cpuinfo, or
// nil when it cannot be read (then no hint is given).
func cpuFlags(sys kvmSys) map[string]bool {
	if sys.cpuinfo == nil {
		return nil
	}
	b, err := sys.cpuinfo()
	if err != nil {
		return nil
	}
	return ParseCPUFlags(string(b))
}

// ParseCPUFlags reads the "flags" line of the first processor of a
// /proc/cpuinfo text (x86). It returns nil when there is none.
func ParseCPUFlags(cpuinfo string) map[string]bool {
	for _, line := range strings.Split(cpuinfo, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "flags" {
			continue
		}
		flags := map[string]bool{}
		for _, f := range strings.Fields(v) {
			flags[f] = true
		}
		return flags
	}
	return nil
}

// Preflight discovers the environment and probes /dev/kvm. The result is the
// reason the real-backend specs skip with: a discovery failure gives
// ReasonMissing or ReasonVersion (and the error); otherwise the KVM verdict.
// The returned Env is non-nil whenever discovery succeeded.
func Preflight(o Options) (*Env, PreflightResult, error) {
	env, err := Discover(o)
	if err != nil {
		reason := ReasonMissing
		if errors.Is(err, ErrVersion) {
			reason = ReasonVersion
		}
		detail := strings.TrimPrefix(strings.TrimPrefix(err.Error(), "realch: "), "missing: ")
		return nil, PreflightResult{Reason: reason, Detail: detail, Snapshot: snapshotCheck(o, nil)}, err
	}
	r := PreflightKVM(DevKVM)
	r.Snapshot = snapshotCheck(o, env)
	if env.Kernel != "" {
		r.Kernel = KernelVerdict(env.Kernel)
	}
	return env, r, nil
}

// Verdict is the one line `vmchaos doctor` prints for the real backend.
func Verdict(o Options) string {
	env, r, err := Preflight(o)
	var line string
	switch {
	case err != nil:
		// Discovery failed; still say what KVM would do so an operator sees
		// both gaps at once.
		line = fmt.Sprintf("real backend: unavailable (%s): %s; kvm: %s", r.Reason, r.Detail, PreflightKVM(DevKVM))
	case !r.OK:
		line = fmt.Sprintf("real backend: unavailable (%s): %s", r.Reason, r.Detail)
	default:
		payload := "firmware " + env.Firmware
		if env.Kernel != "" {
			payload = "kernel " + env.Kernel
		}
		line = fmt.Sprintf("real backend: ready: cloud-hypervisor %s (%s), %s, image %s; %s", env.CHVersion, env.CHBinary, payload, env.Image, r.Detail)
	}
	if r.Kernel != "" {
		line += "; kernel: " + r.Kernel
	}
	if r.Snapshot != "" {
		line += "; snapshot cases expected to fail: " + r.Snapshot
	}
	return line
}

// KVMSkipReason is the KVM half of the preflight in the shape `vmchaos
// doctor`'s hook takes: "" when /dev/kvm is usable, else "reason: detail".
func KVMSkipReason() string {
	r := PreflightKVM(DevKVM)
	if r.OK {
		return ""
	}
	return r.String()
}
