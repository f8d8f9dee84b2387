package injector

import "context"

// FaultNetLoss drops NetLoss of the packets on the path between the node
// and the case's OCI registry, each way (tc netem loss on both ends of the
// veth pair; where the kernel has no netem, an nftables numgen rule drops
// the same share), healed Fault.StopFor later (0: it stays lossy).
const FaultNetLoss = "net-loss"

// NetLoss is net-loss's share of packets dropped, each way: enough that
// TCP's retransmissions (200 ms at least each) make some of the agent's
// registry requests run past their deadline, not so much that none ends.
var NetLoss = Netem{LossPct: 30}

type netLoss struct{ kindBase }

func (netLoss) Name() string { return FaultNetLoss }
func (netLoss) Describe() string {
	return "a share of the packets between the node's namespace and the OCI registry dropped (tc netem loss, or an nftables numgen rule), both ways; healed after StopFor (0: it stays)"
}
func (netLoss) Available(h Host) error { return impairAvailable(FaultNetLoss, h, NetLoss) }
func (netLoss) Landed() string {
	return "the loss was in (Impair returned) while the agent was parked at (or had last reached) the intended phase of its push or pull"
}
func (netLoss) traits() traits { return traits{unit: true, link: true} }
func (netLoss) Inject(ctx context.Context, t Target) (int64, error) {
	return injectImpair(ctx, FaultNetLoss, t, NetLoss)
}
func (netLoss) afterSignal(in *Injector, f Fault, _ Proc, actualNs int64) {
	healLinkLater(in, f, actualNs)
}
