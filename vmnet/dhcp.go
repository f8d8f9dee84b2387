package vmnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DHCP message types (RFC 2132, option 53).
const (
	DHCPDiscover = 1
	DHCPOffer    = 2
	DHCPRequest  = 3
	DHCPDecline  = 4
	DHCPAck      = 5
	DHCPNak      = 6
	DHCPRelease  = 7
	DHCPInform   = 8
)

// DHCP option codes used here.
const (
	optSubnetMask  = 1
	optRouter      = 3
	optRequestedIP = 50
	optLeaseTime   = 51
	optMsgType     = 53
	optServerID    = 54
	optEnd         = 255
	optPad         = 0
)

var dhcpMagic = [4]byte{99, 130, 83, 99}

// dhcpLease is long: the address of a TAP never changes, and a guest
// renewing while its VMM is paused or hibernated must not lose it.
const dhcpLease = 24 * time.Hour

// DHCPPacket is the part of a BOOTP/DHCP message the responder reads and
// writes.
type DHCPPacket struct {
	Op      byte
	XID     uint32
	Flags   uint16
	CIAddr  netip.Addr
	YIAddr  netip.Addr
	SIAddr  netip.Addr
	GIAddr  netip.Addr
	CHAddr  net.HardwareAddr
	Options map[byte][]byte
}

// MsgType is option 53, 0 when absent or malformed.
func (p *DHCPPacket) MsgType() byte {
	if v := p.Options[optMsgType]; len(v) == 1 {
		return v[0]
	}
	return 0
}

// ParseDHCP decodes a BOOTP/DHCP message (RFC 2131): the fixed header, the
// magic cookie and the options (pad and end honoured, a truncated option
// refused). Only Ethernet hardware addresses are accepted.
func ParseDHCP(b []byte) (*DHCPPacket, error) {
	if len(b) < 240 {
		return nil, fmt.Errorf("dhcp: %d bytes, want at least 240", len(b))
	}
	if b[1] != 1 || b[2] != 6 {
		return nil, fmt.Errorf("dhcp: hardware type %d length %d, want Ethernet (1, 6)", b[1], b[2])
	}
	if [4]byte(b[236:240]) != dhcpMagic {
		return nil, errors.New("dhcp: no magic cookie")
	}
	addr := func(o int) netip.Addr { return netip.AddrFrom4([4]byte(b[o : o+4])) }
	p := &DHCPPacket{
		Op:      b[0],
		XID:     binary.BigEndian.Uint32(b[4:8]),
		Flags:   binary.BigEndian.Uint16(b[10:12]),
		CIAddr:  addr(12),
		YIAddr:  addr(16),
		SIAddr:  addr(20),
		GIAddr:  addr(24),
		CHAddr:  net.HardwareAddr(append([]byte(nil), b[28:34]...)),
		Options: map[byte][]byte{},
	}
	opts := b[240:]
	for i := 0; i < len(opts); {
		code := opts[i]
		if code == optEnd {
			return p, nil
		}
		if code == optPad {
			i++
			continue
		}
		if i+1 >= len(opts) || i+2+int(opts[i+1]) > len(opts) {
			return nil, fmt.Errorf("dhcp: option %d truncated", code)
		}
		n := int(opts[i+1])
		// RFC 3396: a repeated option is concatenated.
		p.Options[code] = append(p.Options[code], opts[i+2:i+2+n]...)
		i += 2 + n
	}
	return p, nil
}

// Marshal encodes p with its options in code order and an end option.
func (p *DHCPPacket) Marshal() []byte {
	b := make([]byte, 240, 300)
	b[0], b[1], b[2] = p.Op, 1, 6
	binary.BigEndian.PutUint32(b[4:8], p.XID)
	binary.BigEndian.PutUint16(b[10:12], p.Flags)
	for o, a := range map[int]netip.Addr{12: p.CIAddr, 16: p.YIAddr, 20: p.SIAddr, 24: p.GIAddr} {
		if a.Is4() {
			v := a.As4()
			copy(b[o:o+4], v[:])
		}
	}
	copy(b[28:44], p.CHAddr)
	copy(b[236:240], dhcpMagic[:])
	for code := 1; code < 255; code++ {
		v, ok := p.Options[byte(code)]
		if !ok {
			continue
		}
		for len(v) > 255 {
			b = append(b, byte(code), 255)
			b = append(b, v[:255]...)
			v = v[255:]
		}
		b = append(b, byte(code), byte(len(v)))
		b = append(b, v...)
	}
	return append(b, optEnd)
}

