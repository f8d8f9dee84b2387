package vmctl

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/durable"
	"golang.org/x/crypto/ssh"
)

// ExecOptions configure `vm exec`.
type ExecOptions struct {
	User    string        // default root
	Timeout time.Duration // connect timeout (default 10s)
}

// Exec runs argv in the guest over SSH to its first NIC and returns the
// command's exit status. The host key is pinned: the one the VM's seed gave
// the guest (hostKeyFile).
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
	if o.User == "" {
		o.User = "root"
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	cfg, err := m.sshConfig(v, o)
	if err != nil {
		return 0, err
	}
	addr := v.Network[0].Address()
	dctx, dcancel := context.WithTimeout(ctx, o.Timeout)
	conn, err := m.dialGuest(dctx, addr)
	dcancel()
	if err != nil {
		return 0, fmt.Errorf("exec %s: dial %s: %w", v.ID, addr, err)
	}
	// The handshake gets the connect budget too: a guest that accepts but
	// never answers (paused, wedged) must not hang the verb.
	_ = conn.SetDeadline(time.Now().Add(o.Timeout))
	sc, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		return 0, fmt.Errorf("exec %s: ssh %s: %w", v.ID, addr, err)
	}
	_ = conn.SetDeadline(time.Time{})
	client := ssh.NewClient(sc, chans, reqs)
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		return 0, fmt.Errorf("exec %s: session: %w", v.ID, err)
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
		return 0, fmt.Errorf("exec %s: %w", v.ID, err)
	}
}

// sshConfig logs in as o.User with --identity and pins v's host key.
func (m *Manager) sshConfig(v *VM, o ExecOptions) (*ssh.ClientConfig, error) {
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
	// Only the pinned key's algorithm: a guest that also holds keys of
	// other types must present this one.
	return &ssh.ClientConfig{User: o.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hostKey,
		HostKeyAlgorithms: []string{ssh.KeyAlgoED25519}, Timeout: o.Timeout}, nil
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

// guestSSHPort is where vm exec (and the agent's workload) reach every
// guest's sshd: the port a real guest's listens on.
const guestSSHPort = 22

// hostKeyFile is the VM's SSH host key (ed25519, OpenSSH PEM) in its dir.
// vmctl makes it at create, a clone takes its snapshot's (the restored guest
// runs with it), and every seed hands it to the guest (cloud-init ssh_keys),
// so vm exec pins the same key for every guest, fake or real.
const hostKeyFile = "ssh_host_ed25519_key"

func (m *Manager) vmHostKey(id string) string { return filepath.Join(m.vmDir(id), hostKeyFile) }

// writeHostKey stores pemKey as VM id's host key, or a new key when pemKey is
// nil. The caller syncs the VM dir.
func (m *Manager) writeHostKey(id string, pemKey []byte) error {
	if pemKey == nil {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return fmt.Errorf("host key: %w", err)
		}
		blk, err := ssh.MarshalPrivateKey(priv, "vmctl guest host key")
		if err != nil {
			return fmt.Errorf("host key: %w", err)
		}
		pemKey = pem.EncodeToMemory(blk)
	}
	if err := os.MkdirAll(m.vmDir(id), 0o755); err != nil {
		return fmt.Errorf("host key: %w", err)
	}
	if err := durable.WriteFile(m.vmHostKey(id), pemKey, 0o600); err != nil {
		return fmt.Errorf("host key: %w", err)
	}
	return nil
}

// hostKey returns VM id's host key as PEM and its signer.
func (m *Manager) hostKey(id string) ([]byte, ssh.Signer, error) {
	b, err := os.ReadFile(m.vmHostKey(id))
	if err != nil {
		return nil, nil, fmt.Errorf("host key: %w", err)
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, nil, fmt.Errorf("host key %s: %w", m.vmHostKey(id), err)
	}
	return b, s, nil
}

// hostKeyCallback pins the host key v's seed gave its guest.
func (m *Manager) hostKeyCallback(v *VM) (ssh.HostKeyCallback, error) {
	_, s, err := m.hostKey(v.ID)
	if err != nil {
		return nil, fmt.Errorf("exec %s: %w", v.ID, err)
	}
	return ssh.FixedHostKey(s.PublicKey()), nil
}
