package vmctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"golang.org/x/crypto/ssh"
)

// ExecOptions configure `vm exec`.
type ExecOptions struct {
	User    string        // default root
	Timeout time.Duration // connect timeout (default 10s)
}

// Exec runs argv in the guest over SSH to its first NIC and returns the
// command's exit status. The host key is pinned: for a fake image it is the
// key inside the VM's disk; otherwise the first key seen is stored in the
// VM's dir and required afterwards.
func (m *Manager) Exec(ctx context.Context, ref string, argv []string, stdout, stderr io.Writer, o ExecOptions) (int, error) {
	if len(argv) == 0 {
		return 0, fmt.Errorf("%w: exec needs a command", ErrUsage)
	}
	v, err := m.resolveVM(ref)
	if err != nil {
		return 0, err
	}
	if v.State != StateRunning {
		return 0, fmt.Errorf("exec: "+MsgVMNotRunningState, v.ID, v.State)
	}
	if !m.vmmAlive(v) {
		return 0, fmt.Errorf("exec: "+MsgVMNotRunningPid, v.ID, v.Pid)
	}
	if len(v.Network) == 0 {
		return 0, fmt.Errorf("exec: vm %s has no network interface", v.ID)
	}
	if err := m.unpauseIfOwnerless(ctx, v.ID); err != nil {
		return 0, fmt.Errorf("exec: %w", err)
	}
	cfg, err := m.sshConfig(v, &o)
	if err != nil {
		return 0, err
	}
	client, err := m.sshConnect(ctx, v, cfg, o.Timeout)
	if err != nil {
		return 0, err
	}
	defer client.Close()
	return runSSH(ctx, client, v.ID, argv, stdout, stderr)
}

// sshConfig is the SSH client config of an exec into v: the identity's key,
// the pinned host key, and o's user and connect timeout (defaults filled in).
func (m *Manager) sshConfig(v *VM, o *ExecOptions) (*ssh.ClientConfig, error) {
	if m.cfg.Identity == "" {
		return nil, fmt.Errorf("exec: no SSH identity (set --identity or VMCTL_SSH_KEY)")
	}
	keyPEM, err := os.ReadFile(m.cfg.Identity)
	if err != nil {
		return nil, fmt.Errorf("exec: identity: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("exec: identity %s: %w", m.cfg.Identity, err)
	}
	hostKey, err := m.hostKeyCallback(v)
	if err != nil {
		return nil, err
	}
	if o.User == "" {
		o.User = "root"
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	return &ssh.ClientConfig{User: o.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hostKey, Timeout: o.Timeout}, nil
}

// sshConnect dials v's first NIC and completes the SSH handshake, both
// within timeout.
func (m *Manager) sshConnect(ctx context.Context, v *VM, cfg *ssh.ClientConfig, timeout time.Duration) (*ssh.Client, error) {
	addr := v.Network[0].Address()
	dctx, dcancel := context.WithTimeout(ctx, timeout)
	conn, err := m.dialGuest(dctx, addr)
	dcancel()
	if err != nil {
		return nil, fmt.Errorf("exec %s: dial %s: %w", v.ID, addr, err)
	}
	// The handshake gets the connect budget too: a guest that accepts but
	// never answers (paused, wedged) must not hang the verb.
	_ = conn.SetDeadline(time.Now().Add(timeout))
	sc, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("exec %s: ssh %s: %w", v.ID, addr, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(sc, chans, reqs), nil
}

// runSSH runs argv in a session of client and returns its exit status; the
// end of ctx closes the client, which ends the session.
func runSSH(ctx context.Context, client *ssh.Client, id string, argv []string, stdout, stderr io.Writer) (int, error) {
	sess, err := client.NewSession()
	if err != nil {
		return 0, fmt.Errorf("exec %s: session: %w", id, err)
	}
	defer sess.Close()
	sess.Stdout, sess.Stderr = stdout, stderr
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			client.Close()
		case <-done:
		}
	}()
	err = sess.Run(strings.Join(argv, " "))
	var ee *ssh.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee):
		return ee.ExitStatus(), nil
	default:
		return 0, fmt.Errorf("exec %s: %w", id, err)
	}
}

// unpauseIfOwnerless converges an orphaned pause before talking to the
// guest (a Paused guest cannot answer SSH). Only with the ops lock free: a
// held lock may be a live capture (which resumes by itself, and whose long
// vm.snapshot would stall our vm.info), and a free lock proves the pause
// has no owner.
func (m *Manager) unpauseIfOwnerless(ctx context.Context, id string) error {
	l, err := lockFile(ctx, m.opsLockPath(id), exclusive, false)
	if err != nil {
		return nil
	}
	defer l.Unlock()
	c := chapi.New(m.apiSocket(id))
	actx, cancel := context.WithTimeout(ctx, apiTimeout())
	defer cancel()
	info, err := c.Info(actx)
	if err != nil || info.State != chapi.StatePaused {
		return nil
	}
	return m.convergeOrphanedPause(actx, c, id)
}

func (m *Manager) hostKeyCallback(v *VM) (ssh.HostKeyCallback, error) {
	disk := m.vmDisk(v.ID)
	if guestimg.IsFakeImage(disk) {
		img, err := guestimg.Load(disk)
		if err != nil {
			return nil, fmt.Errorf("exec: %w", err)
		}
		pk, err := img.HostPublicKey()
		if err != nil {
			return nil, fmt.Errorf("exec: %w", err)
		}
		return ssh.FixedHostKey(pk), nil
	}
	// Trust on first use, stored next to the VM's disk.
	known := filepath.Join(m.vmDir(v.ID), "known_host_key")
	return func(_ string, _ net.Addr, key ssh.PublicKey) error {
		b, err := os.ReadFile(known)
		if errors.Is(err, os.ErrNotExist) {
			return durable.WriteFile(known, ssh.MarshalAuthorizedKey(key), 0o644)
		}
		if err != nil {
			return err
		}
		pinned, _, _, _, err := ssh.ParseAuthorizedKey(b)
		if err != nil {
			return fmt.Errorf("pinned host key %s: %w", known, err)
		}
		if !bytes.Equal(pinned.Marshal(), key.Marshal()) {
			return fmt.Errorf("guest host key changed (pinned in %s)", known)
		}
		return nil
	}, nil
}
