package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/vmnet"
)

// cocoon's VMs get real networking (issue 32 item 3): cocoon's own CNI
// provider runs the plugins of the Debian package containernetworking-plugins
// with a conflist the case writes. Every cocoon of the case (the harness's
// and the agent's children) runs inside one network and mount namespace the
// case creates (the "net holder"): the bridge and the veths' host ends live
// in that network namespace, never the host's, and the named netns cocoon
// makes per VM (/var/run/netns/cocoon-<ID>, network/cni/config.go) live in
// that mount namespace's own /var/run/netns. That private dir matters: cocoon's
// gc deletes every cocoon-* netns its own store does not know
// (network/cni/gc.go), so two cases sharing the host's /var/run/netns would
// delete each other's. The guest answers SSH at the address IPAM gave it,
// inside its VM's netns (fakech on a TAP-only NIC, docs/fakech.md), where
// the harness dials it (cocoonDial).

// CNIPluginDir is where containernetworking-plugins installs the plugins
// (a variable for the preflight's tests).
var CNIPluginDir = "/usr/lib/cni"

// CNIPackage is the Debian package that provides them.
const CNIPackage = "containernetworking-plugins"

// CNIPlugins are the plugins the case's conflist runs.
var CNIPlugins = []string{"bridge", "host-local"}

// cniNetworkName is the conflist's name (cocoon records it as the VM's
// config.network).
const cniNetworkName = "vmchaos"

