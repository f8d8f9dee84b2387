package stack

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/manager/cocoon"
)

// cocoon's VMs get real networking (issue 32 item 3): the mechanism (the
// holder of the case's network and mount namespace, the wrapper, the
// conflist, the dial inside a VM's netns) is manager/cocoon's net.go, shared
// with the manager-verb cases; here the holder is a unit of the run's
// supervisor and the agent's children run as the wrapper.

// CNIPluginDir is where containernetworking-plugins installs the plugins
// (a variable for the preflight's tests).
var CNIPluginDir = cocoon.CNIPluginDir

// CNIPackage is the Debian package that provides them.
const CNIPackage = cocoon.CNIPackage

// CNIPlugins are the plugins the case's conflist runs.
var CNIPlugins = cocoon.CNIPlugins

// CocoonNetPreflight says why this host cannot give cocoon's VMs their
// NICs ("" = it can) and whether what is missing is a capability (root)
// rather than a package.
func CocoonNetPreflight() (reason string, capability bool) {
	return cocoon.NetPreflight(CNIPluginDir)
}

// cocoonNet is the case's network for cocoon: the holder of its network
// and mount namespace, and the wrapper every cocoon of the case runs as.
type cocoonNet struct {
	unit    string // the holder's unit
	holder  int    // its host pid: /proc/<holder>/root is the private mount view
	wrapper string // <Dir>/cocoon-in-ns: cocoon entered into the holder's namespaces
}

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
	argv, err := cocoon.HolderArgv()
	if err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	n := &cocoonNet{unit: strings.TrimSuffix(s.AgentUnit, "-agent") + "-cocoon-net"}
	spec := injector.UnitSpec{Name: n.unit,
		Argv: argv,
		Env:  s.baseEnv(), Dir: s.Dir, RestartSec: time.Second, LogPath: filepath.Join(s.LogDir, "cocoon-net.log")}
	if err := s.run.Sup.Start(ctx, spec); err != nil {
		return nil, fmt.Errorf("stack: cocoon network holder: %w", err)
	}
	s.unitsUp[n.unit] = true
	if n.holder, err = s.waitHolder(ctx, n.unit); err != nil {
		return nil, err
	}
	n.wrapper = filepath.Join(s.Dir, "cocoon-in-ns")
	if err := cocoon.WriteWrapper(n.wrapper, n.holder, realBin, filepath.Base(s.Dir)); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
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
		if err == nil && cocoon.HolderReady(pid) > 0 {
			return pid, nil
		}
		select {
		case <-ctx.Done():
			log, _ := os.ReadFile(filepath.Join(s.LogDir, "cocoon-net.log"))
			return 0, fmt.Errorf("stack: cocoon network holder did not come up: %w: %s", ctx.Err(), strings.TrimSpace(string(log)))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// writeCNIConf writes the case's conflist over its own loopback /24 (its
// NetPool) into the conf dir cocoon reads (cocoon.WriteCNIConf).
func (s *Stack) writeCNIConf() error {
	if err := cocoon.WriteCNIConf(filepath.Join(s.Dir, "cocoon"), s.NetPool, CNIPluginDir); err != nil {
		return fmt.Errorf("stack: %w", err)
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

// cocoonDial connects to a guest of the case from inside its VM's netns
// (cocoon.NetnsDialer through the holder's mount namespace).
func (s *Stack) cocoonDial(ctx context.Context, network, addr string) (net.Conn, error) {
	return cocoon.NetnsDialer(s.cocoonNet.holder, s.Cocoon.VMs)(ctx, network, addr)
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
