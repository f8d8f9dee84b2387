package powercut

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/lazyfs"
	"github.com/vmchaos/vmchaos/lazyfs/privatens"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/scenarios/stack"
	"github.com/vmchaos/vmchaos/stackbin"
)

func TestMain(m *testing.M) {
	if code, done := privatens.Reexec(); done {
		os.Exit(code)
	}
	code := m.Run()
	stackbin.Cleanup()
	if variantDir != "" {
		_ = os.RemoveAll(variantDir)
	}
	os.Exit(code)
}

// variantDir holds the test-only variants, each built once per test binary.
var (
	variantDir  string
	variantBins = map[string]string{}
)

// node is one vmctl store whose root is a lazy filesystem.
type node struct {
	t          testing.TB
	vmctl      string
	root, run  string
	state, reg string // the agent's state dir and registry
	env        []string
	lazy       *Node
	img        string
	violations []string
}

func newNode(t testing.TB, vmctl string) *node { return newNodeOn(t, vmctl, true) }

// newNodeOn builds a store whose root is a lazy filesystem, or (lazy
// false: the benchmark's baseline) a plain dir.
func newNodeOn(t testing.TB, vmctl string, lazy bool) *node {
	t.Helper()
	if why := lazyfs.Available(); why != "" {
		t.Skip("missing host feature: " + why + ": run as root on a host with /dev/fuse (modprobe fuse)")
	}
	bins, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	// short: the VMMs' api sockets live under the run dir (sun_path is 108 bytes)
	tmp, err := os.MkdirTemp("/tmp", "vpc")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, vmctl: vmctl, root: filepath.Join(tmp, "root"), run: filepath.Join(tmp, "run"),
		state: filepath.Join(tmp, "state"), reg: filepath.Join(tmp, "registry")}
	if err := os.MkdirAll(n.run, 0o755); err != nil {
		t.Fatal(err)
	}
	fw := filepath.Join(tmp, "CLOUDHV.fd")
	if err := os.WriteFile(fw, []byte("fake firmware\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	key, err := ledger.NewKey(filepath.Join(tmp, "key")) // the agent's post-clone work logs into the guest
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(tmp, "guest.img")
	if _, err := guestimg.Build(img, guestimg.Options{Hostname: "powercut", AuthorizedKeys: []string{key.AuthorizedKey()}}); err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	_, _ = rand.Read(b[:])
	n.env = append(os.Environ(), "VMCTL_ROOT_DIR="+n.root, "VMCTL_RUN_DIR="+n.run,
		"VMCTL_CH_BINARY="+filepath.Join(bins, "cloud-hypervisor"), "VMCTL_FIRMWARE="+fw,
		fmt.Sprintf("VMCTL_NET_POOL=127.248.%d.0/24", b[0]), "VMCHAOS_TIME_SCALE=0.05", envNodeTag+"="+n.run,
		"VMCTL_SSH_KEY="+key.PrivatePath())
	durable := []string{n.root, n.state, n.reg}
	if !lazy {
		for _, d := range durable {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		durable = nil
	}
	if n.lazy, err = Mount(durable, []string{n.run}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.lazy.Cut(context.Background(), n.procs()); err != nil { // stops every process of the node
			t.Errorf("teardown: %v; users of %s: %v", err, tmp, users(tmp))
		}
		_ = n.lazy.Unmount()
		_ = os.RemoveAll(tmp)
	})
	n.env = append(n.env, "POWERCUT_IMAGE="+img)
	n.img = img
	return n
}

func (n *node) vmctlRun(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, n.vmctl, args...)
	c.Env = n.env
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("vmctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// ack runs an operation that must succeed before the cut: its exit 0 is
// the acknowledgement the cut must not undo.
func (n *node) ack(args ...string) {
	n.t.Helper()
	if _, err := n.vmctlRun(args...); err != nil {
		n.t.Fatal(err)
	}
}

// check records a violation of what a power cut must keep.
func (n *node) check(ok bool, format string, a ...any) {
	if !ok {
		n.violations = append(n.violations, fmt.Sprintf(format, a...))
	}
}

type vmRec struct {
	ID, Name, State string
	Pid             int
}

func (n *node) list() ([]vmRec, error) {
	b, err := n.vmctlRun("vm", "list", "-o", "json")
	if err != nil {
		return nil, err
	}
	var vs []vmRec
	if err := json.Unmarshal(b, &vs); err != nil {
		return nil, fmt.Errorf("vm list: %w (%.200s)", err, b)
	}
	return vs, nil
}

// procs are the live processes of this node: every process whose
// environment carries the node's tag (the test sets it on everything it
// starts; vmctl's children and VMMs inherit it), the way the injector finds
// the processes of a run.
func (n *node) procs() []injector.Proc {
	tag := []byte(envNodeTag + "=" + n.run)
	es, _ := os.ReadDir("/proc")
	var out []injector.Proc
	for _, e := range es {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
		if !slices.ContainsFunc(bytes.Split(b, []byte{0}), func(kv []byte) bool { return bytes.Equal(kv, tag) }) {
			continue
		}
		if p, err := injector.Identify(pid); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// envNodeTag marks every process of a test node.
const envNodeTag = "VMCHAOS_POWERCUT_NODE"

// scenario acknowledges creates, a snapshot and a delete, cuts the power
// (every VMM SIGKILLed with the store), and checks what must survive:
// every acknowledged VM and snapshot, no acknowledged-deleted VM, every
// record's data usable (the VMs boot from their disks, the snapshot
// clones), and vmctl's own invariants.
func (n *node) scenario() {
	n.ack("vm", "run", "--name", "a", n.img)
	n.ack("snapshot", "save", "--name", "s1", "a")
	n.ack("vm", "run", "--name", "b", n.img)
	n.ack("vm", "run", "--name", "c", n.img)
	n.ack("vm", "rm", "--force", "c")
	procs := n.procs()
	n.check(len(procs) == 2, "before the cut: %d live VMMs, want 2 (a, b)", len(procs))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := n.lazy.Cut(ctx, procs); err != nil {
		n.t.Fatal(err)
	}

	vs, err := n.list()
	n.check(err == nil, "after the cut the store does not load: %v", err)
	var names []string
	for _, v := range vs {
		names = append(names, v.Name)
	}
	for _, want := range []string{"a", "b"} {
		n.check(slices.Contains(names, want), "acknowledged VM %s is gone (vms: %v)", want, names)
	}
	n.check(!slices.Contains(names, "c"), "acknowledged delete of VM c undone (vms: %v)", names)
	snaps, err := n.vmctlRun("snapshot", "list", "-o", "json")
	n.check(err == nil && bytes.Contains(snaps, []byte(`"s1"`)), "acknowledged snapshot s1 is gone: %v %.300s", err, snaps)
	for _, v := range []string{"a", "b"} {
		if slices.Contains(names, v) {
			_, err := n.vmctlRun("vm", "start", v)
			n.check(err == nil, "VM %s does not start from its disk after the cut: %v", v, err)
		}
	}
	_, err = n.vmctlRun("vm", "clone", "--name", "d", "s1")
	n.check(err == nil, "snapshot s1 does not clone after the cut: %v", err)
	out, err := n.vmctlRun("check")
	n.check(err == nil, "vmctl check after the cut: %v %s", err, out)
}

// TestPowerCutKeepsEveryAcknowledgedWriteOfVmctl: today's vmctl writes
// every record through durable.WriteFile, so a power cut at any moment
// after an acknowledgement keeps it.
func TestPowerCutKeepsEveryAcknowledgedWriteOfVmctl(t *testing.T) {
	bins, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, filepath.Join(bins, "vmctl"))
	n.scenario()
	for _, v := range n.violations {
		t.Error(v)
	}
}

// TestPowerCutCatchesADurableWriteWithoutFileFsync builds, for this test
// only, a vmctl whose durable.WriteFile skips the temp file's fsync (a go
// build -overlay of durable.go; nothing in the product can switch it off)
// and requires the same scenario to find a violation.
func TestPowerCutCatchesADurableWriteWithoutFileFsync(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a vmctl variant")
	}
	if why := lazyfs.Available(); why != "" {
		t.Skip("missing host feature: " + why + ": run as root on a host with /dev/fuse (modprobe fuse)")
	}
	vmctl := BuildNoFileFsyncVmctl(t)
	n := newNode(t, vmctl)
	n.scenario()
	if len(n.violations) == 0 {
		t.Fatal("a vmctl that never fsyncs its temp files passed the power cut")
	}
	t.Logf("the variant without file fsync fails the power cut:\n  %s", strings.Join(n.violations, "\n  "))
}

// BuildNoFileFsyncVmctl builds, for tests only, a vmctl whose
// durable.WriteFile skips the temp file's fsync (go build -overlay of
// durable.go) and returns its path. Exported for this directory's external
// tests (the runner's power-cut proof). It is built once per test binary.
func BuildNoFileFsyncVmctl(t *testing.T) string {
	t.Helper()
	// the temp file's fsync in WriteFile: the first one after its signature
	return buildVariant(t, "vmctl", "durable/durable.go", "func WriteFile(",
		"if err := f.Sync(); err != nil {", "if err := error(nil); err != nil { // fsync skipped (test variant)")
}

// BuildNoDiskFsyncFakech builds, for tests only, a fakech whose guest
// `sync` writes the disk image without fsyncing it (CH's flush does).
func BuildNoDiskFsyncFakech(t *testing.T) string {
	t.Helper()
	return buildVariant(t, "fakech", "fakech/guest.go", "func (g *guest) writeDisk(",
		"return g.diskFile.Sync()", "return nil // fsync skipped (test variant)")
}

// buildVariant builds ./cmd/<binary> once per test binary with one edit to
// one source file (go build -overlay; the tree is untouched): the first
// `old` after `after` in file becomes `repl`.
func buildVariant(t *testing.T, binary, file, after, old, repl string) string {
	t.Helper()
	if bin := variantBins[binary]; bin != "" {
		return bin
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		t.Fatalf("go env GOMOD: %v %q", err, mod)
	}
	modDir := filepath.Dir(mod)
	src := filepath.Join(modDir, file)
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	fn := bytes.Index(b, []byte(after))
	i := bytes.Index(b[max(fn, 0):], []byte(old))
	if fn < 0 || i < 0 {
		t.Fatalf("%s: no %q after %q to replace", src, old, after)
	}
	i += fn
	mod2 := append(append(append([]byte(nil), b[:i]...), repl...), b[i+len(old):]...)
	if variantDir == "" {
		if variantDir, err = os.MkdirTemp("", "vmchaos-variants"); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(variantDir, binary)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	variant := filepath.Join(dir, filepath.Base(file))
	if err := os.WriteFile(variant, mod2, 0o644); err != nil {
		t.Fatal(err)
	}
	ov, _ := json.Marshal(map[string]map[string]string{"Replace": {src: variant}})
	if err := os.WriteFile(filepath.Join(dir, "overlay.json"), ov, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, binary)
	cmd := exec.Command("go", "build", "-overlay", filepath.Join(dir, "overlay.json"), "-o", bin, "./cmd/"+binary)
	cmd.Dir = modDir
	if out, err := cmd.CombinedOutput(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("build the variant: %v\n%s", err, out)
		}
		t.Fatal(err)
	}
	variantBins[binary] = bin
	return bin
}

// BenchmarkVmctlLifecycle is what lazyfs costs vmctl: create (disk copy),
// snapshot save, and both deletes, on a plain dir and on a lazy one.
func BenchmarkVmctlLifecycle(b *testing.B) {
	bins, err := stackbin.Dir()
	if err != nil {
		b.Fatal(err)
	}
	for _, lazy := range []bool{false, true} {
		name := "plain"
		if lazy {
			name = "lazyfs"
		}
		b.Run(name, func(b *testing.B) {
			n := newNodeOn(b, filepath.Join(bins, "vmctl"), lazy)
			for i := 0; b.Loop(); i++ {
				vm, snap := fmt.Sprintf("v%d", i), fmt.Sprintf("s%d", i)
				n.ack("vm", "run", "--name", vm, n.img)
				n.ack("snapshot", "save", "--name", snap, vm)
				n.ack("vm", "rm", "--force", vm)
				n.ack("snapshot", "rm", snap)
			}
		})
	}
}

// startAgent starts nodeagent on the node (a tracked child; the node's
// cut or cleanup ends it) and waits for its API.
func (n *node) startAgent(bins string) *stack.AgentClient {
	n.t.Helper()
	c := exec.Command(filepath.Join(bins, "nodeagent"), "--state-dir", n.state, "--vmctl", n.vmctl,
		"--registry-dir", n.reg, "--metrics-addr", "127.0.0.1:0")
	c.Env = n.env
	log, err := os.Create(filepath.Join(n.t.TempDir(), "nodeagent.log"))
	if err != nil {
		n.t.Fatal(err)
	}
	c.Stdout, c.Stderr = log, log
	if err := c.Start(); err != nil {
		n.t.Fatal(err)
	}
	go func() { _ = c.Wait(); log.Close() }() // reaped whichever way it ends
	a := stack.NewAgentClient(filepath.Join(n.state, "agent.sock"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.WaitUp(ctx); err != nil {
		n.t.Fatalf("nodeagent did not come up: %v", err)
	}
	return a
}

// waitReady waits until the agent reports every name ready.
func waitReady(a *stack.AgentClient, names []string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var notReady []string
		for _, name := range names {
			v, err := a.Get(context.Background(), name)
			if err != nil || v.Status.Lifecycle != nodeagent.LifecycleReady {
				notReady = append(notReady, fmt.Sprintf("%s (%s %v)", name, v.Status.Lifecycle, err))
			}
		}
		if len(notReady) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %v", within, notReady)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPowerCutKeepsEveryAcknowledgedIntentOfTheAgent: nodeagent answers a
// PUT with 2xx only once the intent is durable, so after a power cut (the
// agent, its vmctl children and every VMM killed at once, unsynced state
// dropped, the agent started again as after a boot) every acknowledged
// intent exists and its startup convergence brings it to ready, with one VM
// per name and vmctl's invariants holding.
func TestPowerCutKeepsEveryAcknowledgedIntentOfTheAgent(t *testing.T) {
	bins, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, filepath.Join(bins, "vmctl"))
	n.ack("vm", "run", "--name", "base-src", n.img)
	n.ack("snapshot", "save", "--name", "base", "base-src")
	n.ack("vm", "rm", "--force", "base-src")
	a := n.startAgent(bins)
	ctx := context.Background()
	if err := a.Put(ctx, "vm-a", nodeagent.Intent{Snapshot: "base"}); err != nil {
		t.Fatal(err)
	}
	if err := waitReady(a, []string{"vm-a"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	// acknowledged, its create in flight when the power goes
	if err := a.Put(ctx, "vm-b", nodeagent.Intent{Snapshot: "base"}); err != nil {
		t.Fatal(err)
	}
	procs := n.procs()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := n.lazy.Cut(cctx, procs); err != nil {
		t.Fatal(err)
	}
	t.Logf("cut %d processes (agent, vmctl children, VMMs)", len(procs))

	a = n.startAgent(bins) // the unit starts after the boot; startup convergence runs
	vs, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range vs {
		names = append(names, v.Name)
	}
	for _, want := range []string{"vm-a", "vm-b"} {
		if !slices.Contains(names, want) {
			t.Errorf("acknowledged intent %s is gone after the cut (intents: %v)", want, names)
		}
	}
	if err := waitReady(a, []string{"vm-a", "vm-b"}, 2*time.Minute); err != nil {
		t.Fatalf("after the cut: %v", err)
	}
	vms, err := n.list()
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, v := range vms {
		count[v.Name]++
	}
	for _, name := range []string{"vm-a", "vm-b"} {
		if count[name] != 1 {
			t.Errorf("%d VMs named %s, want 1 (vms: %v)", count[name], name, vms)
		}
	}
	if out, err := n.vmctlRun("check"); err != nil {
		t.Errorf("vmctl check after convergence: %v %s", err, out)
	}
}

// users lists the processes with a file, cwd or mapping under dir (what
// keeps a detached mount alive), for a failure message.
func users(dir string) []string {
	var out []string
	es, _ := os.ReadDir("/proc")
	for _, e := range es {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		var hits []string
		links, _ := filepath.Glob("/proc/" + e.Name() + "/fd/*")
		links = append(links, "/proc/"+e.Name()+"/cwd", "/proc/"+e.Name()+"/root")
		for _, l := range links {
			if p, err := os.Readlink(l); err == nil && strings.HasPrefix(p, dir+"/") {
				hits = append(hits, p)
			}
		}
		if len(hits) > 0 {
			cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			out = append(out, fmt.Sprintf("pid %s %q: %v", e.Name(), bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}), hits))
		}
	}
	return out
}
