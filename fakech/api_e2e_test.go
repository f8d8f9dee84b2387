package fakech_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mrand "math/rand/v2"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/fakech"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rawHTTP sends raw bytes on the API socket and returns the status line,
// headers and body of the first answer.
func rawHTTP(t *testing.T, sock, req string) (string, http.Header, []byte) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	go func() { _, _ = io.WriteString(c, req) }()
	br := bufio.NewReader(c)
	status, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("read status line: %v", err)
	}
	h := http.Header{}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read header: %v", err)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		k, v, _ := strings.Cut(line, ":")
		h.Add(k, strings.TrimSpace(v))
	}
	var body []byte
	if cl := h.Get("Content-Length"); cl != "" {
		var n int
		fmt.Sscanf(cl, "%d", &n)
		body = make([]byte, n)
		if _, err := io.ReadFull(br, body); err != nil {
			t.Fatalf("read body: %v", err)
		}
	}
	return strings.TrimRight(status, "\r\n"), h, body
}

func chError(t *testing.T, err error) *chapi.Error {
	t.Helper()
	var e *chapi.Error
	if !errors.As(err, &e) {
		t.Fatalf("want a CH API error, got %v", err)
	}
	return e
}

func bootVM(t *testing.T, extraEnv ...string) (*proc, *chapi.Client, *guestKit, string, string) {
	t.Helper()
	dir := vmDir(t, fmt.Sprintf("VM%06d", mrand.IntN(1000000)))
	g := newGuest(t, dir)
	sock := filepath.Join(dir, "api.sock")
	ip := loopbackIP()
	p, c := startReady(t, sock, baseEnv(extraEnv...), bootArgs(sock, g.path, ip)...)
	return p, c, g, ip, dir
}

func TestBootFromCLIIsRunning(t *testing.T) {
	_, c, _, ip, _ := bootVM(t)
	info, err := c.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State != chapi.StateRunning {
		t.Fatalf("state %q, want Running", info.State)
	}
	if len(info.Config.Net) != 1 || info.Config.Net[0].IP != ip || info.Config.Net[0].ID != "_net1" {
		t.Fatalf("net config %+v: want one NIC _net1 with ip %s (ids from CH's shared counter)", info.Config.Net, ip)
	}
	if info.Config.Disks[0].ID != "_disk0" || info.DeviceTree["_disk0"].ID != "_disk0" {
		t.Fatalf("disk id/device tree: %+v %+v", info.Config.Disks, info.DeviceTree)
	}
	ping, err := c.Ping(ctxT(t))
	if err != nil || ping.Version == "" || ping.BuildVersion != "v51.0" || ping.Pid <= 0 {
		t.Fatalf("ping %+v %v", ping, err)
	}
}

func TestPauseTwiceIsInvalidTransition(t *testing.T) {
	_, c, _, _, _ := bootVM(t)
	ctx := ctxT(t)
	if err := c.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	err := c.Pause(ctx, false)
	e := chError(t, err)
	if e.Status != 500 || !strings.HasSuffix(e.Innermost(), "InvalidStateTransition(Paused, Paused)") {
		t.Fatalf("second pause: %v", err)
	}
	if err := c.Pause(ctx, true); err != nil {
		t.Fatalf("idempotent pause of a paused VM: %v", err)
	}
	if err := c.Resume(ctx, false); err != nil {
		t.Fatal(err)
	}
	e = chError(t, c.Resume(ctx, false))
	if e.Status != 500 || !strings.HasSuffix(e.Innermost(), "InvalidStateTransition(Running, Running)") {
		t.Fatalf("second resume: %v", e)
	}
}

func TestSnapshotWhileRunningIsRefused(t *testing.T) {
	_, c, _, _, dir := bootVM(t)
	snap := filepath.Join(dir, "snap")
	os.Mkdir(snap, 0o755)
	e := chError(t, c.Snapshot(ctxT(t), snap))
	if e.Status != 500 || e.Innermost() != "Trying to snapshot while VM is running" {
		t.Fatalf("snapshot of a running VM: %v", e)
	}
	if ents, _ := os.ReadDir(snap); len(ents) != 0 {
		t.Fatalf("a refused snapshot wrote %v", ents)
	}
}

