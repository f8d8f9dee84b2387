package cocoon

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/vmnet"
)

// cocoon's VMs get real networking (issue 32 item 3): cocoon's own CNI
// provider runs the plugins of the Debian package containernetworking-plugins
// with a conflist the case writes. Every cocoon of the case runs inside one
// network and mount namespace the case creates (the "net holder"): the
// bridge and the veths' host ends live in that network namespace, never the
// host's, and the named netns cocoon makes per VM
// (/var/run/netns/cocoon-<ID>, network/cni/config.go) live in that mount
// namespace's own /var/run/netns. That private dir matters: cocoon's gc
// deletes every cocoon-* netns its own store does not know
// (network/cni/gc.go), so two cases sharing the host's /var/run/netns would
// delete each other's. The guest answers SSH at the address IPAM gave it,
// inside its VM's netns (fakech on a TAP-only NIC, docs/fakech.md), where
// the harness dials it (NetnsDialer).
//
// The mechanism is shared by both ways a case runs cocoon: the agent's
// stack (scenarios/stack cocoonnet.go: the holder a unit of the run's
// supervisor) and the manager-verb cases (the adapter's own holder, a child
// of the runner carrying the case's tag: Options.NetPool, GuestNet).

// CNIPluginDir is where containernetworking-plugins installs the plugins.
const CNIPluginDir = "/usr/lib/cni"

// CNIPackage is the Debian package that provides them.
const CNIPackage = "containernetworking-plugins"

// CNIPlugins are the plugins the case's conflist runs.
var CNIPlugins = []string{"bridge", "host-local"}

// cniNetworkName is the conflist's name (cocoon records it as the VM's
// config.network).
const cniNetworkName = "vmchaos"

// NetPreflight says why this host cannot give cocoon's VMs their NICs with
// the plugins of pluginDir ("" = it can) and whether what is missing is a
// capability (root) rather than a package.
func NetPreflight(pluginDir string) (reason string, capability bool) {
	if os.Geteuid() != 0 {
		return "cocoon's CNI networking needs root (network namespaces, a bridge, TAP devices)", true
	}
	for _, p := range CNIPlugins {
		if _, err := os.Stat(filepath.Join(pluginDir, p)); err != nil {
			return fmt.Sprintf("the CNI plugin %s is missing (%v): install the Debian package %s (scripts/setup.sh does)",
				p, err, CNIPackage), false
		}
	}
	for _, tool := range []string{"unshare", "nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("%s is missing (util-linux, iproute2): %v", tool, err), false
		}
	}
	return "", false
}

// holderScript runs in the holder's fresh network and mount namespaces
// (propagation private: nothing mounted there reaches the host): a tmpfs of
// its own over /var/run/netns, loopback up, then it only holds them.
const holderScript = `set -e
mkdir -p /var/run/netns
mount -t tmpfs -o mode=0755,size=1m vmchaos-cocoon-netns /var/run/netns
ip link set lo up
exec sleep infinity`

// HolderArgv is the net holder's command line: new network and mount
// namespaces, set up by holderScript, then held by a sleep.
func HolderArgv() ([]string, error) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return nil, fmt.Errorf("cocoon network: %w", err)
	}
	return []string{unshare, "--net", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", holderScript}, nil
}

// HolderReady is the holder's pid once it has set its namespaces up (it
// execs sleep last), 0 before.
func HolderReady(pid int) int {
	if pid <= 0 {
		return 0
	}
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sleep" {
		return pid
	}
	return 0
}

// WriteWrapper writes the script every cocoon of the case runs as: realBin
// entered into the holder's network and mount namespace. exec in place at
// every step: a child its embedder tracks keeps its pid, and its argv
// becomes cocoon's own.
func WriteWrapper(path string, holder int, realBin, caseName string) error {
	if strings.ContainsAny(realBin, "'\n") {
		return fmt.Errorf("cocoon binary path %q cannot be quoted", realBin)
	}
	script := fmt.Sprintf("#!/bin/sh\n# vmchaos: cocoon inside case %s's network and mount namespace (holder pid %d)\nexec nsenter --target %d --net --mount --wd=\"$PWD\" -- '%s' \"$@\"\n",
		caseName, holder, holder, realBin)
	if err := durable.WriteFile(path, []byte(script), 0o755); err != nil {
		return fmt.Errorf("cocoon wrapper: %w", err)
	}
	return nil
}

