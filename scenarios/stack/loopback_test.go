package stack

import (
	"net/netip"
	"testing"
)

// TestLoopbackOfIsEachStacksOwn: every stack of a run has a loopback
// address of its own (the agent's metrics endpoint and the registry listen
// there), inside 127.0.0.0/8, never a guest's: the network address of the
// stack's fake pool, which the pool never hands out.
func TestLoopbackOfIsEachStacksOwn(t *testing.T) {
	fake := &Run{}
	seen := map[string]int{}
	for n := 1; n <= 50*256; n++ {
		a := loopbackOf(n)
		ip, err := netip.ParseAddr(a)
		if err != nil || !ip.IsLoopback() {
			t.Fatalf("loopbackOf(%d) = %q (%v): not a loopback address", n, a, err)
		}
		if m, dup := seen[a]; dup {
			t.Fatalf("stacks %d and %d share %s", m, n, a)
		}
		seen[a] = n
		pool := netip.MustParsePrefix(fake.netPool(n))
		if pool.Addr() != ip {
			t.Fatalf("stack %d: %s is not the network address of its pool %s", n, a, pool)
		}
	}
}