func TestWireQuirks(t *testing.T) {
	_, _, _, _, dir := bootVM(t)
	sock := filepath.Join(dir, "api.sock")
	big := strings.Repeat("x", fakech.MaxPayload+1)
	for _, tc := range []struct {
		name, req  string
		wantStatus string
		wantBody   string // substring
	}{
		{"ping has no reason phrase", "GET /api/v1/vmm.ping HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 200 ", `"build_version"`},
		{"body on vm.pause", "PUT /api/v1/vm.pause HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", "HTTP/1.1 400 ", ""},
		{"unknown path", "GET /api/v1/vm.nosuch HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 404 ", `["Not Found"]`},
		{"path outside /api/v1", "GET /vmm.ping HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 404 ", `["Not Found"]`},
		{"wrong method", "GET /api/v1/vm.pause HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400 ", ""},
		{"GET with a body is read as without", "GET /api/v1/vm.info HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", "HTTP/1.1 200 ", `"state":"Running"`},
		{"malformed JSON", "PUT /api/v1/vm.add-net HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{\"ip\"", "HTTP/1.1 400 ", `"Failed to deserialize JSON"`},
		{"chunked body is refused by micro-http", "PUT /api/v1/vm.add-net HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "HTTP/1.1 400 ", "{ \"error\": \"Invalid request.\n"},
		{"zero length body counts as none", "PUT /api/v1/vm.snapshot HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 400 ", ""},
		{"body over micro-http's limit", "PUT /api/v1/vm.create HTTP/1.1\r\nHost: x\r\nContent-Length: " + fmt.Sprint(len(big)) + "\r\n\r\n" + big, "HTTP/1.1 400 ", "larger than the limit"},
		{"missing required field", "PUT /api/v1/vm.remove-device HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", "HTTP/1.1 400 ", "missing field `id`"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, h, body := rawHTTP(t, sock, tc.req)
			if status != tc.wantStatus {
				t.Fatalf("status line %q, want %q (body %s)", status, tc.wantStatus, body)
			}
			// CH's handlers answer as "Cloud Hypervisor API"; micro-http's
			// own parse errors keep its default "Firecracker API".
			server := "Cloud Hypervisor API"
			if bytes.HasPrefix(body, []byte(`{ "error"`)) {
				server = "Firecracker API"
			}
			if h.Get("Server") != server || h.Get("Content-Type") != "application/json" {
				t.Fatalf("headers %v", h)
			}
			if !bytes.Contains(body, []byte(tc.wantBody)) {
				t.Fatalf("body %s, want it to contain %s", body, tc.wantBody)
			}
		})
	}
	// The VM is untouched by all of that.
	status, h, body := rawHTTP(t, sock, "PUT /api/v1/vm.pause HTTP/1.1\r\nHost: x\r\n\r\n")
	if status != "HTTP/1.1 204 " || h.Get("Content-Length") != "" || len(body) != 0 {
		t.Fatalf("pause: %q %v %q (204 carries no Content-Length)", status, h, body)
	}
}

func TestVMMShutdownAnswers200EmptyAndExits0(t *testing.T) {
	p, _, _, _, dir := bootVM(t)
	sock := filepath.Join(dir, "api.sock")
	status, h, body := rawHTTP(t, sock, "PUT /api/v1/vmm.shutdown HTTP/1.1\r\nHost: x\r\n\r\n")
	if status != "HTTP/1.1 200 " || h.Get("Content-Length") != "0" || len(body) != 0 {
		t.Fatalf("vmm.shutdown: %q %v %q", status, h, body)
	}
	if code := p.wait(); code != 0 {
		t.Fatalf("exit %d after vmm.shutdown", code)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left after a clean exit: %v", err)
	}
}

func TestNotCreatedStatusByCompat(t *testing.T) {
	for _, tc := range []struct {
		compat string
		want   int
	}{{"v51", 500}, {"v53", 404}} {
		t.Run(tc.compat, func(t *testing.T) {
			sock := filepath.Join(vmDir(t, "VMNC"+tc.compat), "api.sock")
			_, c := startReady(t, sock, baseEnv("FAKECH_COMPAT="+tc.compat), "--api-socket", "path="+sock)
			_, err := c.Info(ctxT(t))
			e := chError(t, err)
			if e.Status != tc.want || e.Innermost() != "VM is not created" {
				t.Fatalf("vm.info with no VM: %v, want %d", err, tc.want)
			}
			e = chError(t, c.Pause(ctxT(t), false))
			if e.Status != 500 || e.Innermost() != "VM is not running" {
				t.Fatalf("pause with no VM: %v", e)
			}
		})
	}
}