// Answer is the responder's whole policy, a pure function: a client on an
// interface whose address is host/30 is given the other address of that
// /30, with host as router and server. DISCOVER → OFFER; REQUEST for that
// address (or renewing it) → ACK, for any other → NAK; everything else, and
// any interface that is not a /30, gets no answer (nil).
func Answer(req *DHCPPacket, host netip.Prefix) *DHCPPacket {
	if req.Op != 1 || len(req.CHAddr) != 6 || (req.GIAddr.IsValid() && !req.GIAddr.IsUnspecified()) {
		return nil
	}
	guest, ok := peerOf(host)
	if !ok {
		return nil
	}
	reply := &DHCPPacket{Op: 2, XID: req.XID, Flags: req.Flags, CHAddr: req.CHAddr, CIAddr: req.CIAddr,
		SIAddr: host.Addr(), Options: map[byte][]byte{}}
	hb := host.Addr().As4()
	reply.Options[optServerID] = hb[:]
	switch req.MsgType() {
	case DHCPDiscover:
		reply.Options[optMsgType] = []byte{DHCPOffer}
	case DHCPRequest:
		want := req.CIAddr
		if v := req.Options[optRequestedIP]; len(v) == 4 {
			want = netip.AddrFrom4([4]byte(v))
		}
		if sid := req.Options[optServerID]; len(sid) == 4 && netip.AddrFrom4([4]byte(sid)) != host.Addr() {
			return nil // the client chose another server
		}
		if want != guest {
			reply.Options[optMsgType] = []byte{DHCPNak}
			return reply
		}
		reply.Options[optMsgType] = []byte{DHCPAck}
	default:
		return nil
	}
	reply.YIAddr = guest
	mask := net.CIDRMask(host.Bits(), 32)
	reply.Options[optSubnetMask] = []byte(mask)
	reply.Options[optRouter] = hb[:]
	lease := make([]byte, 4)
	binary.BigEndian.PutUint32(lease, uint32(dhcpLease/time.Second))
	reply.Options[optLeaseTime] = lease
	return reply
}

// peerOf is the other usable address of the /30 host is in.
func peerOf(host netip.Prefix) (netip.Addr, bool) {
	if !host.Addr().Is4() || host.Bits() != 30 {
		return netip.Addr{}, false
	}
	net4 := binary.BigEndian.Uint32(host.Masked().Addr().AsSlice())
	h := binary.BigEndian.Uint32(host.Addr().AsSlice())
	var other uint32
	switch h - net4 {
	case 1:
		other = net4 + 2
	case 2:
		other = net4 + 1
	default:
		return netip.Addr{}, false
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], other)
	return netip.AddrFrom4(b), true
}

// DHCPResponder answers DHCP on every /30 interface of a namespace (the TAPs
// vmctl's tap mode plans), without state: the address a guest gets depends
// only on the TAP it is plugged into. It is what lets a guest whose RAM holds
// another VM's network (a clone of a base snapshot under a new name) take
// the address vmctl recorded for its own TAP, as long as the guest asks by
// DHCP (vmctl --guest-net dhcp).
type DHCPResponder struct {
	conn *net.UDPConn
	ns   *Netns
	done chan struct{}

	mu      sync.Mutex
	answers int
	lastErr error
}

