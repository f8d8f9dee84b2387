package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/timescale"
	"golang.org/x/crypto/ssh"
)

// CommandError is a guest command that ran and exited non-zero. It is
// definitive (the guest answered), so it is never retried.
type CommandError struct {
	Guest  string
	Cmd    string
	Status int
	Stderr string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("guest %s: %q exited %d: %s", e.Guest, e.Cmd, e.Status, strings.TrimSpace(e.Stderr))
}

// ErrHarnessSSH marks a failure on the harness's side of the SSH session:
// its own key refused by the guest the run seeded with it, a guest it
// named without an address, its own journal not written. A verdict that
// needed the session then proves nothing about the product (a harness
// error); a guest that does not answer, answers with another host key or
// runs the command and fails is the product's.
var ErrHarnessSSH = errors.New("the harness's own ssh failed")

// Backoff bounds for reaching a guest that is still waking up: the first
// retry comes quickly (a restored guest usually answers within its resume
// time), later ones spread out so a slow real boot is not hammered. Both are
// scaled with VMCHAOS_TIME_SCALE like every other product timer; the floors
// keep a tiny scale from turning the loop into a spin.
const (
	backoffFirst    = 50 * time.Millisecond
	backoffMax      = 2 * time.Second
	backoffFirstMin = 5 * time.Millisecond
	backoffMaxMin   = 50 * time.Millisecond
)

// DefaultAttemptTimeout bounds one connect + handshake + command batch. A
// guest that accepts TCP but never answers (paused, wedged) costs one attempt,
// not the whole context. It is not scaled: SSH handshakes and guest syncs take
// real time whatever the simulated clock says.
const DefaultAttemptTimeout = 10 * time.Second

// exec runs cmds in order, each in its own session on one connection to g,
// and returns their stdout. A batch that fails on the way (refused connect,
// handshake cut, session without an exit status) is retried whole with
// backoff until ctx ends, so every batch must be idempotent; a command that
// exits non-zero and a changed host key end it at once.
func (l *Ledger) exec(ctx context.Context, g Guest, cmds ...string) ([]string, error) {
	if err := checkGuest(g); err != nil {
		return nil, err
	}
	delay := max(timescale.D(backoffFirst), backoffFirstMin)
	ceiling := max(timescale.D(backoffMax), backoffMaxMin)
	start := time.Now()
	for attempt := 1; ; attempt++ {
		out, err := l.attempt(ctx, g, cmds)
		if err == nil {
			return out, nil
		}
		var ce *CommandError
		if errors.Is(err, ErrHostKeyChanged) || errors.As(err, &ce) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("guest %s at %s: unreachable after %d attempt(s) over %s: %w (last error: %v)",
				g.Name, g.Addr, attempt, time.Since(start).Round(time.Millisecond), ctx.Err(), err)
		}
		if serr := timescale.SleepRaw(ctx, delay); serr != nil {
			return nil, fmt.Errorf("guest %s at %s: unreachable after %d attempt(s) over %s: %w (last error: %v)",
				g.Name, g.Addr, attempt, time.Since(start).Round(time.Millisecond), serr, err)
		}
		delay = min(delay*2, ceiling)
	}
}

// attempt is one connection to g running cmds.
func (l *Ledger) attempt(ctx context.Context, g Guest, cmds []string) ([]string, error) {
	actx, cancel := context.WithTimeout(ctx, l.AttemptTimeout)
	defer cancel()
	client, stop, err := l.dialClient(actx, g)
	if err != nil {
		return nil, err
	}
	defer stop()
	defer client.Close()
	out := make([]string, 0, len(cmds))
	for _, cmd := range cmds {
		s, err := run(client, g.Name, cmd)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// dialClient connects to g and completes the SSH handshake with the pinned
// host key. The connection is closed when actx ends (the only way to
// interrupt a handshake or a session blocked on a guest that stopped
// answering); stop detaches that.
func (l *Ledger) dialClient(actx context.Context, g Guest) (*ssh.Client, func() bool, error) {
	dial := l.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	conn, err := dial(actx, "tcp", g.Addr)
	if err != nil {
		return nil, nil, fmt.Errorf("guest %s: connect: %w", g.Name, err)
	}
	stop := context.AfterFunc(actx, func() { conn.Close() })
	cfg := &ssh.ClientConfig{
		User:            l.User,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(l.key.Signer())},
		HostKeyCallback: l.pins.hostKeyCallback(g.Name),
		// ed25519 only: the pin is an ed25519 key (fake images carry
		// one, cloud images generate one), and offering one algorithm
		// keeps a guest from answering with a different key type that
		// the pin check would have to treat as unknown.
		HostKeyAlgorithms: []string{ssh.KeyAlgoED25519},
	}
	sc, chans, reqs, err := ssh.NewClientConn(conn, g.Addr, cfg)
	if err != nil {
		stop()
		conn.Close()
		if errors.Is(err, ErrHostKeyChanged) {
			return nil, nil, err
		}
		if strings.Contains(err.Error(), "unable to authenticate") {
			// the guest answered and refused the run's own key
			return nil, nil, fmt.Errorf("guest %s at %s: ssh handshake: %w: %w", g.Name, g.Addr, ErrHarnessSSH, err)
		}
		return nil, nil, fmt.Errorf("guest %s at %s: ssh handshake: %w", g.Name, g.Addr, err)
	}
	return ssh.NewClient(sc, chans, reqs), stop, nil
}

// run executes one command in a new session and returns its stdout.
func run(c *ssh.Client, guest, cmd string) (string, error) {
	sess, err := c.NewSession()
	if err != nil {
		return "", fmt.Errorf("guest %s: open session: %w", guest, err)
	}
	defer sess.Close()
	var stdout, stderr bytes.Buffer
	sess.Stdout = &stdout
	sess.Stderr = &stderr
	err = sess.Run(cmd)
	var ee *ssh.ExitError
	if errors.As(err, &ee) {
		return "", &CommandError{Guest: guest, Cmd: cmd, Status: ee.ExitStatus(), Stderr: stderr.String()}
	}
	if err != nil {
		// Includes *ssh.ExitMissingError: the connection went away before
		// the command reported, so whether it ran is unknown; the batch is
		// idempotent and is retried.
		return "", fmt.Errorf("guest %s: %q: %w", guest, cmd, err)
	}
	return stdout.String(), nil
}
