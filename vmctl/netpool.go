package vmctl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"strconv"
	"syscall"
)

// netPool hands out guest addresses from one CIDR.
type netPool struct {
	prefix netip.Prefix
	mask   string
}

func parseNetPool(s string) (*netPool, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return nil, fmt.Errorf("net pool %q: %w", s, err)
	}
	p = p.Masked()
	if !p.Addr().Is4() || p.Bits() > 30 || p.Bits() < 8 {
		return nil, fmt.Errorf("net pool %q: want an IPv4 CIDR between /8 and /30", s)
	}
	m := net.CIDRMask(p.Bits(), 32)
	return &netPool{prefix: p, mask: net.IP(m).String()}, nil
}

// loopback reports whether the whole pool is inside 127.0.0.0/8, which the
// fake backend requires (its guests listen on the host's loopback).
func (p *netPool) loopback() bool {
	return netip.MustParsePrefix("127.0.0.0/8").Contains(p.prefix.Addr()) && p.prefix.Bits() >= 8
}

func (p *netPool) size() uint32 { return uint32(1) << (32 - p.prefix.Bits()) }

func (p *netPool) at(i uint32) string {
	base := binary.BigEndian.Uint32(p.prefix.Addr().AsSlice())
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], base+i)
	return netip.AddrFrom4(b).String()
}

// allocate returns n addresses not in used. The search starts at an offset
// derived from the root dir, so separate stores sharing the default pool on
// one host rarely meet; an address some other process already listens on
// (ip:port) is skipped as well.
func (p *netPool) allocate(root string, n int, port int, used map[string]bool) ([]string, error) {
	h := fnv.New32a()
	h.Write([]byte(root))
	size := p.size()
	usable := size - 2 // network and broadcast addresses
	start := h.Sum32() % usable
	var out []string
	for k := uint32(0); k < usable && len(out) < n; k++ {
		ip := p.at(1 + (start+k)%usable)
		if used[ip] {
			continue
		}
		if port > 0 && !bindable(ip, port) {
			continue
		}
		out = append(out, ip)
	}
	if len(out) < n {
		return nil, fmt.Errorf("net pool %s exhausted (%d addresses in use)", p.prefix, len(used))
	}
	return out, nil
}

// bindable probes whether ip:port is free right now. Only EADDRINUSE says
// another process holds it: an unprivileged caller cannot bind a guest's
// port 22 at all (EACCES), which says nothing about the address, and the
// VMM that serves it may have the privilege vmctl lacks.
func bindable(ip string, port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		return !errors.Is(err, syscall.EADDRINUSE)
	}
	l.Close()
	return true
}

// macFor derives a stable locally administered MAC from the VM id and NIC index.
func macFor(id string, i int) string {
	h := fnv.New32a()
	h.Write([]byte(id))
	h.Write([]byte{byte(i)})
	s := h.Sum32()
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", byte(s>>16), byte(s>>8), byte(s))
}
