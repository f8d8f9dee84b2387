package vmnet

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/vmnet/vmnettest"
)

func dhcpReq(t byte, mac net.HardwareAddr, opts map[byte][]byte) *DHCPPacket {
	p := &DHCPPacket{Op: 1, XID: 0x1234abcd, CHAddr: mac, Options: map[byte][]byte{optMsgType: {t}}}
	for k, v := range opts {
		p.Options[k] = v
	}
	return p
}

var testMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x1e, 0x00, 0x06}

func TestAnswerGivesTheOtherAddressOfTheSlash30(t *testing.T) {
	host := netip.MustParsePrefix("172.30.0.5/30")
	offer := Answer(dhcpReq(DHCPDiscover, testMAC, nil), host)
	if offer == nil || offer.MsgType() != DHCPOffer || offer.YIAddr != netip.MustParseAddr("172.30.0.6") || offer.XID != 0x1234abcd ||
		!bytes.Equal(offer.Options[optRouter], []byte{172, 30, 0, 5}) || !bytes.Equal(offer.Options[optSubnetMask], []byte{255, 255, 255, 252}) ||
		!bytes.Equal(offer.Options[optServerID], []byte{172, 30, 0, 5}) || len(offer.Options[optLeaseTime]) != 4 || !bytes.Equal(offer.CHAddr, testMAC) {
		t.Fatalf("offer %+v", offer)
	}
	for _, c := range []struct {
		name string
		req  *DHCPPacket
		host string
		want byte // 0: no answer
	}{
		{"request the offer", dhcpReq(DHCPRequest, testMAC, map[byte][]byte{optRequestedIP: {172, 30, 0, 6}, optServerID: {172, 30, 0, 5}}), "172.30.0.5/30", DHCPAck},
		{"renew by ciaddr", func() *DHCPPacket {
			p := dhcpReq(DHCPRequest, testMAC, nil)
			p.CIAddr = netip.MustParseAddr("172.30.0.6")
			return p
		}(), "172.30.0.5/30", DHCPAck},
		// A woken guest asking for the address its RAM remembers from
		// another TAP is told no, and starts over with a DISCOVER.
		{"request another slot's address", dhcpReq(DHCPRequest, testMAC, map[byte][]byte{optRequestedIP: {172, 30, 0, 10}}), "172.30.0.5/30", DHCPNak},
		{"another server chosen", dhcpReq(DHCPRequest, testMAC, map[byte][]byte{optRequestedIP: {172, 30, 0, 6}, optServerID: {10, 0, 0, 1}}), "172.30.0.5/30", 0},
		{"host side is .2", dhcpReq(DHCPDiscover, testMAC, nil), "172.30.0.6/30", DHCPOffer},
		{"not a /30", dhcpReq(DHCPDiscover, testMAC, nil), "172.30.0.5/24", 0},
		{"host is the network address", dhcpReq(DHCPDiscover, testMAC, nil), "172.30.0.4/30", 0},
		{"release", dhcpReq(DHCPRelease, testMAC, nil), "172.30.0.5/30", 0},
		{"relayed", func() *DHCPPacket {
			p := dhcpReq(DHCPDiscover, testMAC, nil)
			p.GIAddr = netip.MustParseAddr("10.1.1.1")
			return p
		}(), "172.30.0.5/30", 0},
		{"a reply", func() *DHCPPacket { p := dhcpReq(DHCPDiscover, testMAC, nil); p.Op = 2; return p }(), "172.30.0.5/30", 0},
	} {
		got := Answer(c.req, netip.MustParsePrefix(c.host))
		switch {
		case c.want == 0 && got != nil:
			t.Errorf("%s: answered %+v", c.name, got)
		case c.want != 0 && (got == nil || got.MsgType() != c.want):
			t.Errorf("%s: got %+v, want type %d", c.name, got, c.want)
		}
	}
	if p, _ := peerOf(netip.MustParsePrefix("172.30.0.6/30")); p != netip.MustParseAddr("172.30.0.5") {
		t.Fatalf("peer of .6 is %s", p)
	}
}

