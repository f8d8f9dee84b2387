package nodeagent_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/stackbin"
	"github.com/vmchaos/vmchaos/vmctl"
	"golang.org/x/crypto/ssh"
)

// The end-to-end tests run the real nodeagent, vmctl and fakech binaries at
// time scale 0.05. Restarting the agent is plain: kill it by pid, start it
// again on the same state dir.

const testScale = "0.05"

// stack is one node: a vmctl store with a base snapshot, an agent state dir,
// a registry dir and a failpoint control dir.
type stack struct {
	t        testing.TB
	bin      string
	dir      string
	root     string
	state    string
	registry string
	ctl      string
	env      []string
	agent    *agentProc
	base     string // base snapshot name intents clone from
	flags    []string
	httpc    *http.Client
}

type agentProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func randomPool() string {
	a, _ := rand.Int(rand.Reader, big.NewInt(100))
	b, _ := rand.Int(rand.Reader, big.NewInt(250))
	return fmt.Sprintf("127.%d.%d.0/24", 100+a.Int64(), 1+b.Int64())
}

func newStack(t testing.TB) *stack {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: end-to-end, real processes; run without -short")
	}
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatalf("stack binaries: %v", err)
	}
	d, err := os.MkdirTemp("", "na")
	if err != nil {
		t.Fatal(err)
	}
	s := &stack{t: t, bin: bin, dir: d, root: filepath.Join(d, "root"), state: filepath.Join(d, "state"),
		registry: filepath.Join(d, "registry"), ctl: filepath.Join(d, "ctl"), base: "base-snap"}
	if err := os.MkdirAll(s.ctl, 0o755); err != nil {
		t.Fatal(err)
	}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	blk, err := ssh.MarshalPrivateKey(priv, "nodeagent test")
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(d, "id_ed25519")
	if err := os.WriteFile(key, pem.EncodeToMemory(blk), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, _ := ssh.NewSignerFromKey(priv)
	image := filepath.Join(d, "guest.img")
	if _, err := guestimg.Build(image, guestimg.Options{AuthorizedKeys: []string{strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))}}); err != nil {
		t.Fatal(err)
	}
	s.env = []string{
		"PATH=" + bin + ":" + os.Getenv("PATH"),
		"VMCTL_ROOT_DIR=" + s.root,
		"VMCTL_RUN_DIR=" + filepath.Join(d, "run"),
		"VMCTL_CH_BINARY=cloud-hypervisor",
		"VMCTL_SSH_KEY=" + key,
		"VMCTL_SEED_PUBKEY=" + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))),
		"VMCTL_NET_POOL=" + randomPool(),
		"VMCHAOS_TIME_SCALE=" + testScale,
		"VMCHAOS_FAILPOINT_CTL=" + s.ctl,
		"HOME=" + d,
	}
	t.Cleanup(s.cleanup)
	s.vmctl("vm", "run", "--name", "base", image)
	s.vmctl("snapshot", "save", "--name", s.base, "base")
	s.vmctl("vm", "rm", "--force", "base")
	return s
}

