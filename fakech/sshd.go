package fakech

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"golang.org/x/crypto/ssh"
)

// nicSet owns the guest's network presence: one TCP listener per guest
// address (ip:SSHPort), shared by the NICs that carry that address. A NIC
// without ip= has no listener.
type nicSet struct {
	v     *VMM
	mu    sync.Mutex
	byID  map[string]string         // NIC id → listener address ("" when unbound)
	byAdr map[string]*guestListener // address → listener
}

type guestListener struct {
	addr  string
	ln    net.Listener
	nics  map[string]bool
	mu    sync.Mutex
	conns map[net.Conn]context.CancelFunc
	done  chan struct{} // closed when the accept loop has returned
}

func newNICSet(v *VMM) *nicSet {
	return &nicSet{v: v, byID: map[string]string{}, byAdr: map[string]*guestListener{}}
}

// port is where this guest's sshd listens on each of its addresses.
func (g *guest) port() int {
	if g != nil && g.base != nil && g.base.SSHPort > 0 {
		return g.base.SSHPort
	}
	return guestimg.DefaultSSHPort
}

// openPort makes each NIC's address answer on port. strict: a bind failure
// fails the whole call (and undoes it); otherwise the NIC stays unbound and a
// warning is logged (restore of a snapshot whose source VM still holds the
// address; the manager replaces NICs after a restore anyway).
func (s *nicSet) openPort(nets []chapi.NetConfig, port int, strict bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var added []string
	for _, n := range nets {
		ip := n.IP
		switch {
		case ip == "":
			// A TAP-only NIC (tap=,mac= without ip=): a real guest gets its
			// address from its seed or DHCP; the fake guest takes it from
			// its cloud-init seed, else from the MAC (guestAddrFromMAC).
			ip = s.v.tapAddr(n.Mac)
		case n.Tap != "":
			// ip= of a TAP NIC is the host side of the TAP (vmctl's tap
			// mode): the guest answers where it configures itself.
			if a := s.v.tapGuestAddr(n); a != "" {
				ip = a
			}
		}
		if ip == "" {
			s.byID[n.ID] = ""
			added = append(added, n.ID)
			continue
		}
		addr := net.JoinHostPort(ip, strconv.Itoa(port))
		gl := s.byAdr[addr]
		if gl == nil {
			ln, err := s.v.listenGuest(addr)
			if err != nil {
				if strict {
					for _, id := range added {
						s.closeLocked(id)
					}
					return fmt.Errorf("guest address %s: %w", addr, err)
				}
				s.v.log.warnf("NIC %s: guest address %s not reachable: %v", n.ID, addr, err)
				s.byID[n.ID] = ""
				continue
			}
			gl = &guestListener{addr: addr, ln: ln, nics: map[string]bool{}, conns: map[net.Conn]context.CancelFunc{}, done: make(chan struct{})}
			s.byAdr[addr] = gl
			go s.acceptLoop(gl)
		}
		gl.nics[n.ID] = true
		s.byID[n.ID] = addr
		added = append(added, n.ID)
	}
	return nil
}

// close removes one NIC; its address stops answering when no other NIC
// carries it, and the connections through it are dropped.
func (s *nicSet) close(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked(id)
}

func (s *nicSet) closeLocked(id string) {
	addr, ok := s.byID[id]
	delete(s.byID, id)
	if !ok || addr == "" {
		return
	}
	gl := s.byAdr[addr]
	if gl == nil {
		return
	}
	delete(gl.nics, id)
	if len(gl.nics) > 0 {
		return
	}
	delete(s.byAdr, addr)
	gl.ln.Close()
	<-gl.done
	gl.dropConns()
}

func (s *nicSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.byID {
		s.closeLocked(id)
	}
}

// dropConns ends every guest connection (the guest rebooted) but keeps the
// listeners.
func (s *nicSet) dropConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, gl := range s.byAdr {
		gl.dropConns()
	}
}

func (gl *guestListener) dropConns() {
	gl.mu.Lock()
	defer gl.mu.Unlock()
	for c, cancel := range gl.conns {
		cancel()
		c.Close()
		delete(gl.conns, c)
	}
}

