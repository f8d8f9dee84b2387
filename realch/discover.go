// Package realch is the real cloud-hypervisor backend for KVM runners: it finds
// the cloud-hypervisor binary (and checks its version), the boot payload and a
// guest disk image; probes /dev/kvm; builds the guest's cloud-init NoCloud
// seed; sets up TAP networking inside a network namespace the harness owns;
// and launches and tears down a VMM. Without KVM or a CH binary the
// real-backend specs skip with the precise reason Preflight returns.
package realch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Environment variables read when an Options field is empty.
const (
	EnvCHBinary  = "VMCHAOS_CH_BINARY"
	EnvCHShort   = "VMCHAOS_CH" // same as VMCHAOS_CH_BINARY, which wins when both are set
	EnvFirmware  = "VMCHAOS_FIRMWARE"
	EnvKernel    = "VMCHAOS_KERNEL"
	EnvInitramfs = "VMCHAOS_INITRAMFS"
	EnvImage     = "VMCHAOS_GUEST_IMAGE"
)

// The supported cloud-hypervisor releases. Below v40 the API lacks the error
// chains and restore semantics vmctl relies on; above v53 nothing has been
// checked against ch-api-notes.md yet.
const (
	DefaultMinVersion = "v40"
	DefaultMaxVersion = "v53"
)

// CHName is the binary name vmctl and the process checks expect.
const CHName = "cloud-hypervisor"

// Sentinel errors callers branch on (errors.Is).
var (
	// ErrMissing: a binary, payload or image could not be found.
	ErrMissing = errors.New("missing")
	// ErrVersion: the binary's version is outside the supported range or unreadable.
	ErrVersion = errors.New("unsupported cloud-hypervisor version")
)

// Options choose the binary, payload and image. An empty field falls back to
// its environment variable, then to the well-known places (PATH for the binary).
type Options struct {
	CHBinary, Firmware, Kernel, Initramfs, Image string
	// MinVersion and MaxVersion bound the accepted release ("v40", "v53.0");
	// empty means DefaultMinVersion / DefaultMaxVersion. Both are inclusive on
	// the major version: v53.2 passes a v53 maximum.
	MinVersion, MaxVersion string
}

// Env is what Discover found: absolute paths and the binary's version.
type Env struct {
	CHBinary  string
	CHVersion string // as printed, e.g. "v53.0" or "v48.0-12-gabcdef-dirty"
	Firmware  string // set when booting through firmware
	Kernel    string // set when booting a kernel directly (then Firmware is empty)
	Initramfs string
	Image     string
}

// wellKnown lists where each item is looked for after the option and the
// environment. $HOME/workloads is where cloud-hypervisor's own integration
// tests keep their firmware and kernels. Tests replace it.
var wellKnown = func() map[string][]string {
	home, _ := os.UserHomeDir()
	w := filepath.Join(home, "workloads")
	return map[string][]string{
		"ch": {"/usr/local/bin/cloud-hypervisor", "/usr/bin/cloud-hypervisor", "/opt/cloud-hypervisor/cloud-hypervisor"},
		"firmware": {
			"/usr/share/cloud-hypervisor/CLOUDHV.fd", "/usr/local/share/cloud-hypervisor/CLOUDHV.fd",
			"/usr/share/cloud-hypervisor/hypervisor-fw", "/usr/local/share/cloud-hypervisor/hypervisor-fw",
			filepath.Join(w, "CLOUDHV.fd"), filepath.Join(w, "hypervisor-fw"),
		},
		"kernel": {filepath.Join(w, "vmlinux-x86_64"), filepath.Join(w, "vmlinux"), filepath.Join(DefaultImageDir, ImageKernel)},
		"image": {
			"/var/lib/vmchaos/images/guest.qcow2", "/var/lib/vmchaos/images/guest.raw", "/var/lib/vmchaos/images/guest.img",
		},
	}
}

// MissingError names everything Discover could not find, each with where it
// looked, so one message tells an operator the whole setup gap.
type MissingError struct{ Items []string }

func (e *MissingError) Error() string {
	return "realch: missing: " + strings.Join(e.Items, "; ")
}

// Is makes errors.Is(err, ErrMissing) true.
func (e *MissingError) Is(target error) bool { return target == ErrMissing }

// VersionError is a binary whose version is out of range or unreadable.
type VersionError struct {
	Binary, Found, Min, Max string
	Output                  string // what --version printed when it could not be parsed
}

