package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/lazyfs"
	"github.com/vmchaos/vmchaos/vmnet"
)

// The network path of a net-fault case (Options.NetPath): the node's
// processes that talk to the registry (the agent, and with it its vmctl
// children and the VMMs they start) run in a node namespace, the registry in
// a registry namespace, and a veth pair links them on addresses that exist
// only inside the two (the same ones in every case: no two cases share a
// namespace). Nothing of it touches the host namespace's interfaces, and the
// rules that cut or impair the path live inside the namespaces too.
const (
	netNodeDev  = "vnode"
	netRegDev   = "vreg"
	netNodeCIDR = "10.77.0.1/30"
	netRegCIDR  = "10.77.0.2/30"
	netRegIP    = "10.77.0.2"
	// NetRegistryAddr is where the registry listens inside its namespace.
	NetRegistryAddr = netRegIP + ":5000"
	// nftTable holds the fault's rules in the node namespace: deleting it
	// is the heal.
	nftTable = "vmchaos_net"
)

// cmdTimeout bounds one nft, iptables or tc call: instant unless the system
// is wedged.
const cmdTimeout = 10 * time.Second

// NetPath is the node's path to the registry (injector.Link): Partition
// drops its packets in the node namespace (nftables, or iptables where nft
// is unusable), Impair puts tc netem on both ends of the veth pair (loss
// falls back on an nftables numgen rule where the kernel has no netem), Heal
// takes either away and stamps the moment.
type NetPath struct {
	Node, Reg *vmnet.Netns
	// NodeFile and RegFile are the namespaces bound under the case's dir:
	// a unit enters them by `nsenter --net=FILE` in whatever mount
	// namespace its supervisor starts it (a sandbox has a private /run,
	// where /run/netns is not the host's).
	NodeFile, RegFile string

	nss      []string // mount namespaces the files are attached in (a sandbox's)
	bound    []string // files bind-mounted here
	nftErr   error    // why nft cannot run in the node namespace (nil: it can)
	netemErr error    // why tc netem cannot run (nil: it can)

	mu       sync.Mutex
	state    string // "": healthy; "nft", "iptables", "netem": what Heal undoes
	healedNs int64
	healErr  error
}

// NetNames are the namespace names of case n of a run whose temp dir is
// tmp: the run's unique name, so `doctor --clean` recognises them.
func NetNames(tmp string, n int) (node, reg string) {
	b := filepath.Base(tmp)
	return fmt.Sprintf("%s-c%d-node", b, n), fmt.Sprintf("%s-c%d-reg", b, n)
}

// newNetPath creates both namespaces, the veth pair, and the files units
// enter them by (attached in each mount namespace of nss), and probes what
// this kernel can impose.
func newNetPath(dir, node, reg string, nss []string) (p *NetPath, err error) {
	p = &NetPath{}
	defer func() {
		if err != nil {
			_ = p.Close()
			p = nil
		}
	}()
	if p.Node, err = vmnet.NewNetns(node); err != nil {
		return p, err
	}
	if p.Reg, err = vmnet.NewNetns(reg); err != nil {
		return p, err
	}
	if err = p.Node.AddVeth(netNodeDev, netNodeCIDR, p.Reg, netRegDev, netRegCIDR); err != nil {
		return p, err
	}
	if err = os.MkdirAll(dir, 0o755); err != nil {
		return p, fmt.Errorf("net path: %w", err)
	}
	p.NodeFile, p.RegFile = filepath.Join(dir, "node"), filepath.Join(dir, "reg")
	for _, b := range []struct {
		ns   *vmnet.Netns
		file string
	}{{p.Node, p.NodeFile}, {p.Reg, p.RegFile}} {
		if err = p.bind(b.ns.Path(), b.file, nss); err != nil {
			return p, err
		}
	}
	p.nftErr = p.run(context.Background(), p.Node, nil, "nft", "list", "tables")
	p.netemErr = p.probeNetem()
	return p, nil
}

// bind mounts the namespace file src at file and attaches it in each mount
// namespace of nss.
func (p *NetPath) bind(src, file string, nss []string) error {
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		return fmt.Errorf("net path: %w", err)
	}
	if err := unix.Mount(src, file, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("net path: bind %s at %s: %w", src, file, err)
	}
	p.bound = append(p.bound, file)
	for _, ns := range nss {
		if err := lazyfs.AttachIn(file, ns); err != nil {
			return fmt.Errorf("net path: attach %s in %s: %w", file, ns, err)
		}
		if !containsStr(p.nss, ns) {
			p.nss = append(p.nss, ns)
		}
	}
	return nil
}