// stackPids finds every process of this stack: they all carry our
// VMCTL_ROOT_DIR in their environment (agent, vmctl children, VMMs).
func (s *stack) stackPids() []int {
	want := []byte("VMCTL_ROOT_DIR=" + s.root + "\x00")
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(b, want) && alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

func (s *stack) cleanup() {
	if s.agent != nil {
		s.killAgent()
	}
	for i := 0; i < 20; i++ {
		pids := s.stackPids()
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !s.t.Failed() {
		// With the store gone, a gc of the same root path knows no VM: it
		// removes the (now empty) per-VM cgroups and their parent.
		os.RemoveAll(s.root)
		_, _, _ = s.vmctlResult("gc")
		os.RemoveAll(s.dir)
	} else {
		s.t.Logf("stack kept at %s", s.dir)
	}
}

// alive reports whether pid runs (a zombie counts as dead).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}

func (s *stack) vmctlResult(args ...string) (string, string, error) {
	cmd := exec.Command(filepath.Join(s.bin, "vmctl"), args...)
	cmd.Env = append(os.Environ(), s.env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	return o.String(), e.String(), err
}

func (s *stack) vmctl(args ...string) string {
	s.t.Helper()
	o, e, err := s.vmctlResult(args...)
	if err != nil {
		s.t.Fatalf("vmctl %s: %v\n%s", strings.Join(args, " "), err, e)
	}
	return o
}

func (s *stack) vms() []vmctl.VM {
	s.t.Helper()
	var out []vmctl.VM
	if err := json.Unmarshal([]byte(s.vmctl("vm", "list", "-o", "json")), &out); err != nil {
		s.t.Fatal(err)
	}
	return out
}

func (s *stack) snapshots() []vmctl.Snapshot {
	s.t.Helper()
	var out []vmctl.Snapshot
	if err := json.Unmarshal([]byte(s.vmctl("snapshot", "list", "-o", "json")), &out); err != nil {
		s.t.Fatal(err)
	}
	return out
}

// startAgent starts nodeagent with the stack env plus extra env and flags.
func (s *stack) startAgent(extraEnv []string, extraFlags ...string) {
	s.t.Helper()
	if s.agent != nil {
		s.t.Fatal("agent already running")
	}
	args := append([]string{"--state-dir", s.state, "--registry-dir", s.registry, "--metrics-addr", "127.0.0.1:0",
		"--vmctl", filepath.Join(s.bin, "vmctl"),
		"--retry-base", "2s", "--retry-max", "10s", "--busy-create-tick", "1s", "--ready-budget", "60s",
		"--lease-wait", "60s", "--watch-interval", "1s"}, s.flags...)
	args = append(args, extraFlags...)
	cmd := exec.Command(filepath.Join(s.bin, "nodeagent"), args...)
	cmd.Env = append(append(os.Environ(), s.env...), extraEnv...)
	logPath := filepath.Join(s.dir, fmt.Sprintf("agent-%d.log", time.Now().UnixNano()))
	lf, err := os.Create(logPath)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	lf.Close()
	p := &agentProc{cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); close(p.done) }()
	s.agent = p
	s.t.Cleanup(func() {
		if s.t.Failed() {
			b, _ := os.ReadFile(logPath)
			s.t.Logf("agent log %s:\n%s", logPath, tail(string(b), 6000))
		}
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// waitAPI waits until the agent answers on its socket.
func (s *stack) waitAPI() {
	s.t.Helper()
	s.eventually("agent API up", 60*time.Second, func() error {
		select {
		case <-s.agent.done:
			b, _ := os.ReadFile(s.agent.log)
			s.t.Fatalf("agent exited: %s\n%s", s.agent.cmd.ProcessState, tail(string(b), 4000))
		default:
		}
		_, _, err := s.api("GET", "/v1/vms", nil)
		return err
	})
}

func (s *stack) killAgent() {
	s.signalAgent(syscall.SIGKILL)
}

func (s *stack) signalAgent(sig syscall.Signal) {
	s.t.Helper()
	p := s.agent
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		s.t.Fatalf("agent did not exit after %v", sig)
	}
	s.agent = nil
}

func (s *stack) client() *http.Client {
	if s.httpc != nil {
		return s.httpc
	}
	sock := filepath.Join(s.state, nodeagent.SocketName)
	s.httpc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true, // an agent restart must never meet a stale connection
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}}
	return s.httpc
}

// api sends one request; body may be a string (raw) or a value (JSON).
func (s *stack) api(method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, "http://agent"+path, rd)
	resp, err := s.client().Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

func (s *stack) put(name string, in nodeagent.Intent) nodeagent.VMView {
	s.t.Helper()
	code, b, err := s.api("PUT", "/v1/vms/"+name, in)
	if err != nil || code/100 != 2 {
		s.t.Fatalf("PUT %s: %d %s %v", name, code, b, err)
	}
	var v nodeagent.VMView
	_ = json.Unmarshal(b, &v)
	return v
}

func (s *stack) get(name string) (nodeagent.VMView, bool) {
	s.t.Helper()
	code, b, err := s.api("GET", "/v1/vms/"+name, nil)
	if err != nil {
		s.t.Fatalf("GET %s: %v", name, err)
	}
	if code == http.StatusNotFound {
		return nodeagent.VMView{}, false
	}
	var v nodeagent.VMView
	if err := json.Unmarshal(b, &v); err != nil {
		s.t.Fatalf("GET %s: %d %s", name, code, b)
	}
	return v, true
}

func (s *stack) eventually(what string, budget time.Duration, f func() error) {
	s.t.Helper()
	deadline := time.Now().Add(budget)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: not reached within %v: %v", what, budget, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitGoal waits until name reached lifecycle want at its current generation.
func (s *stack) waitGoal(name, want string, budget time.Duration) nodeagent.VMView {
	s.t.Helper()
	var v nodeagent.VMView
	s.eventually(name+" "+want, budget, func() error {
		var ok bool
		v, ok = s.get(name)
		if !ok {
			return fmt.Errorf("unknown")
		}
		if v.Status.Lifecycle != want || v.Status.ObservedGeneration != v.Generation || v.Op != "" {
			return fmt.Errorf("lifecycle %q gen %d/%d op %q msg %q", v.Status.Lifecycle, v.Status.ObservedGeneration, v.Generation, v.Op, v.Status.Message)
		}
		return nil
	})
	return v
}

func (s *stack) waitGone(name string, budget time.Duration) {
	s.t.Helper()
	s.eventually(name+" forgotten", budget, func() error {
		if v, ok := s.get(name); ok {
			return fmt.Errorf("still there: %+v", v.Status)
		}
		return nil
	})
}

// guest runs a command in the VM over SSH (vmctl vm exec).
func (s *stack) guest(id string, argv ...string) (string, error) {
	o, e, err := s.vmctlResult(append([]string{"vm", "exec", id, "--"}, argv...)...)
	if err != nil {
		return o, fmt.Errorf("%v: %s", err, e)
	}
	return o, nil
}

// scrape reads the agent's metrics through its HTTP endpoint and parses them
// with expfmt: name → label string → value.
func (s *stack) scrape() map[string]map[string]float64 {
	s.t.Helper()
	b, err := os.ReadFile(filepath.Join(s.state, nodeagent.MetricsAddrName))
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := http.Get("http://" + strings.TrimSpace(string(b)) + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	samples, err := nodeagent.ParseMetricsText(resp.Body)
	if err != nil {
		s.t.Fatalf("metrics do not parse: %v", err)
	}
	out := map[string]map[string]float64{}
	for _, sm := range samples {
		if out[sm.Name] == nil {
			out[sm.Name] = map[string]float64{}
		}
		out[sm.Name][sm.Key()] = sm.Value
	}
	return out
}

func sum(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}

func (s *stack) vmByName(name string) *vmctl.VM {
	for _, v := range s.vms() {
		if v.Name == name {
			return &v
		}
	}
	return nil
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func errorf(format string, a ...any) error { return fmt.Errorf(format, a...) }

// checkStore runs `vmctl check`: no tombstone, no orphan VMM, no paused
// running VM, no pending snapshot without a lease holder, nothing leftover.
func (s *stack) checkStore() {
	s.t.Helper()
	if o, e, err := s.vmctlResult("check"); err != nil {
		s.t.Fatalf("vmctl check: %v\n%s%s", err, o, e)
	}
}