func (e *VersionError) Error() string {
	if e.Found == "" {
		return fmt.Sprintf("realch: %s: cannot read a version from `--version` output %q (supported %s..%s)", e.Binary, e.Output, e.Min, e.Max)
	}
	return fmt.Sprintf("realch: %s is cloud-hypervisor %s, outside the supported range %s..%s", e.Binary, e.Found, e.Min, e.Max)
}

// Is makes errors.Is(err, ErrVersion) true.
func (e *VersionError) Is(target error) bool { return target == ErrVersion }

// Discover resolves every path of o and checks the binary's version. A
// MissingError lists everything absent at once; a VersionError names the
// found version and the supported range.
func Discover(o Options) (*Env, error) {
	wk := wellKnown()
	env := &Env{}
	var missing []string

	chEnv := EnvCHBinary
	if os.Getenv(EnvCHBinary) == "" && os.Getenv(EnvCHShort) != "" {
		chEnv = EnvCHShort // the short name the project's docs use
	}
	ch, where := resolve(o.CHBinary, chEnv, wk["ch"], true)
	if ch == "" {
		missing = append(missing, "cloud-hypervisor binary ("+where+")")
	}
	env.CHBinary = ch

	// The payload: an explicit (or env) firmware, else an explicit (or env)
	// kernel, else firmware, else a kernel from the well-known places.
	fw, fwWhere := resolve(o.Firmware, EnvFirmware, nil, false)
	kern, kWhere := resolve(o.Kernel, EnvKernel, nil, false)
	switch {
	case strings.HasPrefix(fwWhere, "not found:") || strings.HasPrefix(kWhere, "not found:"):
		// An explicitly named file that does not exist: say so rather than
		// silently booting something else.
		missing = append(missing, "boot payload ("+strings.TrimSpace(fwWhere+" "+kWhere)+")")
	case fw != "":
		env.Firmware = fw
	case kern != "":
		env.Kernel = kern
	default:
		fw, _ = resolve("", "", wk["firmware"], false)
		kern, _ = resolve("", "", wk["kernel"], false)
		switch {
		case fw != "":
			env.Firmware = fw
		case kern != "":
			env.Kernel = kern
		default:
			missing = append(missing, fmt.Sprintf("boot payload: firmware CLOUDHV.fd or hypervisor-fw (set %s; looked in %s) or a kernel (set %s; looked in %s)",
				EnvFirmware, strings.Join(wk["firmware"], ", "), EnvKernel, strings.Join(wk["kernel"], ", ")))
		}
	}
	if env.Kernel != "" {
		initrd, iWhere := resolve(o.Initramfs, EnvInitramfs, nil, false)
		if strings.HasPrefix(iWhere, "not found:") {
			missing = append(missing, "initramfs ("+iWhere+")")
		}
		// `vmchaos image real` writes its initramfs next to its kernel, and
		// that kernel cannot mount its root without it.
		if initrd == "" && iWhere != "" && !strings.HasPrefix(iWhere, "not found:") && filepath.Base(env.Kernel) == ImageKernel {
			if p := filepath.Join(filepath.Dir(env.Kernel), ImageInitramfs); isFile(p) {
				initrd = p
			}
		}
		env.Initramfs = initrd
	}

	img, iWhere := resolve(o.Image, EnvImage, wk["image"], false)
	if img == "" {
		missing = append(missing, "guest disk image ("+iWhere+")")
	}
	env.Image = img

	if len(missing) > 0 {
		return nil, &MissingError{Items: missing}
	}
	v, err := CheckVersion(ch, o.MinVersion, o.MaxVersion)
	if err != nil {
		return nil, err
	}
	env.CHVersion = v
	return env, nil
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}

