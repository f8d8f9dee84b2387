package conformance_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/internal/lockedbuf"
	"github.com/vmchaos/vmchaos/realch"
	"github.com/vmchaos/vmchaos/stackbin"
)

// fakechBin is the real fakech binary: $VMCHAOS_BIN's, or built once.
var fakechBin string

func TestMain(m *testing.M) { os.Exit(stackbin.Main(m, "fakech", &fakechBin)) }

// target is one binary a row runs against: fakech, or the cloud-hypervisor
// VMCHAOS_CH names.
type target struct {
	name    string // "fakech" or "ch"
	bin     string
	version string // the --version token, "v53.0"
	major   int
	env     []string
	real    bool
	// guest is "" when a row that boots a guest can run on this target,
	// else the reason it cannot (the KVM preflight's verdict). snapshot is
	// the same for a row that takes a snapshot (realch.SnapshotBlock).
	guest, snapshot string
}

// need is what a row needs beyond the VMM process itself.
type need int

const (
	needNothing  need = iota // API socket, config, CLI: no vCPU ever runs
	needGuest                // a booted guest
	needSnapshot             // a booted guest and a working vm.snapshot
)

// skipNoCH is why every real-CH subtest skips when no binary was named.
const skipNoCH = "VMCHAOS_CH is not set: point it at a cloud-hypervisor binary " +
	"(VMCHAOS_CH=/path/to/cloud-hypervisor make conformance) to run every row of the suite against the real CH too"

// chTarget is the real binary, discovered once: nil with the skip reason
// when VMCHAOS_CH (or VMCHAOS_CH_BINARY, which wins, as in realch) is unset;
// an error when it is set but unusable (the user asked for that binary).
var chTarget = sync.OnceValues(func() (*target, error) {
	bin := os.Getenv(realch.EnvCHBinary)
	if bin == "" {
		bin = os.Getenv(realch.EnvCHShort)
	}
	if bin == "" {
		return nil, nil
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return nil, fmt.Errorf("VMCHAOS_CH=%s: %w", bin, err)
	}
	out, err := exec.Command(abs, "--version").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("VMCHAOS_CH=%s: --version: %w (%s)", bin, err, out)
	}
	tok, v, err := realch.ParseVersion(string(out))
	if err != nil {
		return nil, fmt.Errorf("VMCHAOS_CH=%s: %w", bin, err)
	}
	tg := &target{name: "ch", bin: abs, version: tok, major: v.Major, real: true,
		env: []string{"PATH=" + os.Getenv("PATH")}}
	tg.guest, tg.snapshot = realReasons(tok)
	return tg, nil
})

// realReasons is the preflight's answer for rows that need a guest or a
// snapshot on the real binary. The suite boots no real guest itself (that is
// realch's specs' job, behind the same preflight), so on a host whose KVM is
// usable the reason says that instead.
func realReasons(version string) (guest, snapshot string) {
	kvm := realch.PreflightKVM(realch.DevKVM)
	if kvm.OK {
		guest = "needs a guest: this suite boots no real guest (KVM is usable here: " + kvm.Detail + "; realch's specs boot one)"
	} else {
		guest = "needs a guest: preflight " + kvm.String()
	}
	n := realch.ProbeNestedState(realch.DevKVM)
	if block := realch.SnapshotBlock(version, n.Cap(), realch.IsPVMHost()); block != "" {
		snapshot = "needs snapshot: preflight " + block
	} else {
		snapshot = "needs snapshot (and so " + guest + ")"
	}
	return guest, snapshot
}

// fakeTarget is fakech speaking the release of the real binary under test
// (v51–v53), or v53 when there is none or it is outside that range.
func fakeTarget(t *testing.T) *target {
	major := 53
	if ch, err := chTarget(); err == nil && ch != nil && ch.major >= 51 && ch.major <= 53 {
		major = ch.major
	}
	compat := "v" + strconv.Itoa(major)
	return &target{name: "fakech", bin: fakechBin, version: compat + ".0", major: major,
		env: []string{"PATH=" + os.Getenv("PATH"), "VMCHAOS_TIME_SCALE=0.01", "FAKECH_COMPAT=" + compat}}
}

// TestRealCH is the real binary's half of the suite in one line: it skips
// with how to run it when VMCHAOS_CH is unset, fails when VMCHAOS_CH names
// something that does not answer --version, and otherwise says what the rows
// will run against and why some of them will skip.
func TestRealCH(t *testing.T) {
	tg, err := chTarget()
	switch {
	case err != nil:
		t.Fatal(err)
	case tg == nil:
		t.Skip(skipNoCH)
	}
	if tg.major == 0 {
		t.Fatalf("%s: no major version in %q", tg.bin, tg.version)
	}
	t.Logf("cloud-hypervisor %s (%s); rows that need a guest: %s; rows that need a snapshot: %s", tg.version, tg.bin, tg.guest, tg.snapshot)
}

