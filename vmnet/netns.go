package vmnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/durable"
)

// Netns is a named network namespace the harness owns (the `ip netns` kind,
// bound at /run/netns/<name>), holding the TAP devices its guests attach to.
// Nothing of it is visible in the host namespace, and Close removes it whole:
// deleting the namespace destroys every device inside it.
type Netns struct {
	Name string

	mu     sync.Mutex
	taps   []string
	closed bool
	// borrowed: opened by name (OpenNetns), owned by someone else; Close
	// leaves it alone.
	borrowed bool
	// path is the namespace file when it is not /run/netns/<Name>
	// (OpenNetnsPath).
	path string
}

// netnsRun is where iproute2 binds named namespaces.
const netnsRun = "/run/netns"

// ipTimeout bounds each `ip` call; they are instant unless the system is wedged.
const ipTimeout = 30 * time.Second

// Compiled on first use, not at init: vmctl imports vmnet and is exec'd
// dozens of times a case, most of them without a namespace to name.
var (
	netnsNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`) })
	ifNameRE    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$`) }) // IFNAMSIZ-1
)

// NewNetns creates the network namespace name with its loopback up. It
// refuses a name that already exists, so it never adopts (and later deletes)
// someone else's namespace. Needs root (CAP_SYS_ADMIN).
func NewNetns(name string) (*Netns, error) {
	if !netnsNameRE().MatchString(name) {
		return nil, fmt.Errorf("netns %q: want [A-Za-z0-9_.-], at most 64", name)
	}
	if _, err := os.Stat(filepath.Join(netnsRun, name)); err == nil {
		return nil, fmt.Errorf("netns %s: already exists (%s); refusing to take over a namespace this run did not create", name, filepath.Join(netnsRun, name))
	}
	if err := ip("netns", "add", name); err != nil {
		return nil, fmt.Errorf("netns %s: create: %w", name, err)
	}
	ns := &Netns{Name: name}
	// The guest's services and a harness dialing 127.0.0.1 inside the
	// namespace need loopback; a fresh namespace has it down.
	if err := ip("-n", name, "link", "set", "lo", "up"); err != nil {
		_ = ns.Close()
		return nil, fmt.Errorf("netns %s: loopback up: %w", name, err)
	}
	return ns, nil
}

// OpenNetns returns an existing namespace by name without taking ownership:
// DialContext, Listen, Do and Command work, Close does nothing. It is how a
// short-lived process (vmctl's vm exec) reaches guests in the namespace the
// harness created. Entering it needs CAP_SYS_ADMIN.
func OpenNetns(name string) (*Netns, error) {
	if !netnsNameRE().MatchString(name) {
		return nil, fmt.Errorf("netns %q: want [A-Za-z0-9_.-], at most 64", name)
	}
	if _, err := os.Stat(filepath.Join(netnsRun, name)); err != nil {
		return nil, fmt.Errorf("netns %s: %w", name, err)
	}
	return &Netns{Name: name, borrowed: true}, nil
}

// OpenNetnsPath is OpenNetns for a namespace bound somewhere else than
// /run/netns: a file that names a network namespace, such as a named netns
// inside another mount namespace, reached through /proc/PID/root (cocoon's
// per-VM netns under the private /run/netns of a case, scenarios/stack
// cocoonnet.go). Borrowed: Close does nothing; Command enters it with
// nsenter --net.
func OpenNetnsPath(path string) (*Netns, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("netns %s: %w", path, err)
	}
	return &Netns{Name: filepath.Base(path), borrowed: true, path: path}, nil
}

// file is the namespace's bind-mounted file.
func (n *Netns) file() string {
	if n.path != "" {
		return n.path
	}
	return filepath.Join(netnsRun, n.Name)
}

// AddTap creates a persistent TAP device inside the namespace, gives it
// hostCIDR (e.g. 192.168.249.1/24; empty → no address, as when CH's own
// --net ip=,mask= sets it) and brings it up.
func (n *Netns) AddTap(name, hostCIDR string) error {
	if !ifNameRE().MatchString(name) {
		return fmt.Errorf("netns %s: tap %q: want an interface name of at most 15 characters", n.Name, name)
	}
	if hostCIDR != "" {
		if _, _, err := net.ParseCIDR(hostCIDR); err != nil {
			return fmt.Errorf("netns %s: tap %s: address %q: %w", n.Name, name, hostCIDR, err)
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return fmt.Errorf("netns %s: closed", n.Name)
	}
	if n.borrowed {
		return fmt.Errorf("netns %s: opened by name, not owned: refusing to add a tap Close would not remove", n.Name)
	}
	if err := ip("-n", n.Name, "tuntap", "add", "dev", name, "mode", "tap"); err != nil {
		return fmt.Errorf("netns %s: tap %s: create: %w", n.Name, name, err)
	}
	n.taps = append(n.taps, name)
	if hostCIDR != "" {
		if err := ip("-n", n.Name, "addr", "add", hostCIDR, "dev", name); err != nil {
			return fmt.Errorf("netns %s: tap %s: address %s: %w", n.Name, name, hostCIDR, err)
		}
	}
	if err := ip("-n", n.Name, "link", "set", name, "up"); err != nil {
		return fmt.Errorf("netns %s: tap %s: up: %w", n.Name, name, err)
	}
	return nil
}

// Taps returns the TAP devices created so far.
func (n *Netns) Taps() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.taps...)
}