// CocoonNetPreflight says why this host cannot give cocoon's VMs their
// NICs ("" = it can) and whether what is missing is a capability (root)
// rather than a package.
func CocoonNetPreflight() (reason string, capability bool) {
	if os.Geteuid() != 0 {
		return "cocoon's CNI networking needs root (network namespaces, a bridge, TAP devices)", true
	}
	for _, p := range CNIPlugins {
		if _, err := os.Stat(filepath.Join(CNIPluginDir, p)); err != nil {
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

// cocoonNet is the case's network for cocoon: the holder of its network
// and mount namespace, and the wrapper every cocoon of the case runs as.
type cocoonNet struct {
	unit    string // the holder's unit
	holder  int    // its host pid: /proc/<holder>/root is the private mount view
	wrapper string // <Dir>/cocoon-in-ns: cocoon entered into the holder's namespaces
}

// holderScript runs in the holder's fresh network and mount namespaces
// (propagation private: nothing mounted there reaches the host): a tmpfs of
// its own over /var/run/netns, loopback up, then it only holds them.
const holderScript = `set -e
mkdir -p /var/run/netns
mount -t tmpfs -o mode=0755,size=1m vmchaos-cocoon-netns /var/run/netns
ip link set lo up
exec sleep infinity`

// startCocoonNet starts the case's net holder as a unit of the run's
// supervisor (so it carries the run's tag: `vmchaos doctor --clean` kills
// it after a killed runner, and with it go both namespaces and everything
// in them) and writes the wrapper. The holder must run in the host's pid
// namespace: the wrapper enters it by its pid (`nsenter --target`), which a
// sandbox's units could not see.
func (s *Stack) startCocoonNet(ctx context.Context, realBin string) (*cocoonNet, error) {
	if injector.MountNS(s.run.Sup) != "" {
		return nil, fmt.Errorf("stack: cocoon's networking needs the builtin or systemd supervisor: the sandbox's units cannot enter the case's network namespace by its host pid")
	}
	if strings.ContainsAny(realBin, "'\n") {
		return nil, fmt.Errorf("stack: cocoon binary path %q cannot be quoted", realBin)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return nil, fmt.Errorf("stack: cocoon network: %w", err)
	}
	n := &cocoonNet{unit: strings.TrimSuffix(s.AgentUnit, "-agent") + "-cocoon-net"}
	spec := injector.UnitSpec{Name: n.unit,
		Argv: []string{unshare, "--net", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", holderScript},
		Env:  s.baseEnv(), Dir: s.Dir, RestartSec: time.Second, LogPath: filepath.Join(s.LogDir, "cocoon-net.log")}
	if err := s.run.Sup.Start(ctx, spec); err != nil {
		return nil, fmt.Errorf("stack: cocoon network holder: %w", err)
	}
	s.unitsUp[n.unit] = true
	if n.holder, err = s.waitHolder(ctx, n.unit); err != nil {
		return nil, err
	}
	n.wrapper = filepath.Join(s.Dir, "cocoon-in-ns")
	// exec in place at every step: the agent's child keeps the pid it
	// tracks, and its argv becomes cocoon's own
	script := fmt.Sprintf("#!/bin/sh\n# vmchaos: cocoon inside case %s's network and mount namespace (holder pid %d)\nexec nsenter --target %d --net --mount --wd=\"$PWD\" -- '%s' \"$@\"\n",
		filepath.Base(s.Dir), n.holder, n.holder, realBin)
	if err := durable.WriteFile(n.wrapper, []byte(script), 0o755); err != nil {
		return nil, fmt.Errorf("stack: cocoon wrapper: %w", err)
	}
	return n, nil
}

// waitHolder waits until the holder has set its namespaces up (it execs
// sleep last) and returns its pid.
func (s *Stack) waitHolder(ctx context.Context, unit string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		pid, err := s.run.Sup.MainPID(ctx, unit)
		if err == nil && pid > 0 {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sleep" {
				return pid, nil
			}
		}
		select {
		case <-ctx.Done():
			log, _ := os.ReadFile(filepath.Join(s.LogDir, "cocoon-net.log"))
			return 0, fmt.Errorf("stack: cocoon network holder did not come up: %w: %s", ctx.Err(), strings.TrimSpace(string(log)))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// writeCNIConf writes the case's conflist into the conf dir cocoon reads
// (COCOON_CNI_CONF_DIR, the adapter's) and links the plugins into its bin
// dir (COCOON_CNI_BIN_DIR): a bridge in the holder's network namespace and
// host-local addresses from the case's own loopback /24 (its NetPool, unused
// by cocoon otherwise), state kept in the case dir. A loopback pool because
// the fake guest shares the VMM's network namespace and answers on its lo
// (fakech: only 127.0.0.0/8); the address is still the one cocoon's CNI
// provider got from IPAM and handed the guest in its seed.
func (s *Stack) writeCNIConf() error {
	dir := filepath.Join(s.Dir, "cocoon", "cni")
	conf := map[string]any{
		"cniVersion": "1.0.0", "name": cniNetworkName,
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": "vmchaos0", "isGateway": false, "ipMasq": false,
			"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(dir, "ipam"),
				"ranges": [][]map[string]string{{{"subnet": s.NetPool}}}},
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	if err := durable.WriteFile(filepath.Join(dir, "net.d", "10-vmchaos.conflist"), b, 0o644); err != nil {
		return fmt.Errorf("stack: cni conflist: %w", err)
	}
	for _, p := range CNIPlugins {
		if err := os.Symlink(filepath.Join(CNIPluginDir, p), filepath.Join(dir, "bin", p)); err != nil {
			return fmt.Errorf("stack: cni plugin %s: %w", p, err)
		}
	}
	return nil
}

// cocoonImage is the run's guest image for cocoon, built once: the fake
// guest with the run's key authorized. cocoon's cloud-init seed carries a
// password, never a key (metadata/metadata.go user-data), so the key comes
// with the image, as an embedder bakes it into its cloud image.
func (r *Run) cocoonImage() (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := filepath.Join(r.TmpDir, "cocoon-guest.img")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	if _, err := guestimg.Build(p, guestimg.Options{Hostname: "vmchaos-guest", AuthorizedKeys: []string{r.Key.AuthorizedKey()}}); err != nil {
		return "", fmt.Errorf("stack: cocoon guest image: %w", err)
	}
	return p, nil
}

// cocoonDial connects to a guest of the case from inside its VM's netns:
// the one cocoon's list records for the VM whose guest address is addr,
// reached through the holder's mount namespace (/proc/<holder>/root).
func (s *Stack) cocoonDial(ctx context.Context, network, addr string) (net.Conn, error) {
	vms, err := s.Cocoon.VMs(ctx)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	v, err := vmAt(vms, addr)
	if err != nil {
		return nil, err
	}
	root := "/proc/" + strconv.Itoa(s.cocoonNet.holder) + "/root"
	p, err := inRoot(root, v.Netns)
	if err != nil {
		return nil, fmt.Errorf("dial %s (vm %s): %w", addr, v.ID, err)
	}
	ns, err := vmnet.OpenNetnsPath(p)
	if err != nil {
		return nil, fmt.Errorf("dial %s (vm %s): %w", addr, v.ID, err)
	}
	return ns.DialContext(ctx, network, addr)
}

// inRoot is path as a process whose root is root sees it, as a path under
// root: every symlink on the way is resolved inside root. The kernel does
// not: an absolute link under /proc/PID/root (/var/run → /run) would lead
// back to the caller's own tree, where the case's private /run/netns is not.
func inRoot(root, path string) (string, error) {
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

// CocoonVerbs are the cocoon verbs in flight among procs (the checker's
// Input.InFlight: cocoon has no per-VM ops lock, so "no verb runs" is how a
// poll knows nothing owns a creating record): every stage of one, the
// wrapper's shell, nsenter and cocoon itself; not the agent's event stream
// (`vm status --event`, long-running), not the harness's own reads (its
// children).
func (s *Stack) CocoonVerbs(procs []Proc) []Proc {
	if s.opts.Cocoon == nil || s.cocoonNet == nil {
		return nil
	}
	self := os.Getpid()
	var out []Proc
	for _, p := range procs {
		if p.PPID == self || !slices.ContainsFunc(p.Argv, func(a string) bool { return a == s.opts.Cocoon.Bin || a == s.cocoonNet.wrapper }) {
			continue
		}
		if slices.Contains(p.Argv, "--event") {
			continue // the event stream
		}
		out = append(out, p)
	}
	return out
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
