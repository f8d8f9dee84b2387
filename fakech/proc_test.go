package fakech_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/internal/lockedbuf"
	"github.com/vmchaos/vmchaos/stackbin"
	"golang.org/x/crypto/ssh"
)

// fakechBin is the real binary under test: $VMCHAOS_BIN/fakech when set,
// else a fresh build of ./cmd/fakech (only that package, so a colleague's
// half-written package elsewhere cannot break these tests).
var fakechBin string

func TestMain(m *testing.M) { os.Exit(stackbin.Main(m, "fakech", &fakechBin)) }

// proc is one fakech process started by a test; Cleanup kills and reaps it.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	sock   string
	stderr *lockedbuf.Buffer
	done   chan struct{}
	err    error
}

// vmDir makes <tmp>/<VMID>/ the way vmctl lays out a VM's run dir (fakech
// reports the parent dir name as the VM id in its trace).
func vmDir(t testing.TB, id string) string {
	// Unix socket paths are limited to 108 bytes; t.TempDir() embeds the
	// (long) test name, so use a short temp root.
	root, err := os.MkdirTemp("", "fk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	d := filepath.Join(root, id)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// baseEnv is the environment every fakech gets: fast time unless overridden.
func baseEnv(extra ...string) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "VMCHAOS_TIME_SCALE=0.01"}
	return append(env, extra...)
}

// start launches fakech with args and env; sock is the API socket path (may be
// "" when the test does not talk to the API).
func start(t *testing.T, sock string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(fakechBin, args...)
	cmd.Env = env
	p := &proc{t: t, cmd: cmd, sock: sock, stderr: &lockedbuf.Buffer{}, done: make(chan struct{})}
	cmd.Stdout = p.stderr
	cmd.Stderr = p.stderr
	// The kernel kills fakech if this test process dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start fakech: %v", err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("fakech %v output:\n%s", args, p.stderr.String())
		}
	})
	return p
}

// startReady starts fakech and waits until vmm.ping answers.
func startReady(t *testing.T, sock string, env []string, args ...string) (*proc, *chapi.Client) {
	t.Helper()
	p := start(t, sock, env, args...)
	c := chapi.New(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("fakech not ready: %v\n%s", err, p.stderr.String())
	}
	// CH serves the API before the command-line VM exists.
	if slices.ContainsFunc(args, func(a string) bool { return a == "--firmware" || a == "--kernel" || a == "--restore" }) {
		if _, err := c.WaitVM(ctx); err != nil {
			t.Fatalf("fakech's command-line VM never appeared: %v\n%s", err, p.stderr.String())
		}
	}
	return p, c
}

// wait returns the exit status (-1 for a signal death), failing the test
// after a generous safety timeout.
func (p *proc) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.t.Fatalf("fakech did not exit\n%s", p.stderr.String())
	}
	if p.err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	p.t.Fatalf("wait: %v", p.err)
	return -2
}

func (p *proc) kill9() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// guestKit is a fake guest image and the client key it authorizes.
type guestKit struct {
	img    *guestimg.Image
	path   string
	signer ssh.Signer
}

func newGuest(t testing.TB, dir string) *guestKit {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "guest.img")
	line := string(bytes.TrimSpace(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	img, err := guestimg.Build(path, guestimg.Options{AuthorizedKeys: []string{line}, Hostname: "fk-" + filepath.Base(dir), SSHPort: freePortHint()})
	if err != nil {
		t.Fatal(err)
	}
	return &guestKit{img: img, path: path, signer: signer}
}

// freePortHint returns a port number for the guest's sshd; with a unique
// loopback address per test any port works; the default is 22, a real guest's.
func freePortHint() int { return guestimg.DefaultSSHPort }

// loopbackIP returns a random 127.x.y.z outside vmctl's default pool
// (127.77/16), so parallel tests and colleagues' tests do not collide.
func loopbackIP() string {
	return fmt.Sprintf("127.%d.%d.%d", 100+mrand.IntN(100), mrand.IntN(256), 1+mrand.IntN(254))
}

// sshRun runs cmd in the guest at ip with the host key pinned to the image's
// and returns stdout, stderr and the exit status.
func (k *guestKit) sshRun(t *testing.T, ip, cmd string) (string, string, int) {
	t.Helper()
	out, errOut, status, err := k.trySSH(ip, cmd, 20*time.Second)
	if err != nil {
		t.Fatalf("ssh %s %q: %v", ip, cmd, err)
	}
	return out, errOut, status
}

func (k *guestKit) trySSH(ip, cmd string, timeout time.Duration) (string, string, int, error) {
	hk, err := k.img.HostPublicKey()
	if err != nil {
		return "", "", 0, err
	}
	cfg := &ssh.ClientConfig{
		User:            "root",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(k.signer)},
		HostKeyCallback: ssh.FixedHostKey(hk),
		Timeout:         timeout,
	}
	addr := net.JoinHostPort(ip, strconv.Itoa(k.img.SSHPort))
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", "", 0, err
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	cc, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		return "", "", 0, err
	}
	cl := ssh.NewClient(cc, chans, reqs)
	defer cl.Close()
	s, err := cl.NewSession()
	if err != nil {
		return "", "", 0, err
	}
	defer s.Close()
	var o, e bytes.Buffer
	s.Stdout, s.Stderr = &o, &e
	err = s.Run(cmd)
	var ee *ssh.ExitError
	if errors.As(err, &ee) {
		return o.String(), e.String(), ee.ExitStatus(), nil
	}
	if err != nil {
		return o.String(), e.String(), 0, err
	}
	return o.String(), e.String(), 0, nil
}

// bootArgs is the CLI a manager uses to boot a VM from the guest image.
func bootArgs(sock, img, ip string, extra ...string) []string {
	args := []string{"--api-socket", "path=" + sock, "--firmware", "/nonexistent/CLOUDHV.fd", "--disk", "path=" + img, "--console", "off", "--serial", "null"}
	if ip != "" {
		args = append(args, "--net", "tap=,ip="+ip+",mask=255.255.255.0")
	}
	return append(args, extra...)
}