// TestOneRequestAtATime: a long snapshot holds the VMM thread, so a vm.info
// sent while it runs is answered only after the snapshot finished.
func TestOneRequestAtATime(t *testing.T) {
	trace := newTrace(t)
	_, c, _, _, dir := bootVM(t, "VMCHAOS_TRACE="+trace.path, `FAKECH_TIMING={"snapshot_fixed":"0s","snapshot_per_gib":"60s"}`)
	ctx := ctxT(t)
	if err := c.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(dir, "snap")
	os.Mkdir(snap, 0o755)
	go func() { _ = c.Snapshot(ctx, snap) }() // 512 MiB × 60 s/GiB × 0.01 = 300 ms
	trace.waitPoint(t, "ch.snapshot.begin")
	if _, err := c.Info(ctx); err != nil {
		t.Fatal(err)
	}
	infoDone := failpoint.Now()
	done := trace.waitPoint(t, "ch.snapshot.done")
	if done.TsNs > infoDone {
		t.Fatalf("vm.info was answered while the snapshot was still running")
	}
}

func TestCLIRules(t *testing.T) {
	dir := vmDir(t, "VMCLI")
	sock := filepath.Join(dir, "api.sock")
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"no args prints help", nil, 2, "Usage: cloud-hypervisor"},
		{"unknown flag", []string{"--api-socket", sock, "--bogus"}, 2, "unexpected argument '--bogus'"},
		{"positional", []string{"stray"}, 2, "unexpected argument 'stray'"},
		{"config flag needs a payload", []string{"--api-socket", sock, "--disk", "path=/x"}, 2, "--firmware <firmware>|--kernel <kernel>"},
		{"single flag repeated", []string{"--firmware", "a", "--cpus", "boot=1", "--cpus", "boot=2"}, 2, "cannot be used multiple times"},
		{"missing value", []string{"--api-socket"}, 2, "a value is required"},
		{"version", []string{"--version"}, 0, "cloud-hypervisor v51.0"},
		{"help", []string{"-h"}, 0, "--api-socket"},
		{"bad config value exits 1", []string{"--api-socket", "path=" + sock, "--firmware", "x", "--memory", "size=lots"}, 1, "Error: Cloud Hypervisor exited with the following chain of errors:"},
		{"missing disk exits 1", []string{"--api-socket", "path=" + sock + "2", "--firmware", "x", "--disk", "path=/nonexistent/disk.img"}, 1, "  3: Cannot open disk path\n  4: I/O error (path=/nonexistent/disk.img op=open)\n  5: No such file or directory (os error 2)"},
		{"non-loopback guest address exits 1", []string{"--api-socket", "path=" + sock + "3", "--firmware", "x", "--net", "ip=10.1.2.3"}, 1, "not in 127.0.0.0/8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, "", baseEnv(), tc.args...)
			if code := p.wait(); code != tc.wantCode {
				t.Fatalf("exit %d, want %d\n%s", code, tc.wantCode, p.stderr.String())
			}
			if !strings.Contains(p.stderr.String(), tc.wantOut) {
				t.Fatalf("output does not contain %q:\n%s", tc.wantOut, p.stderr.String())
			}
		})
	}
	// CH binds the socket before it parses the config: a config error exits 1
	// and leaves the socket file behind.
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("socket of the failed start: %v", err)
	}
}

func TestSIGTERMExitsCleanlyAndRemovesSocket(t *testing.T) {
	p, _, _, _, dir := bootVM(t)
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(); code != 0 {
		t.Fatalf("exit %d after SIGINT", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "api.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket after a clean exit: %v", err)
	}
}

