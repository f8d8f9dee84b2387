package chapi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/stackbin"
)

// The client is tested against the real fakech binary (the project's only
// stand-in for CH), built once here.
var fakechBin string

func TestMain(m *testing.M) { os.Exit(stackbin.Main(m, "fakech", &fakechBin)) }

func shortDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "chapi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// startVMM starts fakech with --api-socket only; Cleanup kills and reaps it.
func startVMM(t *testing.T, sock string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(fakechBin, "--api-socket", "path="+sock)
	cmd.Env = append([]string{"VMCHAOS_TIME_SCALE=0.01"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return cmd
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestDecodeErrorBody(t *testing.T) {
	for in, want := range map[string][]string{
		`["Error from API","Cannot pause VM","Invalid transition: InvalidStateTransition(Paused, Paused)"]`: {"Error from API", "Cannot pause VM", "Invalid transition: InvalidStateTransition(Paused, Paused)"},
		"VM is not running\n": {"VM is not running"}, // ≤v46 plain text
		"":                    nil,
		`{"error":"x"}`:       {`{"error":"x"}`},
	} {
		if got := chapi.DecodeErrorBody([]byte(in)); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

func TestErrorHelpers(t *testing.T) {
	e := &chapi.Error{Endpoint: "vm.pause", Status: 500, Chain: []string{"Error from API", "Cannot pause VM", "Invalid transition: InvalidStateTransition(Paused, Paused)"}}
	wrapped := fmt.Errorf("save: %w", e)
	if !chapi.IsInvalidTransition(wrapped, chapi.StatePaused, chapi.StatePaused) || chapi.IsInvalidTransition(wrapped, chapi.StateRunning, chapi.StateRunning) {
		t.Fatal("IsInvalidTransition")
	}
	if !chapi.HasMessage(wrapped, "Cannot pause") || chapi.HasMessage(errors.New("Cannot pause"), "Cannot pause") {
		t.Fatal("HasMessage must match only CH errors")
	}
	if e.Innermost() != "Invalid transition: InvalidStateTransition(Paused, Paused)" || (&chapi.Error{}).Innermost() != "" {
		t.Fatal("Innermost")
	}
	if !strings.Contains(e.Error(), "vm.pause: HTTP 500: Error from API: Cannot pause VM") {
		t.Fatalf("Error() %q", e.Error())
	}
}

// TestClientLifecycle drives a fakech through the client: bodies go with
// Content-Length (fakech, like CH, treats chunked bodies as absent → 400),
// errors decode into typed chains, and idempotent pause/resume swallow only
// the matching InvalidStateTransition.
func TestClientLifecycle(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "api.sock")
	c := chapi.New(sock)
	ctx := ctxT(t)
	// WaitReady before the process exists: it keeps polling.
	ready := make(chan error, 1)
	go func() { ready <- c.WaitReady(ctx) }()
	time.Sleep(20 * time.Millisecond)
	startVMM(t, sock)
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	if p, err := c.Ping(ctx); err != nil || p.Version == "" || p.Pid <= 0 {
		t.Fatalf("ping %+v %v", p, err)
	}
	_, err := c.Info(ctx)
	var ce *chapi.Error
	if !errors.As(err, &ce) || ce.Status != 500 || ce.Innermost() != "VM is not created" || ce.Endpoint != chapi.EpInfo {
		t.Fatalf("info before create: %#v", err)
	}
	// A resume on a VM that is not running is not an InvalidStateTransition:
	// idempotence must not hide it.
	if err := c.Resume(ctx, true); !chapi.HasMessage(err, "VM is not running") {
		t.Fatalf("idempotent resume of nothing: %v", err)
	}
	cfg := chapi.VmConfig{Payload: &chapi.PayloadConfig{Firmware: "/fw"}, Memory: &chapi.MemoryConfig{Size: 256 << 20}}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatalf("create (body must carry Content-Length): %v", err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.State != chapi.StateRunning || info.Config.Memory.Size != 256<<20 || info.MemoryActualSize != 256<<20 {
		t.Fatalf("info %+v %v", info, err)
	}
	if err := c.Resume(ctx, true); err != nil {
		t.Fatalf("idempotent resume of a running VM: %v", err)
	}
	if err := c.Resume(ctx, false); !chapi.IsInvalidTransition(err, chapi.StateRunning, chapi.StateRunning) {
		t.Fatalf("strict resume of a running VM: %v", err)
	}
	if err := c.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Pause(ctx, true); err != nil {
		t.Fatalf("idempotent pause: %v", err)
	}
	snap := filepath.Join(dir, "snap")
	os.Mkdir(snap, 0o755)
	if err := c.Snapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	// A random loopback address: the guest's sshd binds it.
	ip := fmt.Sprintf("127.%d.%d.%d", 100+time.Now().Nanosecond()%100, os.Getpid()%256, 1+time.Now().Nanosecond()%254)
	dev, err := c.AddNet(ctx, chapi.NetConfig{IP: ip, ID: "nic9"})
	if err != nil || dev.ID != "nic9" {
		t.Fatalf("add-net %+v %v", dev, err)
	}
	if err := c.RemoveDevice(ctx, "nic9"); err != nil {
		t.Fatal(err)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	// Restore into the same (now config-less) VMM, as CH allows after delete.
	if err := c.Restore(ctx, chapi.RestoreConfig{SourceURL: "file://" + snap}); err != nil {
		t.Fatal(err)
	}
	if info, _ := c.Info(ctx); info.State != chapi.StatePaused {
		t.Fatalf("after restore: %s", info.State)
	}
	if err := c.ShutdownVMM(ctx); err != nil {
		t.Fatalf("vmm.shutdown answers 200 with an empty body: %v", err)
	}
}

// TestClientSurvivesVMMRestart: the client opens a connection per request,
// so the same Client keeps working after the VMM behind the path was
// SIGKILLed and replaced (v53 mode reclaims the stale socket).
func TestClientSurvivesVMMRestart(t *testing.T) {
	sock := filepath.Join(shortDir(t), "api.sock")
	cmd := startVMM(t, sock, "FAKECH_COMPAT=v53")
	c := chapi.New(sock)
	ctx := ctxT(t)
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	p1, _ := c.Ping(ctx)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	deadCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if _, err := c.Ping(deadCtx); err == nil {
		t.Fatal("ping of a SIGKILLed VMM succeeded")
	}
	cancel()
	startVMM(t, sock, "FAKECH_COMPAT=v53")
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	p2, err := c.Ping(ctx)
	if err != nil || p2.Pid == p1.Pid {
		t.Fatalf("ping after restart: %+v %v (old pid %d)", p2, err, p1.Pid)
	}
}

func TestWaitReadyHonoursContext(t *testing.T) {
	c := chapi.New(filepath.Join(shortDir(t), "never.sock"))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := c.WaitReady(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "never.sock") {
		t.Fatalf("WaitReady on a missing socket: %v", err)
	}
}

func FuzzDecodeErrorBody(f *testing.F) {
	f.Add([]byte(`["Error from API","VM is not created"]`))
	f.Add([]byte("plain text error"))
	f.Add([]byte(`[1,2]`))
	f.Add([]byte{0xff, '[', '"'})
	f.Fuzz(func(t *testing.T, b []byte) {
		chain := chapi.DecodeErrorBody(b)
		e := &chapi.Error{Endpoint: "x", Status: 500, Chain: chain}
		_ = e.Error()
		_ = e.Innermost()
		_ = chapi.IsInvalidTransition(e, "Paused", "Paused")
	})
}

// TestRequestToAHungVMMEndsWithTheContext: a VMM that took the request and
// never answers (fakech parked at ch.pause, as a wedged CH would be) must not
// hang the caller: a cancel or the deadline ends the request with the
// context's error.
func TestRequestToAHungVMMEndsWithTheContext(t *testing.T) {
	dir := shortDir(t)
	sock, ctl := filepath.Join(dir, "api.sock"), filepath.Join(dir, "ctl")
	if err := os.Mkdir(ctl, 0o755); err != nil {
		t.Fatal(err)
	}
	startVMM(t, sock, "VMCHAOS_FAILPOINTS=ch.pause=pause", "VMCHAOS_FAILPOINT_CTL="+ctl)
	c := chapi.New(sock)
	ctx := ctxT(t)
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := chapi.VmConfig{Payload: &chapi.PayloadConfig{Firmware: "/fw"}, Memory: &chapi.MemoryConfig{Size: 256 << 20}}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}

	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Pause(cctx, false) }()
	if _, err := failpoint.WaitParked(ctx, ctl, "ch.pause"); err != nil {
		t.Fatal(err)
	}
	cancel() // the VMM holds the request: only the context can end it
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancel: err = %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a cancelled request to a hung VMM did not return")
	}

	// Still parked: a second request with a deadline ends at the deadline.
	dctx, dcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer dcancel()
	if err := c.Pause(dctx, false); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: err = %v, want context.DeadlineExceeded", err)
	}
}
