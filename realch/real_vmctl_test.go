package realch

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/stackbin"
	"github.com/vmchaos/vmchaos/vmnet/vmnettest"
)

// realVMCtl runs the bundled vmctl against the real stack at time scale 1
// (real CH does not speed up); the test fails on a non-zero exit unless
// mayFail.
type realVMCtl struct {
	t    *testing.T
	vars []string
}

func (r realVMCtl) run(ctx context.Context, args ...string) (string, string, error) {
	r.t.Helper()
	bin, err := stackbin.Path("vmctl")
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(append(os.Environ(), "VMCHAOS_TIME_SCALE=1"), r.vars...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

func (r realVMCtl) must(ctx context.Context, args ...string) string {
	r.t.Helper()
	start := time.Now()
	out, errOut, err := r.run(ctx, args...)
	if err != nil {
		r.t.Fatalf("vmctl %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	r.t.Logf("vmctl %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return out
}

// exec waits (bounded) for `vm exec` to answer and returns its output.
func (r realVMCtl) exec(ctx context.Context, vm, cmd string, within time.Duration) string {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		// vmctl joins the argv with spaces for the guest's shell: one word is a line.
		out, errOut, err := r.run(ctx, "vm", "exec", vm, "--", cmd)
		if err == nil {
			return out
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("vm exec %s %q: %v\n%s", vm, cmd, err, errOut)
		}
		time.Sleep(time.Second)
	}
}

func (r realVMCtl) inspect(ctx context.Context, vm string) map[string]any {
	r.t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(r.must(ctx, "vm", "inspect", vm, "-o", "json")), &v); err != nil {
		r.t.Fatal(err)
	}
	return v
}

// TestRealCHThroughVMCtl drives the bundled vmctl against the real CH and
// the real guest image, the way the scenario stack does: a cold boot with
// the DHCP seed, SSH with the host key pinned, pause/resume through the
// API, markers on disk and in RAM, NIC removal, snapshot save (pause,
// capture, resume), clone under a new name (restore, new NIC hot-plugged,
// the guest takes its TAP's address by DHCP, RAM and boot id survive),
// kill -9 of the VMM and what it leaves, a cold start after it, rm.
func TestRealCHThroughVMCtl(t *testing.T) {
	env := realEnv(t)
	vmnettest.NeedNetAdmin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "vmchaos-rv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, _ := ssh.NewSignerFromKey(priv)
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "id")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := StackEnv(StackOptions{
		Options:    Options{CHBinary: env.CHBinary, Firmware: env.Firmware, Kernel: env.Kernel, Initramfs: env.Initramfs, Image: env.Image},
		SeedPubKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))),
		Netns:      filepath.Base(dir), Dir: dir, DHCP: true, Pool: "172.31.7.0/24",
	})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	vc := realVMCtl{t: t, vars: append(st.Vars, "VMCTL_ROOT_DIR="+root, "VMCTL_RUN_DIR="+filepath.Join(dir, "run"), "VMCTL_SSH_KEY="+keyFile)}
	t.Cleanup(func() {
		// Every VM goes before the namespace (a VMM inside keeps it alive).
		out, _, _ := vc.run(context.Background(), "vm", "list", "-o", "json")
		var vms []struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal([]byte(out), &vms)
		for _, v := range vms {
			if _, e, err := vc.run(context.Background(), "vm", "rm", "--force", v.ID); err != nil {
				t.Errorf("cleanup: vm rm %s: %v %s", v.ID, err, e)
			}
		}
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})

	// Cold boot → SSH.
	start := time.Now()
	vc.must(ctx, "vm", "run", "--name", "src", "--memory", "1G", st.Image)
	boot := strings.TrimSpace(vc.exec(ctx, "src", "cat /proc/sys/kernel/random/boot_id", 3*time.Minute))
	t.Logf("FIGURE boot→SSH (vm run to first vm exec): %s", time.Since(start).Round(time.Millisecond))
	host := strings.TrimSpace(vc.exec(ctx, "src", "hostname", time.Minute))
	if host != "src" {
		t.Errorf("hostname %q: want the seed's", host)
	}
	src := vc.inspect(ctx, "src")
	srcDir := filepath.Join(root, "vms", src["id"].(string))
	// vm exec pins the host key vmctl put in the seed: cloud-init installed
	// it in place of the image's keys.
	hk, err := os.ReadFile(filepath.Join(srcDir, "ssh_host_ed25519_key"))
	if err != nil {
		t.Fatal(err)
	}
	hs, err := ssh.ParsePrivateKey(hk)
	if err != nil {
		t.Fatal(err)
	}
	guestPub := vc.exec(ctx, "src", "cat /etc/ssh/ssh_host_ed25519_key.pub", time.Minute)
	if gk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(guestPub)); err != nil || !bytes.Equal(gk.Marshal(), hs.PublicKey().Marshal()) {
		t.Fatalf("guest host key %q is not the seed's: %v", guestPub, err)
	}

	// Pause/resume through the API: a paused guest does not answer.
	sock := filepath.Join(dir, "run", src["id"].(string), SocketName)
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("api socket: %v", err)
	}
	api := chapi.New(sock)
	if err := api.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	if info, err := api.Info(ctx); err != nil || info.State != chapi.StatePaused {
		t.Fatalf("after pause: %v %v", info.State, err)
	}
	if _, _, err := vc.run(ctx, "vm", "exec", "src", "--", "true"); err == nil {
		t.Error("vm exec answered while the VM was paused")
	}
	if err := api.Resume(ctx, false); err != nil {
		t.Fatal(err)
	}
	vc.exec(ctx, "src", "mkdir -p /var/lib/vmchaos/ledger /run/vmchaos && touch /var/lib/vmchaos/ledger/m1 /run/vmchaos/m1 && sync", time.Minute)
	if out := vc.exec(ctx, "src", "dhclient -r && echo released", time.Minute); !strings.Contains(out, "released") {
		t.Errorf("dhclient -r: %q", out)
	}

	// NIC out, snapshot save, rm: what the agent's hibernate does.
	vc.must(ctx, "vm", "net", "src", "--nics", "0")
	start = time.Now()
	vc.must(ctx, "snapshot", "save", "--name", "s1", "src")
	t.Logf("FIGURE snapshot save of a 1 GiB guest: %s", time.Since(start).Round(time.Millisecond))
	vc.must(ctx, "vm", "rm", "--force", "src")

	// Clone under a new name: restore, new NIC, resume; the guest takes the
	// new TAP's address by DHCP and still holds its RAM.
	start = time.Now()
	vc.must(ctx, "vm", "clone", "--name", "c1", "s1")
	t.Logf("FIGURE vm clone (restore of a 1 GiB guest, NIC added, resumed): %s", time.Since(start).Round(time.Millisecond))
	out := vc.exec(ctx, "c1", "cat /proc/sys/kernel/random/boot_id; ls /run/vmchaos /var/lib/vmchaos/ledger", 2*time.Minute)
	t.Logf("FIGURE clone → SSH: %s", time.Since(start).Round(time.Millisecond))
	if f := strings.Fields(out); len(f) != 3 || f[0] != boot || f[1] != "m1" || f[2] != "m1" {
		t.Fatalf("clone answered %q: want boot id %s and both markers", out, boot)
	}

	// kill -9 of the VMM: the record says stopped (stale); a start boots it
	// cold (a new boot id, the disk marker survives, the RAM one does not).
	c1 := vc.inspect(ctx, "c1")
	pid := int(c1["pid"].(float64))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if s, _ := vc.inspect(ctx, "c1")["state"].(string); strings.Contains(s, "stale") || s == "stopped" {
			t.Logf("after kill -9: state %q", s)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("c1 after kill -9 still %v", vc.inspect(ctx, "c1")["state"])
		}
		time.Sleep(200 * time.Millisecond)
	}
	c1Sock := filepath.Join(dir, "run", c1["id"].(string), SocketName)
	if _, err := os.Stat(c1Sock); err == nil {
		t.Logf("leftover after kill -9: %s (CH cannot remove its socket)", c1Sock)
	}
	links, _ := st.Netns.Command(ctx, "ip", "-o", "link", "show").Output()
	t.Logf("links in the namespace after kill -9:\n%s", links)
	vc.must(ctx, "vm", "start", "c1")
	out = vc.exec(ctx, "c1", "cat /proc/sys/kernel/random/boot_id; ls /var/lib/vmchaos/ledger; ls /run/vmchaos 2>/dev/null | wc -l", 3*time.Minute)
	if f := strings.Fields(out); len(f) != 3 || f[0] == boot || f[1] != "m1" || f[2] != "0" {
		t.Fatalf("after kill -9 and start: %q: want a new boot id, the disk marker, no RAM marker", out)
	}
	vc.must(ctx, "vm", "rm", "--force", "c1")
	vc.must(ctx, "snapshot", "rm", "s1")
	// No leftover socket, staging dir, orphan VMM or pending record.
	vc.must(ctx, "check")
}
