package vmctl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/cidata"
	"github.com/vmchaos/vmchaos/vmnet"
)

// Network modes. fake: the VMM's --net ip= is the guest's own loopback
// address (fakech listens there). tap: real cloud-hypervisor on a TAP device
// per NIC; --net ip=,mask= is the host side of the TAP, and the guest learns
// its own address from a cloud-init seed vmctl attaches on cold boots.
const (
	NetModeFake = "fake"
	NetModeTap  = "tap"
)

// Guest address modes in tap mode. static: the seed configures each NIC's
// address by MAC; a guest restored from another VM's snapshot keeps that
// VM's. dhcp: the seed turns DHCP on for every NIC, and the responder on the
// TAP side (vmnet.ServeDHCP) hands each TAP's guest address out, so any
// restored guest takes the address of the TAP it is plugged into.
const (
	GuestNetStatic = "static"
	GuestNetDHCP   = "dhcp"
)

// seedFile is the cloud-init NoCloud seed in the VM's dir, attached as a
// second, read-only disk on every cold boot.
const seedFile = "cidata.img"

func (m *Manager) tap() bool                  { return m.cfg.NetMode == NetModeTap }
func (m *Manager) vmSeed(id string) string    { return filepath.Join(m.vmDir(id), seedFile) }
func (m *Manager) serialLog(id string) string { return filepath.Join(m.vmRunDir(id), "serial.log") }

// tapSlots returns the /30 slots VM name owns, allocating the missing ones
// of its first n NICs. A name keeps its slots for the life of the store:
// the address and MAC a guest configured at its first boot live on in its
// RAM through every hibernate and wake (a clone under the same name), so the
// same name must always get the same TAP, host address and MAC. prefer are
// the NICs the name had where a snapshot was taken (its metadata), used for
// slots this store has not assigned yet (an imported snapshot).
func (m *Manager) tapSlots(ix *vmIndex, name string, n int, prefer []NIC) ([]int, error) {
	slots := ix.TapSlots[name]
	if len(slots) >= n {
		return slots[:n], nil
	}
	used := map[int]bool{}
	for _, ss := range ix.TapSlots {
		for _, s := range ss {
			used[s] = true
		}
	}
	total := m.pool.size() / 4
	for i := len(slots); i < n; i++ {
		s := -1
		if i < len(prefer) {
			if p, ok := m.slotOf(prefer[i].IP); ok && !used[p] {
				s = p
			}
		}
		if s < 0 {
			h := fnv.New32a()
			h.Write([]byte(name + "/" + strconv.Itoa(i)))
			start := h.Sum32() % total
			for k := uint32(0); k < total; k++ {
				if c := int((start + k) % total); !used[c] {
					s = c
					break
				}
			}
		}
		if s < 0 {
			return nil, fmt.Errorf("tap pool %s exhausted (%d /30 slots, all held by names)", m.pool.prefix, total)
		}
		used[s] = true
		slots = append(slots, s)
	}
	if ix.TapSlots == nil {
		ix.TapSlots = map[string][]int{}
	}
	ix.TapSlots[name] = slots
	return slots, nil
}

// slotOf maps a guest address back to its /30 slot in the pool.
func (m *Manager) slotOf(guest string) (int, bool) {
	a, err := netip.ParseAddr(guest)
	if err != nil || !a.Is4() || !m.pool.prefix.Contains(a) {
		return 0, false
	}
	off := binary.BigEndian.Uint32(a.AsSlice()) - binary.BigEndian.Uint32(m.pool.prefix.Addr().AsSlice())
	if off%4 != 2 || off/4 >= m.pool.size()/4 {
		return 0, false
	}
	return int(off / 4), true
}

// tapNIC is NIC i of a VM on /30 slot: vmnet.PlanNIC's host side, guest
// address and MAC; the TAP is named after the /30 (vt + 8 hex digits), so
// stores with disjoint pools never collide on a device name in one netns.
func (m *Manager) tapNIC(i, slot int) (NIC, error) {
	base := binary.BigEndian.Uint32(m.pool.prefix.Addr().AsSlice()) + uint32(slot)*4
	tap := fmt.Sprintf("vt%08x", base)
	host, _, guest, err := vmnet.PlanNIC(m.pool.prefix.String(), slot, tap)
	if err != nil {
		return NIC{}, err
	}
	return NIC{ID: nicID(host.MAC), MAC: host.MAC, IP: guest, Mask: host.Mask, SSHPort: guestSSHPort, Tap: host.Tap, HostIP: host.IP}, nil
}

// planTapNICs gives VM name its n NICs from the slots it owns.
func (m *Manager) planTapNICs(ix *vmIndex, name string, n int, prefer []NIC) ([]NIC, error) {
	slots, err := m.tapSlots(ix, name, n, prefer)
	if err != nil {
		return nil, err
	}
	out := make([]NIC, 0, n)
	for i, s := range slots {
		nic, err := m.tapNIC(i, s)
		if err != nil {
			return nil, err
		}
		out = append(out, nic)
	}
	return out, nil
}

