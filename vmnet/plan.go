package vmnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/vmchaos/vmchaos/cidata"
)

// DefaultTapPool is the address pool a manager's tap mode carves /30s from
// when none is given: private, and far from the 192.168.x ranges home and
// office networks use.
const DefaultTapPool = "172.30.0.0/16"

// chName is the binary name a VMM wrapper must carry (argv[0] basename).
const chName = "cloud-hypervisor"

// NIC is one --net device. On a real CH, IP/Mask are the host side of the TAP
// (CH assigns them to the tap); the guest's own address comes from the
// cloud-init seed (cidata.GuestInterface). fakech reads IP as the loopback
// address its fake guest listens on instead.
type NIC struct {
	Tap  string
	MAC  string
	IP   string
	Mask string
	ID   string // optional stable device id (CH assigns _net<N> otherwise)
}

// Arg is the NIC as a --net value (tap=,mac=,ip=,mask=,id=; empty fields
// left out).
func (n NIC) Arg() (string, error) {
	var kv []string
	add := func(k, val string) error {
		if strings.ContainsAny(val, ",= ") {
			return fmt.Errorf("%s %q contains ',', '=' or a space", k, val)
		}
		if val != "" {
			kv = append(kv, k+"="+val)
		}
		return nil
	}
	for _, p := range [][2]string{{"tap", n.Tap}, {"mac", n.MAC}, {"ip", n.IP}, {"mask", n.Mask}, {"id", n.ID}} {
		if err := add(p[0], p[1]); err != nil {
			return "", err
		}
	}
	if len(kv) == 0 {
		return "", errors.New("empty NIC")
	}
	return strings.Join(kv, ","), nil
}

// PlanNIC gives VM number index its own point-to-point /30 out of pool (an
// IPv4 CIDR of at least /30, e.g. 192.168.200.0/22): the host side of the
// TAP gets .1 of the /30, the guest .2, a MAC derived from the guest address.
// The NIC goes to Launch (or a manager's --net), the GuestInterface into the
// cloud-init seed, and guest is the address the ledger dials.
func PlanNIC(pool string, index int, tap string) (NIC, cidata.GuestInterface, string, error) {
	_, ipn, err := net.ParseCIDR(pool)
	if err != nil {
		return NIC{}, cidata.GuestInterface{}, "", fmt.Errorf("plan nic: pool %q: %w", pool, err)
	}
	base := ipn.IP.To4()
	ones, bits := ipn.Mask.Size()
	if base == nil || bits != 32 || ones > 30 {
		return NIC{}, cidata.GuestInterface{}, "", fmt.Errorf("plan nic: pool %q: want an IPv4 CIDR of /30 or larger", pool)
	}
	slots := 1 << (30 - ones)
	if index < 0 || index >= slots {
		return NIC{}, cidata.GuestInterface{}, "", fmt.Errorf("plan nic: index %d outside pool %s (%d /30 slots)", index, pool, slots)
	}
	n := binary.BigEndian.Uint32(base) + uint32(index)*4
	host := make(net.IP, 4)
	guest := make(net.IP, 4)
	binary.BigEndian.PutUint32(host, n+1)
	binary.BigEndian.PutUint32(guest, n+2)
	// 52:54:00 is the locally administered prefix QEMU and CH users share;
	// the last three bytes follow the guest address, so MACs are unique
	// within any pool up to /8.
	mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", guest[1], guest[2], guest[3])
	nic := NIC{Tap: tap, MAC: mac, IP: host.String(), Mask: "255.255.255.252"}
	gi := cidata.GuestInterface{MAC: mac, Address: guest.String() + "/30", Gateway: host.String()}
	return nic, gi, guest.String(), nil
}
