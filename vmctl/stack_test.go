package vmctl

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/internal/lockedbuf"
	"github.com/vmchaos/vmchaos/stackbin"
	"golang.org/x/crypto/ssh"
)

// The end-to-end tests run the real vmctl and fakech binaries.

var (
	binOnce  sync.Once
	binDir   string
	binErr   error
	binBuilt bool // binDir is ours to remove
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binBuilt {
		// Safety net: nothing started from our private bin dir may outlive
		// the package (each test already tore its own processes down).
		killFromDir(binDir)
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// killFromDir SIGKILLs every process whose argv[0] lies in dir — only
// binaries this test process built there, so only processes it started or
// their descendants.
func killFromDir(dir string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if argv := readCmdline(pid); len(argv) > 0 && filepath.Dir(argv[0]) == dir {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// stackBin returns a dir holding vmctl and cloud-hypervisor (fakech). With
// VMCHAOS_BIN set it is stackbin's; otherwise only the two binaries this
// package needs are built, so a colleague's half-written cmd cannot break us.
func stackBin(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if os.Getenv(stackbin.Env) != "" {
			binDir, binErr = stackbin.Dir()
			return
		}
		d, err := os.MkdirTemp("", "vmctl-bin-")
		if err != nil {
			binErr = err
			return
		}
		cmd := exec.Command("go", "build", "-o", d+"/", "./cmd/vmctl", "./cmd/fakech")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		b, err := os.ReadFile(filepath.Join(d, "fakech"))
		if err == nil {
			err = os.WriteFile(filepath.Join(d, "cloud-hypervisor"), b, 0o755)
		}
		binDir, binErr, binBuilt = d, err, true
	})
	if binErr != nil {
		t.Fatalf("stack binaries: %v", binErr)
	}
	return binDir
}

// stack is one vmctl store with its own root, run dir, address pool, guest
// image and SSH key.
type stack struct {
	t     testing.TB
	bin   string
	root  string
	key   string
	image string
	env   []string
	ctl   string // failpoint control dir
	m     *Manager
}

func randomPool() string {
	a, _ := rand.Int(rand.Reader, big.NewInt(100))
	b, _ := rand.Int(rand.Reader, big.NewInt(250))
	return fmt.Sprintf("127.%d.%d.0/24", 100+a.Int64(), 1+b.Int64())
}

func newStack(t testing.TB, scale string, extraEnv ...string) *stack {
	t.Helper()
	s := &stack{t: t, bin: stackBin(t)}
	d, err := os.MkdirTemp("", "vc")
	if err != nil {
		t.Fatal(err)
	}
	s.root = filepath.Join(d, "root")
	s.ctl = filepath.Join(d, "ctl")
	if err := os.MkdirAll(s.ctl, 0o755); err != nil {
		t.Fatal(err)
	}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	blk, err := ssh.MarshalPrivateKey(priv, "vmctl test")
	if err != nil {
		t.Fatal(err)
	}
	s.key = filepath.Join(d, "id_ed25519")
	if err := os.WriteFile(s.key, pem.EncodeToMemory(blk), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, _ := ssh.NewSignerFromKey(priv)
	s.image = filepath.Join(d, "guest.img")
	// The image authorizes no key: the guest takes the key from its seed,
	// as a cloud image does.
	if _, err := guestimg.Build(s.image, guestimg.Options{}); err != nil {
		t.Fatal(err)
	}
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	pool := randomPool()
	s.env = append([]string{
		"PATH=" + s.bin + ":" + os.Getenv("PATH"),
		"VMCTL_ROOT_DIR=" + s.root,
		"VMCTL_CH_BINARY=cloud-hypervisor",
		"VMCTL_SSH_KEY=" + s.key,
		"VMCTL_SEED_PUBKEY=" + pub,
		"VMCTL_NET_POOL=" + pool,
		"VMCHAOS_TIME_SCALE=" + scale,
		"VMCHAOS_FAILPOINT_CTL=" + s.ctl,
		"HOME=" + d,
	}, extraEnv...)
	s.m, err = New(Config{RootDir: s.root, CHBinary: filepath.Join(s.bin, "cloud-hypervisor"), NetPool: pool, Identity: s.key, SeedPubKey: pub})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Nothing of this stack may outlive the test: every VMM is found by
		// its api.sock under our run dir and killed through a pidfd.
		for id, pids := range s.m.findVMMs() {
			for _, p := range pids {
				_ = s.m.killVMM(context.Background(), p, id)
			}
		}
		removeStoreCgroups(s.m)
		if !t.Failed() {
			os.RemoveAll(d)
		} else {
			t.Logf("stack kept at %s", d)
		}
	})
	return s
}

type result struct {
	stdout, stderr string
	code           int
	signal         syscall.Signal
}

func (r result) String() string {
	return fmt.Sprintf("exit %d sig %v\nstdout: %s\nstderr: %s", r.code, r.signal, r.stdout, r.stderr)
}

func (s *stack) command(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, "vmctl"), args...)
	cmd.Env = append(append(os.Environ(), s.env...), env...)
	// If the test binary dies (a panic, the go test timeout) no vmctl it
	// started may keep running, parked or waiting on a lock.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// run runs vmctl to completion with extra env.