// WriteCNIConf writes the conflist into the conf dir the adapter of store
// dir points cocoon at (COCOON_CNI_CONF_DIR, <dir>/cni/net.d) and links the
// plugins of pluginDir into its bin dir (COCOON_CNI_BIN_DIR): a bridge in
// the holder's network namespace and host-local addresses from pool, state
// kept in the store. A loopback pool because the fake guest shares the
// VMM's network namespace and answers on its lo (fakech: only
// 127.0.0.0/8); the address is still the one cocoon's CNI provider got from
// IPAM and handed the guest in its seed.
func WriteCNIConf(dir, pool, pluginDir string) error {
	cni := filepath.Join(dir, "cni")
	conf := map[string]any{
		"cniVersion": "1.0.0", "name": cniNetworkName,
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": "vmchaos0", "isGateway": false, "ipMasq": false,
			"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(cni, "ipam"),
				"ranges": [][]map[string]string{{{"subnet": pool}}}},
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	if err := durable.WriteFile(filepath.Join(cni, "net.d", "10-vmchaos.conflist"), b, 0o644); err != nil {
		return fmt.Errorf("cni conflist: %w", err)
	}
	for _, p := range CNIPlugins {
		if err := os.Symlink(filepath.Join(pluginDir, p), filepath.Join(cni, "bin", p)); err != nil {
			return fmt.Errorf("cni plugin %s: %w", p, err)
		}
	}
	return nil
}

// NetnsDialer connects to a guest of the case from inside its VM's netns:
// the one vms lists for the VM whose guest address is addr, reached through
// the holder's mount namespace (/proc/<holder>/root).
func NetnsDialer(holder int, vms func(context.Context) ([]manager.VM, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		list, err := vms(ctx)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		v, err := vmAt(list, addr)
		if err != nil {
			return nil, err
		}
		p, err := InRoot("/proc/"+strconv.Itoa(holder)+"/root", v.Netns)
		if err != nil {
			return nil, fmt.Errorf("dial %s (vm %s): %w", addr, v.ID, err)
		}
		ns, err := vmnet.OpenNetnsPath(p)
		if err != nil {
			return nil, fmt.Errorf("dial %s (vm %s): %w", addr, v.ID, err)
		}
		return ns.DialContext(ctx, network, addr)
	}
}

// InRoot is path as a process whose root is root sees it, as a path under
// root: every symlink on the way is resolved inside root. The kernel does
// not: an absolute link under /proc/PID/root (/var/run → /run) would lead
// back to the caller's own tree, where the case's private /run/netns is not.
func InRoot(root, path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%s: not an absolute path", path)
	}
	rest := strings.Split(strings.TrimPrefix(filepath.Clean(path), "/"), "/")
	cur := "/"
	for links := 0; len(rest) > 0; {
		next := filepath.Join(cur, rest[0])
		rest = rest[1:]
		fi, err := os.Lstat(root + next)
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			cur = next // a missing tail is left to the caller's open
			continue
		}
		if links++; links > 40 {
			return "", fmt.Errorf("%s: too many symlinks", path)
		}
		target, err := os.Readlink(root + next)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(cur, target)
		}
		rest = append(strings.Split(strings.TrimPrefix(filepath.Clean(target), "/"), "/"), rest...)
		cur = "/"
	}
	return root + cur, nil
}

// vmAt is the one VM whose guest answers at addr, with a netns.
func vmAt(vms []manager.VM, addr string) (manager.VM, error) {
	var at []manager.VM
	for _, v := range vms {
		if v.Address == addr && v.Netns != "" {
			at = append(at, v)
		}
	}
	switch len(at) {
	case 1:
		return at[0], nil
	case 0:
		return manager.VM{}, fmt.Errorf("dial %s: no cocoon VM lists that guest address with a netns", addr)
	}
	ids := make([]string, len(at))
	for i, v := range at {
		ids[i] = v.ID
	}
	return manager.VM{}, fmt.Errorf("dial %s: %d cocoon VMs list that guest address (%s)", addr, len(at), strings.Join(ids, ", "))
}