// resolve picks the first of: the explicit value, the env variable, PATH
// (when lookPath), the well-known paths. It returns the absolute path, or ""
// and a description of where it looked ("not found: X" when an explicitly
// named file is absent).
func resolve(explicit, envName string, places []string, lookPath bool) (string, string) {
	name := explicit
	from := "option"
	if name == "" && envName != "" {
		name = os.Getenv(envName)
		from = envName
	}
	if name != "" {
		if lookPath && !strings.Contains(name, "/") {
			p, err := exec.LookPath(name)
			if err != nil {
				return "", fmt.Sprintf("not found: %s=%s is not on PATH", from, name)
			}
			name = p
		}
		abs, err := filepath.Abs(name)
		if err != nil {
			return "", fmt.Sprintf("not found: %s=%s: %v", from, name, err)
		}
		fi, err := os.Stat(abs)
		if err != nil || fi.IsDir() {
			return "", fmt.Sprintf("not found: %s=%s does not exist or is a directory", from, name)
		}
		return abs, ""
	}
	if lookPath {
		if p, err := exec.LookPath(CHName); err == nil {
			if abs, err := filepath.Abs(p); err == nil {
				return abs, ""
			}
		}
	}
	for _, p := range places {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, ""
		}
	}
	var where []string
	if envName != "" {
		where = append(where, "set "+envName)
	}
	if lookPath {
		where = append(where, CHName+" not on PATH")
	}
	if len(places) > 0 {
		where = append(where, "looked in "+strings.Join(places, ", "))
	}
	return "", strings.Join(where, "; ")
}

// Version is a parsed cloud-hypervisor release.
type Version struct{ Major, Minor int }

func (v Version) String() string { return fmt.Sprintf("v%d.%d", v.Major, v.Minor) }

// ParseVersion reads a release from `--version` output ("cloud-hypervisor
// v53.0", "cloud-hypervisor v48.0-12-gabc-dirty", possibly followed by
// "Migration Protocol Versions: ..." lines) or from a bare "v53"/"53.0". It
// returns the version token as printed (for messages) and the parsed number.
func ParseVersion(out string) (string, Version, error) {
	// Prefer the token right after the program name; fall back to the first
	// version-shaped token anywhere.
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == CHName {
				if v, ok := parseToken(f[i+1]); ok {
					return f[i+1], v, nil
				}
			}
		}
	}
	for _, line := range strings.Split(out, "\n") {
		for _, tok := range strings.Fields(line) {
			if v, ok := parseToken(tok); ok {
				return tok, v, nil
			}
		}
	}
	return "", Version{}, fmt.Errorf("no cloud-hypervisor version in %q", truncate(out, 200))
}

// parseToken accepts v?MAJOR[.MINOR[.PATCH]][-describe-suffix].
func parseToken(tok string) (Version, bool) {
	s := strings.TrimPrefix(tok, "v")
	if i := strings.IndexByte(s, '-'); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) == 0 || len(parts) > 3 {
		return Version{}, false
	}
	nums := make([]int, 0, 2)
	for _, p := range parts {
		if p == "" || len(p) > 6 {
			return Version{}, false
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || strings.TrimLeft(p, "0123456789") != "" {
			return Version{}, false
		}
		nums = append(nums, n)
	}
	// A bare number ("2") is too weak a signal unless it was written "vN".
	if len(nums) == 1 && !strings.HasPrefix(tok, "v") {
		return Version{}, false
	}
	v := Version{Major: nums[0]}
	if len(nums) > 1 {
		v.Minor = nums[1]
	}
	return v, true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// versionTimeout bounds `cloud-hypervisor --version`, which a healthy binary
// answers at once; a hung binary must not hang discovery.
const versionTimeout = 10 * time.Second

// CheckVersion runs `bin --version`, parses it and checks the inclusive major
// range [min, max] (empty → defaults). It returns the version as printed.
func CheckVersion(bin, min, max string) (string, error) {
	if min == "" {
		min = DefaultMinVersion
	}
	if max == "" {
		max = DefaultMaxVersion
	}
	_, lo, err := ParseVersion(min)
	if err != nil {
		return "", fmt.Errorf("realch: MinVersion %q: %w", min, err)
	}
	_, hi, err := ParseVersion(max)
	if err != nil {
		return "", fmt.Errorf("realch: MaxVersion %q: %w", max, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), versionTimeout)
	defer cancel()
	// stdout only: a warning on stderr must not be read as the version.
	var stdout, stderr strings.Builder
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("realch: %s --version: %w (stderr %q)", bin, err, truncate(stderr.String(), 200))
	}
	out := stdout.String()
	tok, v, perr := ParseVersion(out)
	if perr != nil {
		return "", &VersionError{Binary: bin, Min: min, Max: max, Output: truncate(strings.TrimSpace(out), 200)}
	}
	if v.Major < lo.Major || v.Major > hi.Major {
		return "", &VersionError{Binary: bin, Found: tok, Min: min, Max: max}
	}
	return tok, nil
}
