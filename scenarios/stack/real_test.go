package stack

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/realch"
)

// lastValue is what a process sees for key in env: exec and systemd keep
// the last entry of a name.
func lastValue(env []string, key string) (string, bool) {
	v, ok := "", false
	for _, e := range env {
		if k, val, _ := strings.Cut(e, "="); k == key {
			v, ok = val, true
		}
	}
	return v, ok
}

// TestRealRunAsksForItsNamespace: a real run hands realch.StackEnv the
// run's ledger key, a namespace named after its unique temp dir, that dir
// for the wrapper, and DHCP; when StackEnv fails, NewRun fails with its
// error and removes the temp dir. Supervisors that hide /run/netns are
// refused before anything is created.
func TestRealRunAsksForItsNamespace(t *testing.T) {
	var got []realch.StackOptions
	boom := errors.New("no cloud-hypervisor here")
	old := stackEnv
	stackEnv = func(o realch.StackOptions) (*realch.Stack, error) {
		if _, err := os.Stat(o.Dir); err != nil {
			t.Errorf("StackEnv called with a Dir that does not exist: %v", err)
		}
		got = append(got, o)
		return nil, boom
	}
	t.Cleanup(func() { stackEnv = old })
	ctx := context.Background()

	for _, sup := range []string{injector.KindSandbox, injector.KindAuto, ""} {
		if _, err := NewRun(ctx, RunOptions{BinDir: t.TempDir(), Supervisor: sup, Backend: BackendReal}); err == nil || !strings.Contains(err.Error(), "builtin or systemd") {
			t.Errorf("supervisor %q: err %v, want a refusal", sup, err)
		}
	}
	if len(got) != 0 {
		t.Fatalf("StackEnv called %d times for refused supervisors", len(got))
	}

	_, err := NewRun(ctx, RunOptions{BinDir: t.TempDir(), Supervisor: injector.KindBuiltin, Backend: BackendReal})
	if !errors.Is(err, boom) {
		t.Fatalf("NewRun: %v, want StackEnv's error", err)
	}
	if len(got) != 1 {
		t.Fatalf("StackEnv called %d times", len(got))
	}
	o := got[0]
	if !strings.HasPrefix(o.SeedPubKey, "ssh-ed25519 ") || !o.DHCP || o.Pool != "" {
		t.Errorf("options %+v: want the run's key, DHCP and realch's default pool", o)
	}
	if !strings.HasPrefix(filepath.Base(o.Dir), "vmchaos-") || o.Netns != filepath.Base(o.Dir) {
		t.Errorf("netns %q, dir %q: want the namespace named after the run's temp dir", o.Netns, o.Dir)
	}
	if _, err := os.Stat(o.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s left after a failed NewRun: %v", o.Dir, err)
	}

	if _, err := NewRun(ctx, RunOptions{BinDir: t.TempDir(), Supervisor: injector.KindBuiltin, Backend: "qemu"}); err == nil {
		t.Error("backend qemu accepted")
	}
}

