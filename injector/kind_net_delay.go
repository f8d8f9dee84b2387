package injector

import (
	"context"
	"time"
)

// FaultNetDelay delays every packet on the path between the node and the
// case's OCI registry by NetDelay each way (tc netem on both ends of the
// veth pair), healed Fault.StopFor later (0: it stays slow).
const FaultNetDelay = "net-delay"

// NetDelay is net-delay's delay, each way: a round trip grows by twice it.
// Not scaled: it is the network's, not a simulated duration; at time scale
// 0.05 the agent's registry requests time out after 0.5 s, so a push of a
// few blobs (a handful of round trips each) runs past its deadline.
var NetDelay = Netem{Delay: 100 * time.Millisecond}

type netDelay struct{ kindBase }

func (netDelay) Name() string { return FaultNetDelay }
func (netDelay) Describe() string {
	return "every packet between the node's namespace and the OCI registry delayed (tc netem delay, both ways); healed after StopFor (0: it stays)"
}
func (netDelay) Available(h Host) error { return impairAvailable(FaultNetDelay, h, NetDelay) }
func (netDelay) Landed() string {
	return "the netem qdiscs were in (Impair returned) while the agent was parked at (or had last reached) the intended phase of its push or pull"
}
func (netDelay) traits() traits { return traits{unit: true, link: true} }
func (netDelay) Inject(ctx context.Context, t Target) (int64, error) {
	return injectImpair(ctx, FaultNetDelay, t, NetDelay)
}
func (netDelay) afterSignal(in *Injector, f Fault, _ Proc, actualNs int64) {
	healLinkLater(in, f, actualNs)
}