// Close deletes the TAP devices and the namespace. Stop every VMM running
// inside first: a process still in the namespace keeps it (and its devices)
// alive after the name is gone. Calling Close twice is fine.
func (n *Netns) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.borrowed {
		return nil
	}
	var errs []error
	for _, t := range n.taps {
		// Persistent taps die with the namespace anyway; deleting them first
		// makes a namespace pinned by a stray process still lose them.
		if err := ip("-n", n.Name, "link", "del", t); err != nil {
			errs = append(errs, fmt.Errorf("tap %s: %w", t, err))
		}
	}
	if err := ip("netns", "del", n.Name); err != nil {
		errs = append(errs, fmt.Errorf("delete: %w", err))
	} else {
		n.closed = true
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("netns %s: close: %w", n.Name, err)
	}
	return nil
}

// Command returns a command that runs bin inside the namespace. `ip netns
// exec` execs bin in place, so the command's pid is bin's pid and its argv[0]
// is bin (what vmctl's "is this our cloud-hypervisor" check reads).
func (n *Netns) Command(ctx context.Context, bin string, args ...string) *exec.Cmd {
	if n.path != "" {
		// not under /run/netns, where `ip netns exec` looks
		return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.path, "--", bin}, args...)...)
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, bin}, args...)...)
}

// Do runs f on an OS thread that has entered the namespace; sockets f creates
// live in the namespace for good. The thread is discarded if it cannot be
// switched back, so no other goroutine ever runs inside the namespace.
func (n *Netns) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread on a failed switch back: a goroutine that exits
		// locked takes its thread with it.
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns %s: own namespace: %w", n.Name, err)
			return
		}
		defer orig.Close()
		target, err := os.Open(n.file())
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns %s: open: %w", n.Name, err)
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns %s: enter: %w", n.Name, err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("netns %s: leave: %w", n.Name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// DialContext connects from inside the namespace, the way the ledger reaches
// a guest on a TAP the host namespace cannot see. addr must be a literal
// IP:port (a name lookup would run outside the namespace).
func (n *Netns) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns %s: dial %s: %w", n.Name, addr, err)
	}
	return c, nil
}

// Listen opens a listener inside the namespace.
func (n *Netns) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns %s: listen %s: %w", n.Name, addr, err)
	}
	return l, nil
}

// ip runs one iproute2 command and folds its stderr into the error.
func ip(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), ipTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// WriteCHWrapper writes dir/cloud-hypervisor, a script that runs chBinary
// inside this namespace (`exec ip netns exec`). A manager pointed at it
// (vmctl --ch-binary) starts every VMM next to its TAP devices; because each
// step execs in place, the VMM keeps the pid the manager recorded, and its
// argv[0] basename is still cloud-hypervisor.
func (n *Netns) WriteCHWrapper(dir, chBinary string) (string, error) {
	abs, err := filepath.Abs(chBinary)
	if err != nil {
		return "", fmt.Errorf("netns %s: wrapper: %w", n.Name, err)
	}
	if strings.ContainsAny(abs, "'\n") {
		return "", fmt.Errorf("netns %s: wrapper: path %q cannot be quoted", n.Name, abs)
	}
	ipBin, err := exec.LookPath("ip")
	if err != nil {
		return "", fmt.Errorf("netns %s: wrapper: %w", n.Name, err)
	}
	p := filepath.Join(dir, chName)
	script := fmt.Sprintf("#!/bin/sh\n# vmchaos: run cloud-hypervisor inside network namespace %s\nexec '%s' netns exec '%s' '%s' \"$@\"\n", n.Name, ipBin, n.Name, abs)
	if err := durable.WriteFile(p, []byte(script), 0o755); err != nil {
		return "", fmt.Errorf("netns %s: wrapper: %w", n.Name, err)
	}
	return p, nil
}

// Path is the namespace's file (/run/netns/<name>): what nsenter --net and
// setns open.
func (n *Netns) Path() string { return filepath.Join(netnsRun, n.Name) }

// AddVeth links this namespace to peer by a veth pair created inside them:
// name here with cidr, peerName in peer with peerCIDR, both up. The pair is
// created in this namespace and its peer end born in peer (`ip link add ...
// peer ... netns`), so no end ever appears in the host namespace; deleting
// either namespace destroys the pair.
func (n *Netns) AddVeth(name, cidr string, peer *Netns, peerName, peerCIDR string) error {
	for _, nm := range []string{name, peerName} {
		if !ifNameRE().MatchString(nm) {
			return fmt.Errorf("netns %s: veth %q: want an interface name of at most 15 characters", n.Name, nm)
		}
	}
	for _, c := range []string{cidr, peerCIDR} {
		if _, _, err := net.ParseCIDR(c); err != nil {
			return fmt.Errorf("netns %s: veth %s: address %q: %w", n.Name, name, c, err)
		}
	}
	if n.borrowed || peer.borrowed {
		return fmt.Errorf("netns %s: veth %s: both namespaces must be owned by this run", n.Name, name)
	}
	if err := ip("-n", n.Name, "link", "add", name, "type", "veth", "peer", "name", peerName, "netns", peer.Name); err != nil {
		return fmt.Errorf("netns %s: veth %s: create: %w", n.Name, name, err)
	}
	for _, s := range []struct{ ns, dev, cidr string }{{n.Name, name, cidr}, {peer.Name, peerName, peerCIDR}} {
		if err := ip("-n", s.ns, "addr", "add", s.cidr, "dev", s.dev); err != nil {
			return fmt.Errorf("netns %s: veth %s: address %s: %w", s.ns, s.dev, s.cidr, err)
		}
		if err := ip("-n", s.ns, "link", "set", s.dev, "up"); err != nil {
			return fmt.Errorf("netns %s: veth %s: up: %w", s.ns, s.dev, err)
		}
	}
	return nil
}
