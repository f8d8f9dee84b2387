package fakech

import (
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/vmchaos/vmchaos/chapi"
)

// serialSocket is --serial socket=P. CH binds it when the VM is created or
// restored (console_devices.rs pre_create_console_devices: a plain
// UnixListener::bind, no unlink first) and removes the file only when the
// serial manager is dropped (serial_manager.rs Drop): a clean shutdown. A
// kill -9 leaves the file, and the next start on that path fails with
// "Address already in use" (v51 through v53).
type serialSocket struct {
	ln    *net.UnixListener
	path  string
	mu    sync.Mutex
	conns map[net.Conn]bool
	done  chan struct{}
}

// openSerial binds the serial socket of cfg, if it has one and it is not
// bound yet. The caller holds v.mu.
func (v *VMM) openSerial(cfg *chapi.VmConfig) error {
	if cfg == nil || cfg.Serial == nil || cfg.Serial.Mode != "Socket" || cfg.Serial.Socket == "" || v.serial != nil {
		return nil
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Serial.Socket, Net: "unix"})
	if err != nil {
		return chainErr{"Error creating console devices", "Error creating console device", osErrText(err)}
	}
	ln.SetUnlinkOnClose(false)
	s := &serialSocket{ln: ln, path: cfg.Serial.Socket, conns: map[net.Conn]bool{}, done: make(chan struct{})}
	go s.accept()
	v.serial = s
	return nil
}

func (s *serialSocket) accept() {
	defer close(s.done)
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
	}
}

// write sends a console line to every connected client.
func (s *serialSocket) write(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if _, err := c.Write([]byte(line)); err != nil {
			c.Close()
			delete(s.conns, c)
		}
	}
}

// closeSerial is the serial manager's drop: listener closed, file removed.
// The caller holds v.mu (or the process is exiting).
func (v *VMM) closeSerial() {
	s := v.serial
	if s == nil {
		return
	}
	v.serial = nil
	s.ln.Close()
	<-s.done
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	if err := os.Remove(s.path); err != nil && !os.IsNotExist(err) {
		v.log.warnf("serial socket %s: %v", s.path, err)
	}
}

// chainErr is a multi-level CH error chain below the request's context.
type chainErr []string

func (c chainErr) Error() string { return fmt.Sprint([]string(c)) }

// chainOf returns err's chain elements (one element for a plain error).
func chainOf(err error) []string {
	if c, ok := err.(chainErr); ok {
		return c
	}
	return []string{err.Error()}
}
