package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/vmchaos/vmchaos/durable"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	"golang.org/x/sys/unix"
)

// ErrHostKeyChanged means a guest offered a host key other than the one
// pinned at first contact. It is never retried: either another machine
// answers at the guest's address, or the guest is not the one the ledger
// wrote its markers into, and either way its listing would be meaningless.
var ErrHostKeyChanged = errors.New("guest host key changed")

// pinFile keeps the guest host keys of one run in known_hosts format, one
// line per guest name. Pins are keyed by guest name, not address: a woken
// guest may come back on another address, and a clone keeps its image's host
// key, so the name is what identifies the machine across hibernate and wake.
type pinFile struct {
	path string
}

// check accepts key for guest if it matches the pin, or pins it when the
// guest has none yet. The file is flocked around read-check-append so two
// ledgers of one run cannot pin different keys for one guest.
func (p pinFile) check(guest, addr string, key ssh.PublicKey) error {
	f, b, err := p.lockAndRead()
	if err != nil {
		return err
	}
	defer f.Close()
	pinned, note, err := lookupPin(b, guest)
	if err != nil {
		return fmt.Errorf("host key pins %s: %w", p.path, err)
	}
	if pinned != nil {
		if bytes.Equal(pinned.Marshal(), key.Marshal()) {
			return nil
		}
		return fmt.Errorf("%w: guest %s at %s offered %s %s but %s pinned %s at first contact (%s); refusing to talk to it — "+
			"another machine answers at this address or the guest is not the one the ledger wrote into "+
			"(delete its line from the pins file only if the guest was rebuilt on purpose)",
			ErrHostKeyChanged, guest, addr, key.Type(), ssh.FingerprintSHA256(key),
			p.path, ssh.FingerprintSHA256(pinned), note)
	}
	line := knownhosts.Line([]string{guest}, key) + " first-contact=" + addr + "@" + time.Now().UTC().Format(time.RFC3339)
	if err := durable.AppendLine(p.path, []byte(line)); err != nil {
		return fmt.Errorf("host key pins: %w", err)
	}
	return nil
}

// drop removes guest's pin, rewriting the file atomically under the lock.
func (p pinFile) drop(guest string) error {
	f, b, err := p.lockAndRead()
	if err != nil {
		return err
	}
	defer f.Close()
	want := knownhosts.Normalize(guest)
	var keep []byte
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if f := bytes.Fields(line); len(f) > 0 && string(f[0]) == want {
			continue
		}
		keep = append(keep, line...)
	}
	if len(keep) == len(b) {
		return nil
	}
	return durable.WriteFile(p.path, keep, 0o644)
}

// lock opens the pins file and flocks it. drop replaces the file by rename,
// so a lock won on an inode that is no longer at the path guards nothing:
// the open is retried until the locked inode is the one at the path.
// lockAndRead locks the pins file and reads it whole: check and drop both
// decide on the contents they hold the lock over. The caller closes f.
func (p pinFile) lockAndRead() (f *os.File, b []byte, err error) {
	f, err = p.lock()
	if err != nil {
		return nil, nil, err
	}
	b, err = io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("host key pins %s: %w", p.path, err)
	}
	return f, b, nil
}

func (p pinFile) lock() (*os.File, error) {
	for {
		f, err := os.OpenFile(p.path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("host key pins: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("host key pins %s: lock: %w", p.path, err)
		}
		var held, now unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("host key pins %s: %w", p.path, err)
		}
		if unix.Stat(p.path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return f, nil
		}
		f.Close()
	}
}

// lookupPin finds the pinned key of guest in known_hosts content.
func lookupPin(b []byte, guest string) (ssh.PublicKey, string, error) {
	want := knownhosts.Normalize(guest)
	rest := b
	for len(bytes.TrimSpace(rest)) > 0 {
		_, hosts, key, comment, next, err := ssh.ParseKnownHosts(rest)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, "", err
		}
		for _, h := range hosts {
			if h == want {
				return key, comment, nil
			}
		}
		rest = next
	}
	return nil, "", nil
}

// hostKeyCallback binds the pin check to one guest.
func (p pinFile) hostKeyCallback(guest string) ssh.HostKeyCallback {
	return func(_ string, remote net.Addr, key ssh.PublicKey) error {
		return p.check(guest, remote.String(), key)
	}
}
