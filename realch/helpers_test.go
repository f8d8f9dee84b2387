package realch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/vmnet"
)

// needNetAdmin skips tests that create namespaces and devices when this
// process cannot (not root, or no iproute2 / tun).
func needNetAdmin(t *testing.T) {
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

// uniqueName is short enough for interface names (15 bytes) and unique per
// test process, so parallel runs of the suite never collide.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)
}

// Copied from vmnet's DHCP tests: the guest's side of a TAP, to check
// the responder StackEnv starts.

func dhcpReq(t byte, mac net.HardwareAddr, opts map[byte][]byte) *vmnet.DHCPPacket {
	p := &vmnet.DHCPPacket{Op: 1, XID: 0x1234abcd, CHAddr: mac, Options: map[byte][]byte{53: {t}}}
	for k, v := range opts {
		p.Options[k] = v
	}
	return p
}

// tapEnd is the guest's end of a TAP device (what CH holds): Ethernet
// frames in and out.
type tapEnd struct{ f *os.File }

func openTapEnd(t testing.TB, ns *vmnet.Netns, name string) *tapEnd {
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
func (e *tapEnd) send(t testing.TB, p *vmnet.DHCPPacket) {
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
func (e *tapEnd) exchange(t testing.TB, p *vmnet.DHCPPacket) (*vmnet.DHCPPacket, []byte) {
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
			r, err := vmnet.ParseDHCP(udp[8:])
			if err != nil || r.XID != p.XID {
				continue
			}
			return r, append([]byte(nil), fr[:14]...)
		}
	}
	t.Fatal("no DHCP reply on the tap after 30 tries")
	return nil, nil
}