// row runs fn as a subtest on fakech and on the real binary. A row that
// needs a guest or a snapshot passes fn == nil: the fakech side is pinned by
// the fakech tests the docs table names, and the real side skips with the
// preflight's reason (or, where a guest could run, says the suite has no
// driver for it): a skip, never a pass.
func row(t *testing.T, n need, fn func(t *testing.T, tg *target)) {
	t.Helper()
	if fn != nil {
		t.Run("fakech", func(t *testing.T) { fn(t, fakeTarget(t)) })
	}
	if tg, err := chTarget(); err == nil && tg == nil {
		// No real binary: TestRealCH says so once, rather than one skip
		// per row in every `make test`. A row with nothing to run on
		// fakech here must not pass empty.
		if fn == nil {
			t.Skip("nothing to run here without a real binary (the fakech side is the fakech tests the docs table names); " + skipNoCH)
		}
		return
	}
	t.Run("ch", func(t *testing.T) {
		tg, err := chTarget()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("cloud-hypervisor %s (%s)", tg.version, tg.bin)
		switch {
		case n == needSnapshot:
			t.Skip(tg.snapshot)
		case n == needGuest:
			t.Skip(tg.guest)
		case fn == nil:
			t.Fatal("a row with no check must need a guest or a snapshot")
		}
		fn(t, tg)
	})
}

// proc is one VMM process a test started; Cleanup kills and reaps it.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	out    *lockedbuf.Buffer
	done   chan struct{}
	err    error
	target *target
}

// sockDir is a short directory for API sockets (sun_path is 108 bytes and
// t.TempDir embeds the test name).
func sockDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "cf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func start(t *testing.T, tg *target, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(tg.bin, args...)
	cmd.Env = tg.env
	p := &proc{t: t, cmd: cmd, out: &lockedbuf.Buffer{}, done: make(chan struct{}), target: tg}
	cmd.Stdout = p.out
	cmd.Stderr = p.out
	// The kernel kills the VMM if this test process dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", tg.name, err)
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
			t.Logf("%s %v output:\n%s", tg.name, args, p.out.String())
		}
	})
	return p
}

// startAPI starts the VMM in API-only mode on sock and waits for vmm.ping.
func startAPI(t *testing.T, tg *target, sock string, extra ...string) *proc {
	t.Helper()
	p := start(t, tg, append([]string{"--api-socket", "path=" + sock}, extra...)...)
	p.waitPing(sock)
	return p
}

func (p *proc) waitPing(sock string) {
	p.t.Helper()
	deadline := time.Now().Add(20 * time.Second) // safety net only
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			p.t.Fatalf("%s exited before its API answered: %v\n%s", p.target.name, p.err, p.out.String())
		default:
		}
		if r, err := try(sock, "GET", "vmm.ping", ""); err == nil && r.status == 200 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.t.Fatalf("%s: vmm.ping never answered on %s\n%s", p.target.name, sock, p.out.String())
}

// wait returns the exit status, or -N for death by signal N.
func (p *proc) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second): // safety net only
		p.t.Fatalf("%s did not exit\n%s", p.target.name, p.out.String())
	}
	if p.err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -int(ws.Signal())
		}
		return ee.ExitCode()
	}
	p.t.Fatalf("wait: %v", p.err)
	return -1000
}

func (p *proc) signal(s syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		p.t.Fatalf("signal %v: %v", s, err)
	}
}

// resp is one HTTP answer, read off the wire byte for byte.
type resp struct {
	statusLine string
	status     int
	header     http.Header
	body       []byte
}

// msgs is the error body as CH's chain of messages (nil when not a list).
func (r resp) msgs() []string {
	var m []string
	if err := jsonUnmarshal(r.body, &m); err != nil {
		return nil
	}
	return m
}

// try sends one request on a fresh connection: method to /api/v1/<ep>, with
// body when it is not "".
func try(sock, method, ep, body string) (resp, error) {
	req := fmt.Sprintf("%s /api/v1/%s HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n", method, ep)
	if body != "" {
		req += fmt.Sprintf("Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	return tryRaw(sock, req+"\r\n"+body)
}

// tryRaw writes req as is and reads one response.
func tryRaw(sock, req string) (resp, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return resp{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // safety net only
	go func() { _, _ = io.WriteString(c, req) }()
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return resp{}, fmt.Errorf("read status line: %w", err)
	}
	r := resp{statusLine: strings.TrimRight(line, "\r\n"), header: http.Header{}}
	if f := strings.Fields(r.statusLine); len(f) >= 2 {
		r.status, _ = strconv.Atoi(f[1])
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return r, fmt.Errorf("read header: %w", err)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		k, v, _ := strings.Cut(line, ":")
		r.header.Add(k, strings.TrimSpace(v))
	}
	if cl := r.header.Get("Content-Length"); cl != "" {
		n, err := strconv.Atoi(cl)
		if err != nil {
			return r, fmt.Errorf("Content-Length %q: %w", cl, err)
		}
		r.body = make([]byte, n)
		if _, err := io.ReadFull(br, r.body); err != nil {
			return r, fmt.Errorf("read body: %w", err)
		}
	}
	return r, nil
}

// call is try that fails the test when no answer came.
func call(t *testing.T, sock, method, ep, body string) resp {
	t.Helper()
	r, err := try(sock, method, ep, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, ep, err)
	}
	return r
}

func callRaw(t *testing.T, sock, req string) resp {
	t.Helper()
	r, err := tryRaw(sock, req)
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	return r
}
