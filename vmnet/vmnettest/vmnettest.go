// Package vmnettest is test support for vmnet and for the harness tests that
// start vmnet's namespaces, TAPs and DHCP responder (realch): the checks that
// skip what this process cannot set up, and the guest's end of a TAP, to
// speak DHCP into it as a guest's NIC would.
//
// It must not import vmnet: vmnet's own internal tests use it, and that
// would be an import cycle. The namespace is therefore a Doer, DHCP packets
// travel as their marshalled bytes, and the caller parses replies.
package vmnettest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// NeedNetAdmin skips tests that create namespaces and devices when this
// process cannot (not root, or no iproute2 / tun).
func NeedNetAdmin(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("netns and TAP setup need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 (ip) not installed")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("no /dev/net/tun: TAP devices unavailable")
	}
}

// UniqueName is short enough for interface names (15 bytes) and unique per
// test process, so parallel runs of the suite never collide.
func UniqueName(prefix string) string {
	return fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)
}

// Doer runs f inside a network namespace (*vmnet.Netns).
type Doer interface {
	Do(f func() error) error
}

// TapEnd is the guest's end of a TAP device (what CH holds): Ethernet
// frames in and out.
type TapEnd struct{ f *os.File }

// OpenTapEnd attaches to the TAP name in ns; the test's cleanup closes it.
func OpenTapEnd(t testing.TB, ns Doer, name string) *TapEnd {
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
	e := &TapEnd{f: os.NewFile(uintptr(fd), name)}
	t.Cleanup(func() { e.f.Close() })
	return e
}

// Close detaches from the TAP, as a guest's VMM does when it exits.
func (e *TapEnd) Close() error { return e.f.Close() }

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

// Send writes a marshalled DHCP client packet as the guest's kernel would:
// broadcast from 0.0.0.0:68 to 255.255.255.255:67, from the packet's chaddr.
func (e *TapEnd) Send(t testing.TB, payload []byte) {
	t.Helper()
	f := make([]byte, 14+20+8, 14+20+8+len(payload))
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], chaddr(payload))
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

// chaddr is the client's Ethernet address in a DHCP packet (RFC 2131 §2:
// 16 bytes at offset 28, of which Ethernet uses 6).
func chaddr(p []byte) []byte {
	if len(p) < 34 {
		return nil
	}
	return p[28:34]
}

// xid is a DHCP packet's transaction id (4 bytes at offset 4).
func xid(p []byte) []byte {
	if len(p) < 8 {
		return nil
	}
	return p[4:8]
}

// Exchange sends the marshalled DHCP packet req through e and returns the
// reply for its xid that comes out of the TAP, parsed by parse, with the
// reply's Ethernet header. It skips anything else the kernel sends (IPv6
// router solicitations, ...) and replies parse rejects. Like a real DHCP
// client it retransmits, every second: until the kernel's link watcher has
// seen the carrier the guest end brought up, the TAP's transmit queue drops
// what the host sends.
func Exchange[P any](t testing.TB, e *TapEnd, req []byte, parse func([]byte) (P, error)) (P, []byte) {
	t.Helper()
	buf := make([]byte, 2048)
	for try := 0; try < 30; try++ {
		e.Send(t, req)
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
			r, err := parse(udp[8:])
			if err != nil || !bytes.Equal(xid(udp[8:]), xid(req)) {
				continue
			}
			return r, append([]byte(nil), fr[:14]...)
		}
	}
	t.Fatal("no DHCP reply on the tap after 30 tries")
	var none P
	return none, nil
}
