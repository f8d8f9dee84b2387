package vmnet

import (
	"os"
	"testing"
)

// BenchmarkDHCPExchange: one DISCOVER written into a real TAP's guest end
// and the OFFER read back out of it, through the responder in a namespace.
func BenchmarkDHCPExchange(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	ns, err := NewNetns(uniqueName("vmchaos-b"))
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	tap := uniqueName("vtb")
	if err := ns.AddTap(tap, "10.77.9.1/30"); err != nil {
		b.Fatal(err)
	}
	d, err := ServeDHCP(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	end := openTapEnd(b, ns, tap)
	disc := dhcpReq(DHCPDiscover, testMAC, nil)
	end.exchange(b, disc) // the first one waits for the carrier
	b.ResetTimer()
	for b.Loop() {
		disc.XID++
		if offer, _ := end.exchange(b, disc); offer.MsgType() != DHCPOffer {
			b.Fatalf("got %+v", offer)
		}
	}
}