func (s *nicSet) acceptLoop(gl *guestListener) {
	defer close(gl.done)
	for {
		c, err := gl.ln.Accept()
		if err != nil {
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		gl.mu.Lock()
		gl.conns[c] = cancel
		gl.mu.Unlock()
		go func() {
			defer func() {
				cancel()
				c.Close()
				gl.mu.Lock()
				delete(gl.conns, c)
				gl.mu.Unlock()
			}()
			g := s.v.guest.Load()
			if g == nil {
				return
			}
			serveSSH(ctx, g, c)
		}()
	}
}

// serveSSH is the guest's sshd on one connection. It answers nothing until
// the guest runs and has booted: a paused or booting guest just hangs its
// clients, as a real one does.
func serveSSH(ctx context.Context, g *guest, c net.Conn) {
	if err := g.wait(ctx); err != nil {
		return
	}
	keyPEM, ok := g.hostKey()
	if !ok {
		return // no host key in the image: no sshd
	}
	signer, err := ssh.ParsePrivateKey(keyPEM)
	if err != nil {
		return
	}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			want := key.Marshal()
			rest := g.authorizedKeys()
			for len(rest) > 0 {
				k, _, _, next, err := ssh.ParseAuthorizedKey(rest)
				if err != nil {
					break
				}
				if bytes.Equal(k.Marshal(), want) {
					return &ssh.Permissions{}, nil
				}
				rest = next
			}
			return nil, fmt.Errorf("key not in %s", guestimg.AuthorizedKeysPath)
		},
		ServerVersion: "SSH-2.0-OpenSSH_9.2p1 fakech",
	}
	cfg.AddHostKey(signer)
	sconn, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	defer sconn.Close()
	go ssh.DiscardRequests(reqs)
	var wg sync.WaitGroup
	defer wg.Wait()
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only session channels")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			session(ctx, g, ch, creqs)
		}()
	}
}

// session serves exec requests; the command's status goes back as the SSH
// exit-status request.
func session(ctx context.Context, g *guest, ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for req := range reqs {
		switch req.Type {
		case "env":
			_ = req.Reply(true, nil)
		case "exec":
			var p struct{ Command string }
			if err := ssh.Unmarshal(req.Payload, &p); err != nil {
				_ = req.Reply(false, nil)
				continue
			}
			_ = req.Reply(true, nil)
			status := g.run(ctx, p.Command, ch, ch.Stderr())
			_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(status)}))
			return
		default:
			_ = req.Reply(false, nil)
		}
	}
}

// guestAddrFromMAC is the fake guest's address on a NIC given without ip=:
// 127.B3.B4.B5 from the MAC's last three bytes, in the network namespace the
// VMM runs in. vmctl's tap plan derives the MAC the same way from the guest
// address (52:54:00 + its last three octets), so with a 127.0.0.0/8 pool the
// fake guest answers where a real one would after cloud-init. "" for a MAC
// that does not parse, or one whose address would be 127.0.0.0.
func guestAddrFromMAC(mac string) string {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 || hw[3]|hw[4]|hw[5] == 0 {
		return ""
	}
	return fmt.Sprintf("127.%d.%d.%d", hw[3], hw[4], hw[5])
}

// tapGuestAddr is the fake guest's address on a TAP NIC whose ip= is the
// host side: the loopback address its cloud-init seed gives the MAC, else,
// on a point-to-point /30 (vmnet.PlanNIC's, as DHCP on that TAP hands it
// out), the /30's other host address. "" keeps ip= (a TAP NIC given some
// other mask: fakech's stand-in for a guest at ip=, as realch's launch
// tests use it).
func (v *VMM) tapGuestAddr(n chapi.NetConfig) string {
	if hw, err := net.ParseMAC(n.Mac); err == nil {
		if ip := v.seed[hw.String()]; ip != "" && checkAddr(ip) == nil {
			return ip
		}
	}
	host, err := netip.ParseAddr(n.IP)
	if err != nil || !host.Is4() || n.Mask != "255.255.255.252" {
		return ""
	}
	b := host.As4()
	switch b[3] % 4 {
	case 1:
		b[3]++
	case 2:
		b[3]--
	default: // the /30's network or broadcast address: no host side
		return ""
	}
	return netip.AddrFrom4(b).String()
}

// tapAddr is the fake guest's address on a TAP-only NIC: the seed's static
// address for its MAC when that is a loopback one, else guestAddrFromMAC.
func (v *VMM) tapAddr(mac string) string {
	if hw, err := net.ParseMAC(mac); err == nil {
		if ip := v.seed[hw.String()]; ip != "" && checkAddr(ip) == nil {
			return ip
		}
	}
	return guestAddrFromMAC(mac)
}