func TestKill9LeavesSocketAndCompatDecidesRestart(t *testing.T) {
	for _, tc := range []struct {
		compat    string
		wantStart bool
	}{{"v51", false}, {"v53", true}} {
		t.Run(tc.compat, func(t *testing.T) {
			env := baseEnv("FAKECH_COMPAT=" + tc.compat)
			sock := filepath.Join(vmDir(t, "VMK9"+tc.compat), "api.sock")
			p, _ := startReady(t, sock, env, "--api-socket", "path="+sock)
			p.kill9()
			if _, err := os.Stat(sock); err != nil {
				t.Fatalf("kill -9 must leave the socket file: %v", err)
			}
			if _, err := net.Dial("unix", sock); err == nil {
				t.Fatalf("a stale socket accepted a connection")
			}
			if !tc.wantStart {
				p2 := start(t, sock, env, "--api-socket", "path="+sock)
				if code := p2.wait(); code != 1 {
					t.Fatalf("v51 on a stale socket: exit %d, want 1", code)
				}
				want := "  0: Failed to start the VMM thread\n  1: Error creation API server's socket\n  2: Address already in use (os error 98)"
				if !strings.Contains(p2.stderr.String(), want) {
					t.Fatalf("stderr %q lacks CH's chain %q", p2.stderr.String(), want)
				}
				return
			}
			_, c := startReady(t, sock, env, "--api-socket", "path="+sock)
			if _, err := c.Ping(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			// A second live instance on the same path is refused and leaves
			// the live socket alone.
			p3 := start(t, sock, env, "--api-socket", "path="+sock)
			if code := p3.wait(); code != 1 || !strings.Contains(p3.stderr.String(), "is already in use by another running instance") {
				t.Fatalf("v53 second instance: exit %d\n%s", code, p3.stderr.String())
			}
			if _, err := c.Ping(ctxT(t)); err != nil {
				t.Fatalf("live instance lost its socket: %v", err)
			}
			if _, err := os.Stat(sock + ".lock"); err != nil {
				t.Fatalf("lock file: %v", err)
			}
		})
	}
}

func TestCreateBootShutdownDeleteLifecycle(t *testing.T) {
	dir := vmDir(t, "VMLIFE")
	g := newGuest(t, dir)
	sock := filepath.Join(dir, "api.sock")
	_, c := startReady(t, sock, baseEnv(), "--api-socket", "path="+sock)
	ctx := ctxT(t)
	e := chError(t, c.Boot(ctx))
	if e.Innermost() != "VM config is missing" {
		t.Fatalf("boot without config: %v", e)
	}
	cfg := chapi.VmConfig{Payload: &chapi.PayloadConfig{Firmware: "/fw"}, Disks: []chapi.DiskConfig{{Path: g.path}}}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if e := chError(t, c.Create(ctx, cfg)); e.Innermost() != "VM is already created" {
		t.Fatalf("second create: %v", e)
	}
	info, err := c.Info(ctx)
	if err != nil || info.State != chapi.StateCreated || info.DeviceTree != nil {
		t.Fatalf("after create: %+v %v", info, err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	if e := chError(t, c.Boot(ctx)); e.Innermost() != "VM is already created" {
		t.Fatalf("second boot: %v", e)
	}
	// Hot-plug on a booted VM answers 200 with the id from the shared counter.
	ip := loopbackIP()
	dev, err := c.AddNet(ctx, chapi.NetConfig{IP: ip})
	if err != nil || dev.ID != "_net1" || dev.Bdf == "" {
		t.Fatalf("add-net: %+v %v", dev, err)
	}
	if _, err := c.AddNet(ctx, chapi.NetConfig{IP: loopbackIP(), ID: "_net1"}); !chapi.HasMessage(err, "Identifier _net1 is not unique") {
		t.Fatalf("duplicate id: %v", err)
	}
	if e := chError(t, c.RemoveDevice(ctx, "nosuch")); e.Innermost() != "Failed to find device corresponding to the given identifier" {
		t.Fatalf("remove unknown (v51 wording, no id): %v", e)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	info, err = c.Info(ctx)
	if err != nil || info.State != chapi.StateCreated {
		t.Fatalf("after vm.shutdown CH reports Created: %+v %v", info, err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatalf("boot after shutdown: %v", err)
	}
	if err := c.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Info(ctx); chError(t, err).Innermost() != "VM is not created" {
		t.Fatalf("info after delete: %v", err)
	}
}

// decodeJSONFile reads a snapshot file as JSON.
func decodeJSONFile(t *testing.T, p string, v any) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
}

// TestEventMonitor: --event-monitor gets CH's stream of JSON events.
func TestEventMonitor(t *testing.T) {
	dir := vmDir(t, "VMEVENTS")
	g := newGuest(t, dir)
	sock := filepath.Join(dir, "api.sock")
	events := filepath.Join(dir, "events.json")
	p, c := startReady(t, sock, baseEnv(), bootArgs(sock, g.path, "", "--event-monitor", "path="+events)...)
	ctx := ctxT(t)
	if err := c.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	p.wait()
	b, err := os.ReadFile(events)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var got []string
	for dec.More() {
		var ev struct {
			Timestamp struct{ Secs, Nanos int64 }
			Source    string
			Event     string
		}
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("event stream %s: %v", b, err)
		}
		got = append(got, ev.Source+":"+ev.Event)
	}
	want := "vmm:starting vm:booting vm:booted vm:pausing vm:paused vm:resuming vm:resumed vm:shutdown"
	if strings.Join(got, " ") != want {
		t.Fatalf("events %v, want %s", got, want)
	}
}