// NetPluginDir is the plugin dir the adapter's own networking uses (a
// variable for the preflight's tests).
var NetPluginDir = CNIPluginDir

// caseNet is the adapter's own net holder (manager-verb cases with
// Options.NetPool): a child of the process that called Setup, with the
// verbs' environment (so it carries the case's tag, and the case's teardown
// kills it with the VMMs; both namespaces and everything in them go with
// it).
type caseNet struct {
	cmd     *exec.Cmd
	holder  int
	wrapper string
}

var (
	_ manager.GuestNet    = (*Adapter)(nil)
	_ manager.GuestDialer = (*Adapter)(nil)
)

// GuestNet: cocoon's VMs get a CNI NIC the harness reaches (inside the
// VM's netns) when this host has the plugins and root (NetPreflight) and
// the binary takes per-run CNI dirs; GuestNetReason says what is missing
// otherwise.
func (a *Adapter) GuestNet() bool { return a.GuestNetReason() == "" }

// GuestNetReason is "" when the adapter can give a guest a NIC on this
// host, else the reason naming what is missing: the preflight's, or the
// binary's missing cni-dirs row (a binary whose help cannot be read is
// judged by its verbs, not here).
func (a *Adapter) GuestNetReason() string {
	if why, _ := NetPreflight(NetPluginDir); why != "" {
		return why
	}
	if cli := a.CLI(context.Background()); cli.Err() == nil {
		if ok, why := cli.Caps.Supports(manager.FeatureCNIDirs); !ok {
			return why
		}
	}
	return ""
}

// DialGuest connects to a guest from inside its VM's netns (the adapter's
// net holder's mount namespace); without one, from the caller's.
func (a *Adapter) DialGuest(ctx context.Context, network, addr string) (net.Conn, error) {
	if a.net == nil {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	return NetnsDialer(a.net.holder, a.VMs)(ctx, network, addr)
}

// HarnessPIDs are the adapter's own processes that carry the case's tag
// (its net holder): neither a verb nor a VMM.
func (a *Adapter) HarnessPIDs() []int {
	if a.net == nil {
		return nil
	}
	return []int{a.net.holder}
}

// setupNet starts the case's net holder, writes the wrapper every verb of
// the case then runs as, and the conflist over Options.NetPool. A host
// without the plugins or root is refused with the preflight's reason: never
// a silent --nics 0.
func (a *Adapter) setupNet(ctx context.Context) error {
	if why := a.GuestNetReason(); why != "" {
		return fmt.Errorf("cocoon networking: %s", why)
	}
	argv, err := HolderArgv()
	if err != nil {
		return err
	}
	log, err := os.Create(filepath.Join(a.opts.Dir, "cocoon-net.log"))
	if err != nil {
		return fmt.Errorf("cocoon network holder: %w", err)
	}
	defer log.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = a.Env(), a.opts.Dir, log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cocoon network holder: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	n := &caseNet{cmd: cmd}
	deadline := time.NewTimer(10 * time.Second) // a safety net: the holder is up in milliseconds
	defer deadline.Stop()
	for n.holder = HolderReady(cmd.Process.Pid); n.holder == 0; n.holder = HolderReady(cmd.Process.Pid) {
		select {
		case <-exited:
			b, _ := os.ReadFile(log.Name())
			return fmt.Errorf("cocoon network holder exited: %s", strings.TrimSpace(string(b)))
		case <-deadline.C:
			_ = cmd.Process.Kill()
			return fmt.Errorf("cocoon network holder did not come up in 10s")
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	n.wrapper = filepath.Join(a.opts.Dir, "cocoon-in-ns")
	if err := WriteWrapper(n.wrapper, n.holder, a.opts.Bin, filepath.Base(a.opts.Dir)); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	if err := WriteCNIConf(a.opts.Dir, a.opts.NetPool, NetPluginDir); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	a.net = n
	return nil
}
