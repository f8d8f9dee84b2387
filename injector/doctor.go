package injector

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Check is one line of `vmchaos doctor`.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// HostChecks reports what this host offers the injector: root, cgroup2,
// systemd as PID 1 (systemd supervisor), a private systemd (sandbox) and
// which supervisor `auto` would pick. It starts nothing.
func HostChecks() []Check {
	var out []Check
	add := func(name string, ok bool, format string, a ...any) {
		out = append(out, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, a...)})
	}
	if os.Geteuid() == 0 {
		add("root", true, "uid 0")
	} else {
		add("root", false, "uid %d: only the builtin supervisor works (sandbox and systemd need root)", os.Geteuid())
	}
	if cg := cgroup2Mount(); cg != "" {
		add("cgroup2", true, "%s", cg)
	} else {
		add("cgroup2", false, "no cgroup2 mount: the sandbox cannot run")
	}
	pid1 := filepath.Base(firstOr(cmdline(1), "?"))
	if systemdIsPID1() {
		add("systemd", true, "PID 1 is systemd: transient units on the host")
	} else {
		add("systemd", false, "PID 1 is %q, not systemd: the systemd supervisor is unavailable (vmchaos sandbox -- CMD gives CMD a private one)", pid1)
	}
	if why := SandboxPreflight(); why == "" {
		add("sandbox", true, "%s (%s) can run as PID 1 of private namespaces", systemdBin, systemdVersion())
	} else {
		add("sandbox", false, "%s", why)
	}
	add("builtin", true, "in-process, child subreaper, units die with the harness (watchdog)")
	switch {
	case systemdIsPID1() && os.Geteuid() == 0:
		add("supervisor", true, "auto → systemd")
	case SandboxPreflight() == "":
		add("supervisor", true, "auto → sandbox")
	default:
		add("supervisor", true, "auto → builtin")
	}
	return out
}

func systemdVersion() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, systemdBin, "--version").Output()
	if err != nil {
		return "version unknown"
	}
	return strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
}