// nameNICs are the NICs v's name owns in tap mode (all its slots, attached
// or not), as a snapshot's metadata records them; nil in fake mode.
func (m *Manager) nameNICs(v *VM) ([]NIC, error) {
	if !m.tap() {
		return nil, nil
	}
	ix, err := m.loadVMs()
	if err != nil {
		return nil, err
	}
	var out []NIC
	for i, s := range ix.TapSlots[v.Name] {
		nic, err := m.tapNIC(i, s)
		if err != nil {
			return nil, err
		}
		out = append(out, nic)
	}
	return out, nil
}

// netConfig is the NIC as the VMM is told about it (vm.add-net); netArg is
// the same as a --net value. A record with a TAP carries the host side in
// ip=; a fake one its guest address.
func netConfig(n NIC) chapi.NetConfig {
	if n.Tap != "" {
		return chapi.NetConfig{ID: n.ID, Tap: n.Tap, IP: n.HostIP, Mask: n.Mask, Mac: n.MAC}
	}
	return chapi.NetConfig{ID: n.ID, IP: n.IP, Mask: n.Mask, Mac: n.MAC}
}

func netArg(n NIC) string {
	if n.Tap != "" {
		s := "tap=" + n.Tap + ",mac=" + n.MAC + ",ip=" + n.HostIP
		if n.Mask != "" {
			s += ",mask=" + n.Mask
		}
		return s + ",id=" + n.ID
	}
	s := "id=" + n.ID + ",mac=" + n.MAC + ",ip=" + n.IP
	if n.Mask != "" {
		s += ",mask=" + n.Mask
	}
	return s
}

// sameNIC reports whether the VMM's device cur is already what want asks for.
func sameNIC(want NIC, cur chapi.NetConfig) bool {
	w := netConfig(want)
	return w.IP == cur.IP && w.Tap == cur.Tap
}

// seedKey is the authorized_keys line the seed carries: --seed-pubkey is
// either that line or a file holding it. None: the seed authorizes no key,
// and only keys the image holds let vm exec in.
func (m *Manager) seedKey() (string, error) {
	k := strings.TrimSpace(m.cfg.SeedPubKey)
	if k == "" {
		return "", nil
	}
	if strings.Contains(k, " ") {
		return k, nil
	}
	b, err := os.ReadFile(k)
	if err != nil {
		return "", fmt.Errorf("seed public key: %w", err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if line == "" {
		return "", fmt.Errorf("seed public key %s is empty", k)
	}
	return strings.TrimSpace(line), nil
}

// guestHostname turns a VM name into a host name cloud-init accepts: lower
// case letters, digits and '-', at most 63.
func guestHostname(v *VM) string {
	var b strings.Builder
	for _, r := range strings.ToLower(v.Name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	h := strings.Trim(b.String(), "-")
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-")
	}
	if h == "" {
		h = "vm-" + strings.ToLower(v.ID[:8])
	}
	return h
}

// seedConfig is v's cloud-init identity. The instance id follows the name
// (cidata's default, "vmchaos-" + host name), so a later cold boot of a
// woken VM is the same instance to cloud-init and keeps its host keys. The
// host key is v's own (hostKeyFile), which vm exec pins; a VM made before
// vmctl kept host keys gets one here.
func (m *Manager) seedConfig(v *VM) (cidata.CloudInit, error) {
	key, err := m.seedKey()
	if err != nil {
		return cidata.CloudInit{}, err
	}
	hk, _, err := m.hostKey(v.ID)
	if errors.Is(err, os.ErrNotExist) {
		if err = m.writeHostKey(v.ID, nil); err == nil {
			hk, _, err = m.hostKey(v.ID)
		}
	}
	if err != nil {
		return cidata.CloudInit{}, err
	}
	ci := cidata.CloudInit{Hostname: guestHostname(v), SSHHostKey: hk}
	if key != "" {
		ci.SSHAuthorizedKeys = []string{key}
	}
	if m.cfg.GuestNet == GuestNetDHCP {
		return ci, nil // no interfaces: DHCP on every ethernet device
	}
	for i, n := range v.Network {
		if n.Tap == "" {
			continue
		}
		ones, _ := net.IPMask(net.ParseIP(n.Mask).To4()).Size()
		gi := cidata.GuestInterface{MAC: n.MAC, Address: n.IP + "/" + strconv.Itoa(ones)}
		if i == 0 {
			// One default route: through the first NIC's host side.
			gi.Gateway = n.HostIP
		}
		ci.Interfaces = append(ci.Interfaces, gi)
	}
	return ci, nil
}

// writeSeed (re)writes v's seed: deterministic bytes for the same record.
func (m *Manager) writeSeed(v *VM) error {
	ci, err := m.seedConfig(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(m.vmDir(v.ID), 0o755); err != nil {
		return err
	}
	return cidata.BuildCIData(m.vmSeed(v.ID), ci)
}

// dialGuest opens the TCP connection vm exec speaks SSH over: from inside
// --netns when the guests' TAPs live there, else from here.
func (m *Manager) dialGuest(ctx context.Context, addr string) (net.Conn, error) {
	if m.cfg.Netns == "" {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	ns, err := vmnet.OpenNetns(m.cfg.Netns)
	if err != nil {
		return nil, err
	}
	return ns.DialContext(ctx, "tcp", addr)
}
