package stack

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/injector"
)

// newTestNetPath is a net path of this test (root, iproute2), removed at
// cleanup; its names carry the run prefix, so a killed test leaves what
// `doctor --clean` removes.
func newTestNetPath(t *testing.T) *NetPath {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("not root: network namespaces cannot be created")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	tag := "vmchaos-t" + hex.EncodeToString(b)
	p, err := newNetPath(filepath.Join(t.TempDir(), "netns"), tag+"-node", tag+"-reg", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// echoInReg serves a line echo at NetRegistryAddr inside the registry
// namespace: what the node's dials must reach across the pair.
func echoInReg(t *testing.T, p *NetPath) {
	t.Helper()
	l, err := p.Reg.Listen("tcp", NetRegistryAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					ln, err := r.ReadBytes('\n')
					if err != nil {
						return
					}
					if _, err := c.Write(ln); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// dialReg dials the registry's address from the node namespace.
func dialReg(p *NetPath, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return p.DialNode(ctx, "tcp", NetRegistryAddr)
}

// medianRTT is the median of n echo round trips on one connection.
func medianRTT(t *testing.T, p *NetPath, n int) time.Duration {
	t.Helper()
	c, err := dialReg(p, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	var rtts []time.Duration
	for range n {
		start := time.Now()
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ReadBytes('\n'); err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, time.Since(start))
	}
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	return rtts[n/2]
}

// TestNetPartitionCutsThePathUntilHealed: the node reaches the registry's
// address over the veth pair (and the host namespace does not); with the
// partition in, a dial from the node times out and the path is not healed;
// after the heal the dial succeeds and the heal is stamped.
func TestNetPartitionCutsThePathUntilHealed(t *testing.T) {
	t.Run("nft", func(t *testing.T) { partitionThenHeal(t, newTestNetPath(t)) })
	t.Run("iptables", func(t *testing.T) {
		// the fallback where nft is unusable
		p := newTestNetPath(t)
		p.nftErr = errors.New("nft made unusable by the test")
		partitionThenHeal(t, p)
	})
}

func partitionThenHeal(t *testing.T, p *NetPath) {
	echoInReg(t, p)
	if rtt := medianRTT(t, p, 5); rtt <= 0 {
		t.Fatalf("round trip %s", rtt)
	}
	// nothing of the path is in the host namespace (looked at, never
	// dialed: the host's network is not the harness's to probe)
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.Contains(net.ParseIP(netRegIP)) {
			t.Fatalf("the host namespace has %s: the path is not the case's own", a)
		}
	}
	ctx := context.Background()
	if err := p.Partition(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := dialReg(p, 500*time.Millisecond)
	if err == nil {
		c.Close()
		t.Fatal("a dial from the node reached the registry through the partition")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("dial through the partition: %v, want a timeout (dropped, not refused)", err)
		}
	}
	if ns, herr := p.Healed(); ns != 0 || herr != nil {
		t.Fatalf("Healed() = %d, %v while cut", ns, herr)
	}
	if err := p.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	if ns, herr := p.Healed(); ns == 0 || herr != nil {
		t.Fatalf("Healed() = %d, %v after the heal", ns, herr)
	}
	c, err = dialReg(p, 5*time.Second)
	if err != nil {
		t.Fatalf("dial after the heal: %v", err)
	}
	c.Close()
}

// TestNetDelayGrowsTheRoundTrip: with net-delay's netem in, the measured
// round trip from the node to the registry is larger than without it, and
// back down after the heal. Where the kernel has no netem the kind is not
// available, and this test says so.
func TestNetDelayGrowsTheRoundTrip(t *testing.T) {
	p := newTestNetPath(t)
	if err := p.Supports(injector.NetDelay); err != nil {
		t.Skipf("net-delay unavailable here: %v", err)
	}
	echoInReg(t, p)
	before := medianRTT(t, p, 7)
	ctx := context.Background()
	if err := p.Impair(ctx, injector.NetDelay); err != nil {
		t.Fatal(err)
	}
	during := medianRTT(t, p, 7)
	if err := p.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	after := medianRTT(t, p, 7)
	t.Logf("median round trip: %s before, %s with %s each way, %s after the heal", before, during, injector.NetDelay, after)
	if during <= before || during <= after {
		t.Errorf("round trip with the delay %s, not larger than without (%s before, %s after)", during, before, after)
	}
}

// TestNetLossDropsPackets: with net-loss in (netem, or the nftables numgen
// rule where the kernel has no netem), some of 200 datagrams from the node
// never reach the registry's namespace; after the heal all of 50 do.
func TestNetLossDropsPackets(t *testing.T) {
	p := newTestNetPath(t)
	if err := p.Supports(injector.NetLoss); err != nil {
		t.Skipf("net-loss unavailable here: %v", err)
	}
	var pc net.PacketConn
	if err := p.Reg.Do(func() (err error) { pc, err = net.ListenPacket("udp", NetRegistryAddr); return err }); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ctx := context.Background()
	if err := p.Impair(ctx, injector.NetLoss); err != nil {
		t.Fatal(err)
	}
	lossy := sendCount(t, p, pc, 200)
	if err := p.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	whole := sendCount(t, p, pc, 50)
	t.Logf("%d of 200 datagrams arrived with %s, %d of 50 after the heal", lossy, injector.NetLoss, whole)
	if lossy >= 200 || lossy == 0 {
		t.Errorf("%d of 200 arrived with the loss in: want some lost, some through", lossy)
	}
	if whole != 50 {
		t.Errorf("%d of 50 arrived after the heal, want all", whole)
	}
}

// sendCount sends n datagrams from the node to pc and counts what arrives.
func sendCount(t *testing.T, p *NetPath, pc net.PacketConn, n int) int {
	t.Helper()
	c, err := dialReg(p, 5*time.Second)
	if err == nil {
		c.Close() // warm the neighbour entry over TCP: ARP is not under test
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u, err := p.DialNode(ctx, "udp", NetRegistryAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	got := make(chan int, 1)
	go func() {
		k, buf := 0, make([]byte, 64)
		for {
			_ = pc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if _, _, err := pc.ReadFrom(buf); err != nil {
				got <- k
				return
			}
			k++
		}
	}()
	for range n {
		// a datagram the drop rule meets on its way out fails its write
		// (EPERM): lost all the same
		if _, err := u.Write([]byte("x")); err != nil && !errors.Is(err, syscall.EPERM) {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	return <-got
}
