package realch

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/vmnet/vmnettest"
)

// realVMMEnv is realEnv for tests of the VMM alone (API, snapshot files,
// restore, devices, process leftovers), which need a working KVM_CREATE_VM
// but not a guest that reaches userspace: they also run where /dev/kvm is
// kvm_pvm. Anything else the preflight refuses skips (or fails with
// VMCHAOS_REQUIRE_REAL=1) as realEnv does.
func realVMMEnv(t *testing.T) *Env {
	t.Helper()
	env, r, err := Preflight(Options{})
	if err == nil && (r.OK || r.Reason == ReasonPVM) {
		return env
	}
	msg := fmt.Sprintf("real backend unavailable: %s", r)
	if os.Getenv(EnvRequireReal) == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return nil
}

// TestRealCHVMMThroughVMCtl: vmctl against the real cloud-hypervisor, up to
// what needs no guest userspace: vm run with a TAP NIC in a namespace,
// pause/resume, snapshot save of a 1 GiB guest (the three files), NIC
// removal, clone (restore into a fresh VMM, a new NIC, resume), kill -9 of
// the VMM and what it leaves (socket, lock, TAP), start after it, rm, and
// vmctl check. Figures are logged with FIGURE.
func TestRealCHVMMThroughVMCtl(t *testing.T) {
	env := realVMMEnv(t)
	vmnettest.NeedNetAdmin(t)
	_, pre, _ := Preflight(Options{})
	pvm := pre.Reason == ReasonPVM
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "vmchaos-rm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	st, err := StackEnv(StackOptions{
		Options:    Options{CHBinary: env.CHBinary, Firmware: env.Firmware, Kernel: env.Kernel, Initramfs: env.Initramfs, Image: env.Image},
		SeedPubKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPLhQm1W6pQyd2N0aXJlc3Rpbmcta2V5LW9ubHk= vmm-test",
		Netns:      filepath.Base(dir), Dir: dir, Pool: "172.31.9.0/24",
	})
	if err != nil {
		t.Fatal(err)
	}
	root, run := filepath.Join(dir, "root"), filepath.Join(dir, "run")
	vc := realVMCtl{t: t, vars: append(st.Vars, "VMCTL_ROOT_DIR="+root, "VMCTL_RUN_DIR="+run)}
	t.Cleanup(func() {
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
	ping := func(id string) chapi.VmmPingResponse {
		p, err := chapi.New(filepath.Join(run, id, SocketName)).Ping(ctx)
		if err != nil {
			t.Fatalf("vmm.ping %s: %v", id, err)
		}
		return p
	}

	start := time.Now()
	vc.must(ctx, "vm", "run", "--name", "src", "--memory", "1G", st.Image)
	t.Logf("FIGURE vm run (copy image, seed, launch, boot API) 1 GiB: %s", time.Since(start).Round(time.Millisecond))
	src := vc.inspect(ctx, "src")
	id := src["id"].(string)
	p := ping(id)
	t.Logf("vmm.ping: %+v", p)
	api := chapi.New(filepath.Join(run, id, SocketName))
	if err := api.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	// Pausing twice is CH's 500 InvalidStateTransition(Paused, Paused).
	if err := api.Pause(ctx, false); err == nil || !chapi.IsInvalidTransition(err, "Paused", "Paused") {
		t.Errorf("second pause: %v, want InvalidStateTransition(Paused, Paused)", err)
	}
	if err := api.Resume(ctx, false); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	if pvm {
		// kvm_pvm has no KVM_GET_NESTED_STATE, and CH saves every vCPU's
		// nested state: the capture fails. What must hold is that vmctl
		// resumes the VM it paused and leaves no pending snapshot.
		_, errOut, err := vc.run(ctx, "snapshot", "save", "--name", "s1", "src")
		if err == nil || !strings.Contains(errOut, "GetNestedState") {
			t.Fatalf("snapshot save on kvm_pvm: %v %s: want CH's GetNestedState failure", err, errOut)
		}
		t.Logf("snapshot save on kvm_pvm fails as expected (%s): %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(errOut))
		if info, err := api.Info(ctx); err != nil || info.State != chapi.StateRunning {
			t.Fatalf("after the failed capture the VM is %v (%v): vmctl must resume what it paused", info.State, err)
		}
		if out := vc.must(ctx, "snapshot", "list", "-o", "json"); strings.Contains(out, `"id"`) {
			t.Fatalf("failed save left a snapshot record: %s", out)
		}
		vc.must(ctx, "check")
		pvmRest(ctx, t, vc, st, run, id)
		return
	}
	vc.must(ctx, "snapshot", "save", "--name", "s1", "src")
	t.Logf("FIGURE snapshot save of a running 1 GiB guest (pause, vm.snapshot, disk copy, resume, finalize): %s", time.Since(start).Round(time.Millisecond))
	var snaps []map[string]any
	if err := json.Unmarshal([]byte(vc.must(ctx, "snapshot", "list", "-o", "json")), &snaps); err != nil || len(snaps) != 1 {
		t.Fatalf("snapshot list: %v %v", snaps, err)
	}
	sdir := filepath.Join(root, "snapshots", snaps[0]["id"].(string))
	var files []string
	_ = filepath.Walk(sdir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			var b int64
			if s, ok := fi.Sys().(*syscall.Stat_t); ok {
				b = s.Blocks * 512
			}
			files = append(files, fmt.Sprintf("%s %d bytes (%d allocated)", strings.TrimPrefix(p, sdir+"/"), fi.Size(), b))
		}
		return nil
	})
	t.Logf("snapshot files:\n  %s", strings.Join(files, "\n  "))
	for _, f := range []string{"config.json", "state.json", "memory-ranges"} {
		if !strings.Contains(strings.Join(files, "\n"), f) {
			t.Errorf("snapshot lacks %s", f)
		}
	}

	start = time.Now()
	out, errOut, err := vc.run(ctx, "vm", "net", "src", "--nics", "0")
	t.Logf("FIGURE vm net --nics 0 (remove-device, no guest to ack the eject): %s err=%v %s %s", time.Since(start).Round(time.Millisecond), err, out, errOut)
	info, err := api.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nets := 0
	for k := range info.DeviceTree {
		if strings.HasPrefix(k, "net") || strings.HasPrefix(k, "_net") {
			nets++
		}
	}
	t.Logf("after vm net --nics 0: state %s, %d net device(s) left in the device tree, config nets %d", info.State, nets, len(info.Config.Net))
	vc.must(ctx, "vm", "rm", "--force", "src")

	start = time.Now()
	vc.must(ctx, "vm", "clone", "--name", "c1", "s1")
	t.Logf("FIGURE vm clone (fresh VMM, vm.restore of 1 GiB, NICs replaced, resume): %s", time.Since(start).Round(time.Millisecond))
	c1 := vc.inspect(ctx, "c1")
	cid := c1["id"].(string)
	if info, err := chapi.New(filepath.Join(run, cid, SocketName)).Info(ctx); err != nil || info.State != chapi.StateRunning {
		t.Fatalf("clone: %v %v", info.State, err)
	}

	killVMM(ctx, t, vc, st, run, cid, "c1")
	start = time.Now()
	vc.must(ctx, "vm", "start", "c1")
	t.Logf("FIGURE vm start after kill -9 (cold boot API): %s", time.Since(start).Round(time.Millisecond))
	vc.must(ctx, "vm", "rm", "--force", "c1")
	vc.must(ctx, "snapshot", "rm", "s1")
	vc.must(ctx, "check")
}

