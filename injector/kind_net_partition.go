package injector

import (
	"context"
	"fmt"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// FaultNetPartition cuts the network path between the node and the case's
// OCI registry: every packet between them is dropped (nftables, or
// iptables where nft is unusable, inside the node's network namespace), so
// a connection in flight stalls and a new one never completes, until the
// injector heals it Fault.StopFor later (0: it stays cut). No process is
// touched: the registry runs on, unreachable.
const FaultNetPartition = "net-partition"

// Link is the network path between a node and its registry that the harness
// can cut or impair: a veth pair between two network namespaces the case
// created (scenarios/stack, NetPath). It is declared here, as Disk is, so
// that the kinds sit in FaultKinds while the namespaces stay the stack's;
// the runner hands it over in Options.Link.
type Link interface {
	// Partition drops every packet between the node and the registry.
	Partition(ctx context.Context) error
	// Impair delays or drops packets on the path (tc netem).
	Impair(ctx context.Context, n Netem) error
	// Supports is nil where Impair(n) can run here (the kernel has the
	// qdisc), else why not.
	Supports(n Netem) error
	// Heal takes the partition or the impairment away.
	Heal(ctx context.Context) error
}

// Netem is an impairment of the path: a fixed delay added to every packet
// each way, a share of packets lost each way.
type Netem struct {
	Delay   time.Duration
	LossPct int
}

// String is the impairment as netem's arguments.
func (n Netem) String() string {
	s := ""
	if n.Delay > 0 {
		s += fmt.Sprintf("delay %dms", n.Delay.Milliseconds())
	}
	if n.LossPct > 0 {
		if s != "" {
			s += " "
		}
		s += fmt.Sprintf("loss %d%%", n.LossPct)
	}
	return s
}

type netPartition struct{ kindBase }

func (netPartition) Name() string { return FaultNetPartition }
func (netPartition) Describe() string {
	return "the network path between the node's namespace and the OCI registry's cut (nftables drop); healed after StopFor (0: it stays cut)"
}

// Available needs the path between two namespaces of the case: the host's
// own interfaces are not the harness's to cut.
func (netPartition) Available(h Host) error { return linkAvailable(FaultNetPartition, h) }

func (netPartition) Landed() string {
	return "the drop rules were in (Partition returned) while the agent was parked at (or had last reached) the intended phase of its push or pull"
}

// traits: aimed at the registry's unit (the path to it), no process signalled.
func (netPartition) traits() traits { return traits{unit: true, link: true} }

// Inject cuts the path; the stamp is the moment the rules are in.
func (netPartition) Inject(ctx context.Context, t Target) (int64, error) {
	if t.Link == nil {
		return 0, errNoLink(FaultNetPartition)
	}
	err := t.Link.Partition(ctx)
	return failpoint.Now(), err
}

// afterSignal schedules the heal StopFor after the cut.
func (netPartition) afterSignal(in *Injector, f Fault, _ Proc, actualNs int64) {
	healLinkLater(in, f, actualNs)
}

// linkAvailable is where a network kind can run: a Link of the case.
func linkAvailable(name string, h Host) error {
	if h.Link == nil {
		return fmt.Errorf("%s: needs the node and the registry in network namespaces of the case, linked by a veth pair (root)", name)
	}
	return nil
}

// impairAvailable is linkAvailable plus the kernel's netem.
func impairAvailable(name string, h Host, n Netem) error {
	if err := linkAvailable(name, h); err != nil {
		return err
	}
	if err := h.Link.Supports(n); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// injectImpair impairs the target's path; the stamp is the moment the
// qdisc is in.
func injectImpair(ctx context.Context, name string, t Target, n Netem) (int64, error) {
	if t.Link == nil {
		return 0, errNoLink(name)
	}
	err := t.Link.Impair(ctx, n)
	return failpoint.Now(), err
}

// healLinkLater schedules the path's heal StopFor after the fault.
func healLinkLater(in *Injector, f Fault, actualNs int64) {
	if f.StopFor > 0 && in.opt.Link != nil {
		in.healLater(in.opt.Link, actualNs+int64(f.StopFor))
	}
}

func errNoLink(name string) error { return fmt.Errorf("%s: no link in the target", name) }

// OnLink reports whether the kind named name acts on a Link (net-partition,
// net-delay, net-loss): a case with one needs the node's path to the
// registry built for it.
func OnLink(name string) bool {
	k, err := LookupFaultKind(name)
	return err == nil && k.traits().link
}
