package fakech

import (
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// listenGuest opens the guest's sshd listener at addr (ip:port) in the
// network namespace the VMM runs in. For a loopback address it first brings
// that namespace's lo up if it is down: a manager that starts each VMM in a
// netns of its own (cocoon's CNI provider, network/cni/create_linux.go
// `netns.NewNamed`) leaves lo down there, without even 127.0.0.1 (the
// kernel adds it when lo first goes up), where a real guest would have its
// own kernel and its own lo. The fake guest shares the VMM's namespace, so
// that lo stands in for the guest's; bringing it up touches nothing outside
// that namespace, and is a no-op where lo is up (the host's, realch's).
func (v *VMM) listenGuest(addr string) (net.Listener, error) {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		if a, err := netip.ParseAddr(host); err == nil && a.IsLoopback() {
			up, err := loopbackUp()
			switch {
			case err != nil:
				v.log.warnf("guest address %s: lo of the VMM's network namespace: %v", addr, err)
			case up:
				v.log.infof("guest address %s: brought up lo of the VMM's network namespace (it was down)", addr)
			}
		}
	}
	return net.Listen("tcp4", addr)
}

// loopbackUp sets IFF_UP on lo; true when it was down.
func loopbackUp() (bool, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return false, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return false, fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	flags := ifr.Uint16()
	if flags&unix.IFF_UP != 0 {
		return false, nil
	}
	ifr.SetUint16(flags | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return false, fmt.Errorf("SIOCSIFFLAGS lo: %w", err)
	}
	return true, nil
}