// ServeDHCP starts a responder on UDP port 67 inside ns (nil: this
// process's namespace). Needs root (port 67, and setns for ns).
func ServeDHCP(ns *Netns) (*DHCPResponder, error) {
	var conn *net.UDPConn
	open := func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), "dhcp")
		defer f.Close()
		for _, o := range [][2]int{{unix.SOL_SOCKET, unix.SO_REUSEADDR}, {unix.SOL_SOCKET, unix.SO_BROADCAST}, {unix.IPPROTO_IP, unix.IP_PKTINFO}} {
			if err := unix.SetsockoptInt(fd, o[0], o[1], 1); err != nil {
				return fmt.Errorf("setsockopt: %w", err)
			}
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: 67}); err != nil {
			return fmt.Errorf("bind :67: %w", err)
		}
		pc, err := net.FilePacketConn(f)
		if err != nil {
			return err
		}
		conn = pc.(*net.UDPConn)
		return nil
	}
	var err error
	if ns != nil {
		err = ns.Do(open)
	} else {
		err = open()
	}
	if err != nil {
		return nil, fmt.Errorf("realch: dhcp: %w", err)
	}
	d := &DHCPResponder{conn: conn, ns: ns, done: make(chan struct{})}
	go d.serve()
	return d, nil
}

// Answers is how many replies were sent; Err the last error met (both for
// tests and the run's evidence).
func (d *DHCPResponder) Answers() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.answers
}

func (d *DHCPResponder) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastErr
}

func (d *DHCPResponder) note(err error) {
	d.mu.Lock()
	if err != nil {
		d.lastErr = err
	} else {
		d.answers++
	}
	d.mu.Unlock()
}

// Close stops the responder and waits for its goroutine.
func (d *DHCPResponder) Close() error {
	err := d.conn.Close()
	<-d.done
	return err
}

func (d *DHCPResponder) serve() {
	defer close(d.done)
	buf := make([]byte, 1500)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofInet4Pktinfo))
	for {
		n, oobn, _, from, err := d.conn.ReadMsgUDP(buf, oob)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			d.note(err)
			continue
		}
		ifindex, ok := pktinfoIfindex(oob[:oobn])
		if !ok {
			continue
		}
		req, err := ParseDHCP(buf[:n])
		if err != nil {
			continue // not ours to judge: a malformed packet gets no answer
		}
		host, err := d.ifacePrefix(ifindex)
		if err != nil {
			d.note(err)
			continue
		}
		reply := Answer(req, host)
		if reply == nil {
			continue
		}
		// A client without an address yet only hears a broadcast; one
		// renewing (ciaddr set) is answered where it is.
		to := &net.UDPAddr{IP: net.IPv4bcast, Port: 68}
		if req.CIAddr.IsValid() && !req.CIAddr.IsUnspecified() && from != nil && from.Port == 68 {
			to = &net.UDPAddr{IP: req.CIAddr.AsSlice(), Port: 68}
		}
		info := &unix.Inet4Pktinfo{Ifindex: int32(ifindex), Spec_dst: host.Addr().As4()}
		if _, _, err := d.conn.WriteMsgUDP(reply.Marshal(), unix.PktInfo4(info), to); err != nil {
			d.note(fmt.Errorf("dhcp: reply on ifindex %d: %w", ifindex, err))
			continue
		}
		d.note(nil)
	}
}

func pktinfoIfindex(oob []byte) (int, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo {
			info := (*unix.Inet4Pktinfo)(unsafe.Pointer(&m.Data[0]))
			return int(info.Ifindex), true
		}
	}
	return 0, false
}

// ifacePrefix is the first IPv4 address (with its prefix) of the interface,
// read inside the responder's namespace.
func (d *DHCPResponder) ifacePrefix(ifindex int) (netip.Prefix, error) {
	var out netip.Prefix
	look := func() error {
		ifc, err := net.InterfaceByIndex(ifindex)
		if err != nil {
			return err
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.To4() == nil {
				continue
			}
			ones, _ := ipn.Mask.Size()
			ip, _ := netip.AddrFromSlice(ipn.IP.To4())
			out = netip.PrefixFrom(ip, ones)
			return nil
		}
		return fmt.Errorf("interface %s has no IPv4 address", ifc.Name)
	}
	var err error
	if d.ns != nil {
		err = d.ns.Do(look)
	} else {
		err = look()
	}
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("dhcp: ifindex %d: %w", ifindex, err)
	}
	return out, nil
}