// pvmRest is the part of TestRealCHVMMThroughVMCtl that needs no snapshot:
// NIC removal, kill -9 of the VMM and its leftovers, start, rm, check.
func pvmRest(ctx context.Context, t *testing.T, vc realVMCtl, st *Stack, run, id string) {
	api := chapi.New(filepath.Join(run, id, SocketName))
	start := time.Now()
	out, errOut, err := vc.run(ctx, "vm", "net", "src", "--nics", "0")
	t.Logf("FIGURE vm net --nics 0: %s err=%v %s %s", time.Since(start).Round(time.Millisecond), err, out, errOut)
	if info, err := api.Info(ctx); err == nil {
		t.Logf("after vm net --nics 0: state %s, config nets %d", info.State, len(info.Config.Net))
	}
	start = time.Now()
	out, errOut, err = vc.run(ctx, "vm", "net", "src", "--nics", "1")
	t.Logf("FIGURE vm net --nics 1: %s err=%v %s %s", time.Since(start).Round(time.Millisecond), err, out, errOut)
	if info, err := api.Info(ctx); err == nil {
		t.Logf("after vm net --nics 1: state %s, config nets %d", info.State, len(info.Config.Net))
	}
	killVMM(ctx, t, vc, st, run, id, "src")
	start = time.Now()
	vc.must(ctx, "vm", "start", "src")
	t.Logf("FIGURE vm start after kill -9: %s", time.Since(start).Round(time.Millisecond))
	if info, err := api.Info(ctx); err != nil || info.State != chapi.StateRunning {
		t.Fatalf("after start: %v %v", info.State, err)
	}
	vc.must(ctx, "vm", "rm", "--force", "src")
	vc.must(ctx, "check")
}

// killVMM kill -9s the VMM of VM name (id), waits until vmctl reports it
// stopped (stale), and logs what the kill left: API socket, lock, links.
func killVMM(ctx context.Context, t *testing.T, vc realVMCtl, st *Stack, run, id, name string) {
	t.Helper()
	pid := int(vc.inspect(ctx, name)["pid"].(float64))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, _ := vc.inspect(ctx, name)["state"].(string)
		if strings.Contains(s, "stale") || s == "stopped" {
			t.Logf("after kill -9: vm inspect state %q", s)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after kill -9: state %q", s)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, f := range []string{SocketName, SocketName + ".lock"} {
		_, err := os.Stat(filepath.Join(run, id, f))
		t.Logf("leftover after kill -9: %s exists=%v", f, err == nil)
	}
	links, _ := st.Netns.Command(ctx, "ip", "-o", "link", "show").Output()
	t.Logf("links in the namespace after kill -9:\n%s", links)
}
