package vmnet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// tapEnd is the guest's end of a TAP device (what CH holds): Ethernet
// frames in and out.
type tapEnd struct{ f *os.File }

func openTapEnd(t testing.TB, ns *Netns, name string) *tapEnd {
	t.Helper()
	var fd int
	err := ns.Do(func() error {
		var err error
		if fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	})
	if err != nil {
		t.Fatalf("attach to tap %s: %v", name, err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	e := &tapEnd{f: os.NewFile(uintptr(fd), name)}
	t.Cleanup(func() { e.f.Close() })
	return e
}

func ipChecksum(h []byte) uint16 {
	var s uint32
	for i := 0; i < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// send writes a DHCP client packet as the guest's kernel would: broadcast
// from 0.0.0.0:68 to 255.255.255.255:67.
func (e *tapEnd) send(t testing.TB, p *DHCPPacket) {
	t.Helper()
	payload := p.Marshal()
	f := make([]byte, 14+20+8, 14+20+8+len(payload))
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], p.CHAddr)
	binary.BigEndian.PutUint16(f[12:14], 0x0800)
	ip := f[14:34]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+8+len(payload)))
	copy(ip[16:20], []byte{255, 255, 255, 255})
	binary.BigEndian.PutUint16(ip[10:12], ipChecksum(ip))
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:2], 68)
	binary.BigEndian.PutUint16(udp[2:4], 67)
	binary.BigEndian.PutUint16(udp[4:6], uint16(8+len(payload)))
	if _, err := e.f.Write(append(f, payload...)); err != nil {
		t.Fatalf("write frame: %v", err)
	}
}

// exchange sends p and returns the reply for its xid that comes out of the
// TAP, skipping anything else the kernel sends (IPv6 router solicitations,
// ...). Like a real DHCP client it retransmits, every second: until the
// kernel's link watcher has seen the carrier the guest end brought up, the
// TAP's transmit queue drops what the host sends.
func (e *tapEnd) exchange(t testing.TB, p *DHCPPacket) (*DHCPPacket, []byte) {
	t.Helper()
	buf := make([]byte, 2048)
	for try := 0; try < 30; try++ {
		e.send(t, p)
		if err := e.f.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		for {
			n, err := e.f.Read(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			fr := buf[:n]
			if n < 42 || binary.BigEndian.Uint16(fr[12:14]) != 0x0800 || fr[23] != 17 {
				continue
			}
			ihl := int(fr[14]&0x0f) * 4
			udp := fr[14+ihl:]
			if len(udp) < 8 || binary.BigEndian.Uint16(udp[2:4]) != 68 {
				continue
			}
			r, err := ParseDHCP(udp[8:])
			if err != nil || r.XID != p.XID {
				continue
			}
			return r, append([]byte(nil), fr[:14]...)
		}
	}
	t.Fatal("no DHCP reply on the tap after 30 tries")
	return nil, nil
}

// TestDHCPResponderOnARealTap: a responder in a namespace answers a client
// on a real TAP (frames written to and read from the device's guest end,
// as a guest's NIC would) with the other address of the TAP's /30, and
// acks exactly that address.
func TestDHCPResponderOnARealTap(t *testing.T) {
	needNetAdmin(t)
	ns, err := NewNetns(uniqueName("vmchaos-d"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	// Two TAPs: the answer depends on which one the client is on.
	for _, tp := range []struct{ tap, cidr string }{{uniqueName("vtd"), "10.77.3.1/30"}, {uniqueName("vte"), "10.77.3.5/30"}} {
		if err := ns.AddTap(tp.tap, tp.cidr); err != nil {
			t.Fatal(err)
		}
	}
	d, err := ServeDHCP(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })

	for _, c := range []struct{ tap, guest, host string }{{uniqueName("vtd"), "10.77.3.2", "10.77.3.1"}, {uniqueName("vte"), "10.77.3.6", "10.77.3.5"}} {
		end := openTapEnd(t, ns, c.tap)
		disc := dhcpReq(DHCPDiscover, testMAC, nil)
		offer, eth := end.exchange(t, disc)
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
		if ack, _ := end.exchange(t, reqp); ack.MsgType() != DHCPAck || ack.YIAddr != netip.MustParseAddr(c.guest) {
			t.Fatalf("%s: ack %+v", c.tap, ack)
		}
		wrong := dhcpReq(DHCPRequest, testMAC, map[byte][]byte{optRequestedIP: {10, 77, 3, 10}})
		wrong.XID += 2
		if nak, _ := end.exchange(t, wrong); nak.MsgType() != DHCPNak {
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