// TestRealStackEnv: every process of a real case stack sees the real CH
// (the namespace wrapper), the real payload, tap networking, the namespace
// and its own /24 of the run's pool, whatever the fake defaults before
// them say; and a fake stack's environment is exactly what it was before
// the real backend existed.
func TestRealStackEnv(t *testing.T) {
	real := &realch.Stack{Image: "/var/lib/vmchaos/images/guest.raw", Vars: []string{
		"VMCTL_CH_BINARY=/tmp/vmchaos-x/cloud-hypervisor", "VMCTL_NET_MODE=tap", "VMCTL_NET_POOL=172.30.0.0/16",
		"VMCTL_SEED_PUBKEY=ssh-ed25519 AAAA run", "VMCTL_KERNEL=/k/vmlinux", "VMCTL_NETNS=vmchaos-x", "VMCTL_GUEST_NET=dhcp",
	}}
	fake := &Run{BinDir: "/b", Scale: 0.05, Seed: 7}
	rr := &Run{BinDir: "/b", Scale: 0.05, Seed: 7, Real: real}

	pools := map[string]int{}
	for n := 0; n < 256; n++ {
		p := rr.netPool(n)
		if prev, dup := pools[p]; dup {
			t.Fatalf("cases %d and %d share pool %s", prev, n, p)
		}
		pools[p] = n
	}
	if p := rr.netPool(3); p != "172.30.3.0/24" {
		t.Errorf("real pool of case 3 = %s", p)
	}
	if p := fake.netPool(3); p != "127.200.3.0/24" {
		t.Errorf("fake pool of case 3 = %s", p)
	}

	s := &Stack{run: rr, Dir: "/d", Root: "/d/root", RunDir: "/d/run", NetPool: rr.netPool(3)}
	env := s.baseEnv()
	want := map[string]string{
		"VMCTL_CH_BINARY": "/tmp/vmchaos-x/cloud-hypervisor", "VMCTL_NET_MODE": "tap", "VMCTL_NET_POOL": "172.30.3.0/24",
		"VMCTL_SEED_PUBKEY": "ssh-ed25519 AAAA run", "VMCTL_KERNEL": "/k/vmlinux", "VMCTL_NETNS": "vmchaos-x",
		"VMCTL_GUEST_NET": "dhcp", "VMCTL_ROOT_DIR": "/d/root", "VMCTL_RUN_DIR": "/d/run",
	}
	for k, v := range want {
		if got, _ := lastValue(env, k); got != v {
			t.Errorf("%s = %q, want %q (env %q)", k, got, v, env)
		}
	}
	// A kernel boot must not see the fake firmware next to VMCTL_KERNEL.
	if v, ok := lastValue(env, "VMCTL_FIRMWARE"); ok {
		t.Errorf("VMCTL_FIRMWARE=%q in a real kernel-boot stack", v)
	}
	// The armed environment carries the same, plus trace and control dir.
	if got, _ := lastValue(s.StackEnv("x=return"), "VMCTL_NET_POOL"); got != "172.30.3.0/24" {
		t.Errorf("StackEnv pool %q", got)
	}

	f := &Stack{run: fake, Dir: "/d", Root: "/d/root", RunDir: "/d/run", NetPool: fake.netPool(3), Firmware: "/d/CLOUDHV.fd"}
	wantFake := []string{
		"PATH=/b:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/d", "VMCTL_ROOT_DIR=/d/root",
		"VMCTL_RUN_DIR=/d/run", "VMCTL_CH_BINARY=/b/cloud-hypervisor", "VMCTL_NET_POOL=127.200.3.0/24",
		"VMCHAOS_TIME_SCALE=0.05", "FAKECH_JITTER_SEED=7", "VMCTL_FIRMWARE=/d/CLOUDHV.fd",
	}
	if got := f.baseEnv(); !slices.Equal(got, wantFake) {
		t.Errorf("fake env\n got %q\nwant %q", got, wantFake)
	}
	// A tap-mode case on the fake backend (Options.NetMode) runs vmctl in
	// tap mode over its loopback pool; the real backend stays as realch
	// set it.
	f.opts.NetMode = "tap"
	if got, _ := lastValue(f.baseEnv(), "VMCTL_NET_MODE"); got != "tap" {
		t.Errorf("fake tap-mode stack: VMCTL_NET_MODE=%q", got)
	}
	if got, _ := lastValue(f.baseEnv(), "VMCTL_NET_POOL"); got != "127.200.3.0/24" {
		t.Errorf("fake tap-mode stack: pool %q, want the case's loopback pool", got)
	}
	s.opts.NetMode = "tap"
	if n := strings.Count(strings.Join(s.baseEnv(), "\n"), "VMCTL_NET_MODE="); n != 1 {
		t.Errorf("real stack: VMCTL_NET_MODE set %d times, want realch's once", n)
	}
}
