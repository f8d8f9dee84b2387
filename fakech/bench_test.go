package fakech_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
)

// BenchmarkStartToPingReady: exec of the real binary until vmm.ping answers
// 200 (what chapi.Client.WaitReady waits for), polled every 100 µs.
func BenchmarkStartToPingReady(b *testing.B) {
	dir := vmDir(b, "VMBENCH")
	sock := filepath.Join(dir, "api.sock")
	c := chapi.New(sock)
	for b.Loop() {
		cmd := exec.Command(fakechBin, "--api-socket", "path="+sock)
		cmd.Env = baseEnv()
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := c.Ping(ctx)
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				b.Fatalf("not ready: %v", err)
			}
			time.Sleep(100 * time.Microsecond)
		}
		b.StopTimer()
		_ = cmd.Process.Signal(syscall.SIGTERM) // clean exit removes the socket
		_ = cmd.Wait()
		b.StartTimer()
	}
}

// BenchmarkVMInfoKeepAlive: vm.info on one kept-alive connection (CH's
// server supports it; chapi.Client does not use it, see above) — the
// server's own cost without connection set-up.
func BenchmarkVMInfoKeepAlive(b *testing.B) {
	sock := bootForBench(b)
	conn, err := net.Dial("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	req := []byte("GET /api/v1/vm.info HTTP/1.1\r\nHost: localhost\r\n\r\n")
	for b.Loop() {
		if _, err := conn.Write(req); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != 200 {
			b.Fatal(resp.StatusCode, err)
		}
		resp.Body.Close()
	}
}

// BenchmarkVMInfoNewConnRaw: a new connection per request like chapi, but
// without net/http's client machinery — what a connection costs fakech.
func BenchmarkVMInfoNewConnRaw(b *testing.B) {
	sock := bootForBench(b)
	req := []byte("GET /api/v1/vm.info HTTP/1.1\r\nHost: localhost\r\n\r\n")
	for b.Loop() {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Write(req); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != 200 {
			b.Fatal(resp.StatusCode, err)
		}
		conn.Close()
	}
}

func bootForBench(b *testing.B) string {
	dir := vmDir(b, "VMBKA")
	g := newGuest(b, dir)
	sock := filepath.Join(dir, "api.sock")
	cmd := exec.Command(fakechBin, bootArgs(sock, g.path, loopbackIP())...)
	cmd.Env = baseEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := chapi.New(sock).WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	return sock
}

// BenchmarkVMInfoRoundTrip: one vm.info through chapi.Client (a new
// connection per request, as the client does) on a booted VM.
func BenchmarkVMInfoRoundTrip(b *testing.B) {
	sock := bootForBench(b)
	c := chapi.New(sock)
	ctx := context.Background()
	for b.Loop() {
		if _, err := c.Info(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVMInfoRoundTripKeepAlive: vm.info through chapi.Client with the
// KeepAlive option (what a poller such as the convergence checker uses).
func BenchmarkVMInfoRoundTripKeepAlive(b *testing.B) {
	sock := bootForBench(b)
	c := chapi.New(sock, chapi.KeepAlive())
	defer c.Close()
	ctx := context.Background()
	for b.Loop() {
		if _, err := c.Info(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
