// Package registrytest starts a real OCI registry (the CNCF distribution
// server, Debian's docker-registry) for a test: its own storage and config
// under the test's temp dir, plain HTTP on a free port of 127.0.0.1, the
// process killed by its pid at cleanup. Tests that need it skip, with the
// reason, where the binary is missing.
package registrytest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Binary is the distribution server scripts/setup.sh installs.
const Binary = "/usr/bin/docker-registry"

const config = `version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`

// Registry is one running server.
type Registry struct {
	URL     string // http://127.0.0.1:PORT
	Storage string
	cmd     *exec.Cmd
}

// Start starts a registry for t and waits until /v2/ answers.
func Start(t testing.TB) *Registry {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Skipf("no OCI registry: %s is missing (Debian package docker-registry; scripts/setup.sh installs it)", Binary)
	}
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r := &Registry{URL: "http://" + addr, Storage: filepath.Join(dir, "storage")}
	cfg := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, config, r.Storage, addr), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		t.Fatal(err)
	}
	r.cmd = exec.Command(Binary, "serve", cfg)
	r.cmd.Stdout, r.cmd.Stderr = log, log
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill() // by its pid, never by name
		_ = r.cmd.Wait()
		log.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		resp, err := http.Get(r.URL + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return r
			}
		}
		select {
		case <-ctx.Done():
			b, _ := os.ReadFile(filepath.Join(dir, "registry.log"))
			t.Fatalf("registry %s not answering: %v\n%s", r.URL, err, b)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop kills the server (SIGKILL by pid): a test of an unreachable registry.
func (r *Registry) Stop() {
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
}
