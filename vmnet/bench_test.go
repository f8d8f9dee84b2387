package vmnet

import (
	"os"
	"testing"

	"github.com/vmchaos/vmchaos/vmnet/vmnettest"
)

// BenchmarkDHCPExchange: one DISCOVER written into a real TAP's guest end
// and the OFFER read back out of it, through the responder in a namespace.
func BenchmarkDHCPExchange(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	ns, err := NewNetns(vmnettest.UniqueName("vmchaos-b"))
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	tap := vmnettest.UniqueName("vtb")
	if err := ns.AddTap(tap, "10.77.9.1/30"); err != nil {
		b.Fatal(err)
	}
	d, err := ServeDHCP(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	end := vmnettest.OpenTapEnd(b, ns, tap)
	disc := dhcpReq(DHCPDiscover, testMAC, nil)
	vmnettest.Exchange(b, end, disc.Marshal(), ParseDHCP) // the first one waits for the carrier
	b.ResetTimer()
	for b.Loop() {
		disc.XID++
		if offer, _ := vmnettest.Exchange(b, end, disc.Marshal(), ParseDHCP); offer.MsgType() != DHCPOffer {
			b.Fatalf("got %+v", offer)
		}
	}
}