func (s *stack) runEnv(env []string, args ...string) result {
	s.t.Helper()
	cmd := s.command(env, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	// A safety net, not a timing assert: a verb stuck on a lock fails the
	// test with its output instead of hanging the package.
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("vmctl %v: %v", args, err)
	}
	timer := time.AfterFunc(2*time.Minute, func() { _ = cmd.Process.Kill() })
	err := cmd.Wait()
	if !timer.Stop() {
		s.t.Fatalf("vmctl %v: still running after 2 minutes (killed); stderr: %s", args, e.String())
	}
	r := result{stdout: o.String(), stderr: e.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.signal = ws.Signal()
		}
	} else if err != nil {
		s.t.Fatalf("vmctl %v: %v", args, err)
	}
	return r
}

func (s *stack) run(args ...string) result { s.t.Helper(); return s.runEnv(nil, args...) }

// ok runs vmctl and requires exit 0, returning stdout.
func (s *stack) ok(args ...string) string {
	s.t.Helper()
	r := s.run(args...)
	if r.code != 0 || r.signal != 0 {
		s.t.Fatalf("vmctl %s: %s", strings.Join(args, " "), r)
	}
	return r.stdout
}

// fails runs vmctl and requires exit 1 with "Error: " and want in stderr.
func (s *stack) fails(want string, args ...string) result {
	s.t.Helper()
	r := s.run(args...)
	if r.code != 1 || !strings.HasPrefix(r.stderr, "Error: ") && !strings.Contains(r.stderr, "\nError: ") || !strings.Contains(r.stderr, want) {
		s.t.Fatalf("vmctl %s: want exit 1 with %q, got %s", strings.Join(args, " "), want, r)
	}
	return r
}

// proc is a vmctl started in the background; it is killed and reaped at
// cleanup.
type proc struct {
	cmd    *exec.Cmd
	stdout *lockedbuf.Buffer
	stderr *lockedbuf.Buffer
	done   chan struct{}
	state  *os.ProcessState // set before done closes
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits for the exit and returns its result.
func (p *proc) wait(t testing.TB) result {
	t.Helper()
	eventually(t, "background vmctl exit", p.exited)
	r := result{stdout: p.stdout.String(), stderr: p.stderr.String(), code: p.state.ExitCode()}
	if ws, ok := p.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		r.signal = ws.Signal()
	}
	return r
}

func (s *stack) background(env []string, args ...string) *proc {
	s.t.Helper()
	p := &proc{cmd: s.command(env, args...), stdout: &lockedbuf.Buffer{}, stderr: &lockedbuf.Buffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.state = p.cmd.ProcessState
		close(p.done)
	}()
	s.t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

func (s *stack) vm(ref string) *VM {
	s.t.Helper()
	var v VM
	if err := json.Unmarshal([]byte(s.ok("vm", "inspect", ref, "-o", "json")), &v); err != nil {
		s.t.Fatal(err)
	}
	return &v
}

func (s *stack) list() []VM {
	s.t.Helper()
	var vs []VM
	if err := json.Unmarshal([]byte(s.ok("vm", "list", "-o", "json")), &vs); err != nil {
		s.t.Fatal(err)
	}
	return vs
}

func (s *stack) snaps() []Snapshot {
	s.t.Helper()
	var ss []Snapshot
	if err := json.Unmarshal([]byte(s.ok("snapshot", "list", "-o", "json")), &ss); err != nil {
		s.t.Fatal(err)
	}
	return ss
}

// runVM boots a VM and waits until its guest answers over SSH.
func (s *stack) runVM(name string) *VM {
	s.t.Helper()
	id := strings.TrimSpace(s.ok("vm", "run", "--name", name, s.image))
	s.waitGuest(id)
	return s.vm(id)
}

// waitGuest retries `vm exec hostname` until the guest's sshd answers.
func (s *stack) waitGuest(ref string) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := s.run("vm", "exec", ref, "--", "hostname")
		if r.code == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("guest %s never answered: %s", ref, r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// check requires `vmctl check` to report a consistent store.
func (s *stack) check() {
	s.t.Helper()
	r := s.run("check")
	if r.code != 0 {
		s.t.Fatalf("store inconsistent: %s", r)
	}
}

// trace listens on a unixgram socket for failpoint events.
type trace struct {
	mu     sync.Mutex
	events []failpoint.Event
	conn   *net.UnixConn
	path   string
}

func newTrace(t testing.TB) *trace {
	d, err := os.MkdirTemp("", "vt")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(d, "trace.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: p, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	tr := &trace{conn: c, path: p}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if e, err := failpoint.ParseEvent(buf[:n]); err == nil {
				tr.mu.Lock()
				tr.events = append(tr.events, e)
				tr.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { c.Close(); <-done; os.RemoveAll(d) })
	return tr
}

func (tr *trace) env() string { return failpoint.EnvTrace + "=" + tr.path }

// count returns how many events of point were seen.
func (tr *trace) count(point string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, e := range tr.events {
		if e.Point == point {
			n++
		}
	}
	return n
}

func (tr *trace) snapshot() []failpoint.Event {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]failpoint.Event(nil), tr.events...)
}

// eventually polls cond until it holds or a generous safety timeout passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// removeStoreCgroups removes the (empty, once its VMMs are dead) per-VM
// cgroups of m's store and their parent.
func removeStoreCgroups(m *Manager) {
	parent, err := m.cgroupParent()
	if err != nil {
		return
	}
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		if e.IsDir() {
			_ = m.removeVMMCgroup(e.Name())
		}
	}
	_ = syscall.Rmdir(parent)
}