func TestDHCPMarshalParseRoundTrip(t *testing.T) {
	in := dhcpReq(DHCPRequest, testMAC, map[byte][]byte{optRequestedIP: {1, 2, 3, 4}, 61: bytes.Repeat([]byte{7}, 300)})
	in.CIAddr, in.Flags = netip.MustParseAddr("9.8.7.6"), 0x8000
	out, err := ParseDHCP(in.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if out.XID != in.XID || out.Flags != in.Flags || out.CIAddr != in.CIAddr || !bytes.Equal(out.CHAddr, testMAC) ||
		out.MsgType() != DHCPRequest || !bytes.Equal(out.Options[61], in.Options[61]) || !bytes.Equal(out.Options[optRequestedIP], []byte{1, 2, 3, 4}) {
		t.Fatalf("round trip %+v", out)
	}
	b := in.Marshal()
	for _, bad := range [][]byte{b[:239], append(append([]byte(nil), b[:240]...), 50, 4, 1)} {
		if _, err := ParseDHCP(bad); err == nil {
			t.Errorf("accepted %d bytes", len(bad))
		}
	}
}

// FuzzParseDHCP: packets from guests are outside input. Whatever arrives,
// parsing never panics, Answer never panics on what parses, and a parsed
// packet survives Marshal → Parse with its identity (xid, MAC, type).
func FuzzParseDHCP(f *testing.F) {
	f.Add(dhcpReq(DHCPDiscover, testMAC, nil).Marshal())
	f.Add(dhcpReq(DHCPRequest, testMAC, map[byte][]byte{optRequestedIP: {172, 30, 0, 6}, optServerID: {172, 30, 0, 5}}).Marshal())
	f.Add(make([]byte, 240))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseDHCP(b)
		if err != nil {
			return
		}
		_ = Answer(p, netip.MustParsePrefix("172.30.0.5/30"))
		q, err := ParseDHCP(p.Marshal())
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		if q.XID != p.XID || !bytes.Equal(q.CHAddr, p.CHAddr) || q.MsgType() != p.MsgType() {
			t.Fatalf("identity changed: %+v → %+v", p, q)
		}
	})
}

// TestDHCPResponderOnARealTap: a responder in a namespace answers a client
// on a real TAP (frames written to and read from the device's guest end,
// as a guest's NIC would) with the other address of the TAP's /30, and
// acks exactly that address.
func TestDHCPResponderOnARealTap(t *testing.T) {
	vmnettest.NeedNetAdmin(t)
	ns, err := NewNetns(vmnettest.UniqueName("vmchaos-d"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	// Two TAPs: the answer depends on which one the client is on.
	for _, tp := range []struct{ tap, cidr string }{{vmnettest.UniqueName("vtd"), "10.77.3.1/30"}, {vmnettest.UniqueName("vte"), "10.77.3.5/30"}} {
		if err := ns.AddTap(tp.tap, tp.cidr); err != nil {
			t.Fatal(err)
		}
	}
	d, err := ServeDHCP(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })

	for _, c := range []struct{ tap, guest, host string }{{vmnettest.UniqueName("vtd"), "10.77.3.2", "10.77.3.1"}, {vmnettest.UniqueName("vte"), "10.77.3.6", "10.77.3.5"}} {
		end := vmnettest.OpenTapEnd(t, ns, c.tap)
		disc := dhcpReq(DHCPDiscover, testMAC, nil)
		offer, eth := vmnettest.Exchange(t, end, disc.Marshal(), ParseDHCP)
		if offer.MsgType() != DHCPOffer || offer.YIAddr != netip.MustParseAddr(c.guest) || offer.SIAddr != netip.MustParseAddr(c.host) {
			t.Fatalf("%s: offer %+v", c.tap, offer)
		}
		if !bytes.Equal(eth[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) {
			t.Fatalf("%s: offer sent to %x, want broadcast", c.tap, eth[0:6])
		}
		g := netip.MustParseAddr(c.guest).As4()
		h := netip.MustParseAddr(c.host).As4()
		reqp := dhcpReq(DHCPRequest, testMAC, map[byte][]byte{optRequestedIP: g[:], optServerID: h[:]})
		reqp.XID++
		if ack, _ := vmnettest.Exchange(t, end, reqp.Marshal(), ParseDHCP); ack.MsgType() != DHCPAck || ack.YIAddr != netip.MustParseAddr(c.guest) {
			t.Fatalf("%s: ack %+v", c.tap, ack)
		}
		wrong := dhcpReq(DHCPRequest, testMAC, map[byte][]byte{optRequestedIP: {10, 77, 3, 10}})
		wrong.XID += 2
		if nak, _ := vmnettest.Exchange(t, end, wrong.Marshal(), ParseDHCP); nak.MsgType() != DHCPNak {
			t.Fatalf("%s: want NAK, got %+v", c.tap, nak)
		}
	}
	// The count is taken after each send returns, which may be after the
	// client already read the reply; retransmissions may add answers.
	deadline := time.Now().Add(30 * time.Second)
	for d.Answers() < 6 {
		if time.Now().After(deadline) {
			t.Fatalf("answers %d, want 6 (last error %v)", d.Answers(), d.Err())
		}
		time.Sleep(time.Millisecond)
	}
}