func containsStr(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// probeNetem puts a netem qdisc on the node's end and takes it away: a
// kernel without sch_netem refuses it ("Specified qdisc kind is unknown").
func (p *NetPath) probeNetem() error {
	ctx := context.Background()
	if err := p.run(ctx, p.Node, nil, "tc", "qdisc", "add", "dev", netNodeDev, "root", "netem", "delay", "0ms"); err != nil {
		return fmt.Errorf("tc netem unavailable in this kernel (sch_netem): %w", err)
	}
	return p.run(ctx, p.Node, nil, "tc", "qdisc", "del", "dev", netNodeDev, "root")
}

// run runs argv inside ns (nsenter --net: no mount namespace of its own,
// unlike `ip netns exec`), stdin fed from in.
func (p *NetPath) run(ctx context.Context, ns *vmnet.Netns, in []byte, argv ...string) error {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, nsenterPath, append([]string{"--net=" + ns.Path(), "--"}, argv...)...)
	if in != nil {
		cmd.Stdin = bytes.NewReader(in)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("netns %s: %s: %w: %s", ns.Name, strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// nsenterPath is util-linux's nsenter.
const nsenterPath = "/usr/bin/nsenter"

// nftRules is the table of a fault: verdict is the statement each packet to
// or from the registry meets ("drop", or "numgen random mod 100 < 30 drop").
func nftRules(verdict string) []byte {
	return fmt.Appendf(nil, `table inet %[1]s {
	chain out { type filter hook output priority 0; policy accept; ip daddr %[2]s %[3]s; }
	chain in { type filter hook input priority 0; policy accept; ip saddr %[2]s %[3]s; }
}
`, nftTable, netRegIP, verdict)
}

// Partition drops every packet between the node and the registry.
func (p *NetPath) Partition(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != "" {
		return fmt.Errorf("net path: partition: already %s", p.state)
	}
	if p.nftErr == nil {
		if err := p.run(ctx, p.Node, nftRules("drop"), "nft", "-f", "-"); err != nil {
			return fmt.Errorf("net path: partition: %w", err)
		}
		p.state = "nft"
		return nil
	}
	for _, r := range iptablesRules("-I") {
		if err := p.run(ctx, p.Node, nil, r...); err != nil {
			return fmt.Errorf("net path: partition (nft unusable: %v): %w", p.nftErr, err)
		}
	}
	p.state = "iptables"
	return nil
}

// iptablesRules are the partition as iptables commands (op -I adds, -D removes).
func iptablesRules(op string) [][]string {
	return [][]string{{"iptables", op, "OUTPUT", "-d", netRegIP, "-j", "DROP"},
		{"iptables", op, "INPUT", "-s", netRegIP, "-j", "DROP"}}
}

// Supports says whether Impair(n) can run on this kernel.
func (p *NetPath) Supports(n injector.Netem) error {
	if p.netemErr == nil {
		return nil
	}
	if n.Delay == 0 && n.LossPct > 0 && p.nftErr == nil {
		return nil // the nftables numgen rule stands in for netem loss
	}
	return p.netemErr
}

// Impair puts n on both ends of the pair, or, for a loss where the kernel
// has no netem, drops the same share by an nftables numgen rule.
func (p *NetPath) Impair(ctx context.Context, n injector.Netem) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != "" {
		return fmt.Errorf("net path: impair: already %s", p.state)
	}
	if p.netemErr != nil {
		if err := p.Supports(n); err != nil {
			return fmt.Errorf("net path: impair %s: %w", n, err)
		}
		if err := p.run(ctx, p.Node, nftRules(fmt.Sprintf("numgen random mod 100 < %d drop", n.LossPct)), "nft", "-f", "-"); err != nil {
			return fmt.Errorf("net path: impair %s: %w", n, err)
		}
		p.state = "nft"
		return nil
	}
	args := strings.Fields(n.String())
	p.state = "netem" // a half-applied impairment is healed whole
	for _, end := range []struct {
		ns  *vmnet.Netns
		dev string
	}{{p.Node, netNodeDev}, {p.Reg, netRegDev}} {
		if err := p.run(ctx, end.ns, nil, append([]string{"tc", "qdisc", "replace", "dev", end.dev, "root", "netem"}, args...)...); err != nil {
			return fmt.Errorf("net path: impair %s: %w", n, err)
		}
	}
	return nil
}

// Heal takes the fault's rules or qdiscs away and stamps the moment.
func (p *NetPath) Heal(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var err error
	switch p.state {
	case "nft":
		err = p.run(ctx, p.Node, nil, "nft", "delete", "table", "inet", nftTable)
	case "iptables":
		for _, r := range iptablesRules("-D") {
			err = errors.Join(err, p.run(ctx, p.Node, nil, r...))
		}
	case "netem":
		err = errors.Join(p.run(ctx, p.Node, nil, "tc", "qdisc", "del", "dev", netNodeDev, "root"),
			p.run(ctx, p.Reg, nil, "tc", "qdisc", "del", "dev", netRegDev, "root"))
	}
	if err != nil {
		p.healErr = fmt.Errorf("net path: heal %s: %w", p.state, err)
		return p.healErr
	}
	p.state, p.healedNs, p.healErr = "", failpoint.Now(), nil
	return nil
}

// Healed is the time of the last heal once the path is whole (0 while a
// fault is in or none was healed), and the last heal's error.
func (p *NetPath) Healed() (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != "" {
		return 0, p.healErr
	}
	return p.healedNs, p.healErr
}

// DialNode connects from inside the node namespace (the agent's metrics,
// the fake guests' loopback SSH: the node's processes listen there).
func (p *NetPath) DialNode(ctx context.Context, network, addr string) (net.Conn, error) {
	return p.Node.DialContext(ctx, network, addr)
}

// RegistryClient is an HTTP client that reaches the registry from inside
// its own namespace: the harness reads the registry past any fault on the
// node's path.
func (p *NetPath) RegistryClient(timeout time.Duration) *http.Client {
	tr := &http.Transport{DialContext: p.Reg.DialContext, DisableKeepAlives: true}
	return &http.Client{Transport: tr, Timeout: timeout}
}

// Wrap is argv run inside the namespace bound at file.
func Wrap(file string, argv []string) []string {
	return append([]string{nsenterPath, "--net=" + file, "--"}, argv...)
}

// Close detaches and unmounts the files and deletes both namespaces (the
// veth pair with them). Stop every process inside first.
func (p *NetPath) Close() error {
	var errs []error
	for _, f := range p.bound {
		for _, ns := range p.nss {
			if err := lazyfs.DetachIn(f, ns); err != nil {
				errs = append(errs, err)
			}
		}
		if err := unix.Unmount(f, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("net path: unmount %s: %w", f, err))
		}
	}
	p.bound, p.nss = nil, nil
	for _, ns := range []*vmnet.Netns{p.Node, p.Reg} {
		if ns != nil {
			if err := ns.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// startNet creates the case's net path (recorded first: a runner killed
// from here on leaves namespaces `doctor --clean` removes) and points the
// ledger's dials at the node namespace, where the fake guests listen.
func (s *Stack) startNet(n int) error {
	node, reg := NetNames(s.run.TmpDir, n)
	if err := injector.RecordPaths(s.run.Sup, nil, []string{node, reg}); err != nil {
		return fmt.Errorf("stack: net path: %w", err)
	}
	var nss []string
	if ns := injector.MountNS(s.run.Sup); ns != "" {
		nss = append(nss, ns)
	}
	p, err := newNetPath(filepath.Join(s.Dir, "netns"), node, reg, nss)
	if err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	s.Net = p
	s.Ledger.Dial = p.DialNode
	return nil
}

// closeNet removes the net path (after every process in it is gone).
func (s *Stack) closeNet() error {
	if s.Net == nil || s.netShared {
		s.Net = nil
		return nil
	}
	err := s.Net.Close()
	s.Net = nil
	return err
}

// RegistryClient is the harness's HTTP client for the registry: through
// the registry's namespace when the case has a net path, else a plain one.
func (s *Stack) RegistryClient(timeout time.Duration) *http.Client {
	if s.Net != nil {
		return s.Net.RegistryClient(timeout)
	}
	return &http.Client{Timeout: timeout}
}

// MetricsDial is how the harness reaches the agent's metrics listener: nil
// (a plain dial) unless the agent runs in the node namespace.
func (s *Stack) MetricsDial() func(ctx context.Context, network, addr string) (net.Conn, error) {
	if s.Net != nil {
		return s.Net.DialNode
	}
	return nil
}
