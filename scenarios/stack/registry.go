package stack

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/vmchaos/vmchaos/injector"
)

// RegistryBinary is the CNCF distribution server as Debian packages it
// (docker-registry, installed by scripts/setup.sh).
const RegistryBinary = "/usr/bin/docker-registry"

// RegistryAvailable is nil where a case can run a real registry, else why
// not.
func RegistryAvailable() error {
	if _, err := exec.LookPath(RegistryBinary); err != nil {
		return fmt.Errorf("no OCI registry: %s is missing (Debian package docker-registry; scripts/setup.sh installs it as root)", RegistryBinary)
	}
	return nil
}

// registryConfig is the distribution server's configuration: filesystem
// storage in the case's own dir, deletes enabled (a wake drops its
// :hibernate tag), no auth, plain HTTP on a loopback address.
const registryConfig = `version: 0.1
log:
  level: info
  formatter: text
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: %s
`

// startRegistry starts the case's registry as a supervised unit
// (Restart=always, like the agent: a SIGKILLed registry comes back after
// RestartSec, a stopped one when the operator starts it), on a free port of
// 127.0.0.1 that stays its address across restarts (with a net path: its
// own namespace, at NetRegistryAddr), and waits until /v2/ answers. The unit's main pid is tracked by the supervisor; Close removes
// it with the other units. Its log goes to logs/registry.log of the case.
func (s *Stack) startRegistry(ctx context.Context) error {
	if err := RegistryAvailable(); err != nil {
		return err
	}
	// alone in its namespace, the registry's address is the same in
	// every case; else a free port of the host's loopback
	addr := NetRegistryAddr
	if s.Net == nil {
		var err error
		if addr, err = freeLoopbackAddr(s.Loopback); err != nil {
			return fmt.Errorf("stack: registry address: %w", err)
		}
	}
	dir := filepath.Join(s.Dir, "oci")
	if err := os.MkdirAll(filepath.Join(dir, "storage"), 0o755); err != nil {
		return fmt.Errorf("stack: registry: %w", err)
	}
	if s.opts.RegistryDisk {
		// mounted before the registry starts: it must never write below
		// the mount point, where a fill would not reach
		var nss []string
		if ns := injector.MountNS(s.run.Sup); ns != "" {
			nss = append(nss, ns)
		}
		d, err := mountRegistryDisk(filepath.Join(dir, "storage"), RegistryDiskSize, nss)
		if err != nil {
			return fmt.Errorf("stack: %w", err)
		}
		s.RegistryDisk = d
	}
	cfg := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, registryConfig, filepath.Join(dir, "storage"), addr), 0o644); err != nil {
		return fmt.Errorf("stack: registry config: %w", err)
	}
	rs := time.Duration(float64(5*time.Second) * s.run.Scale)
	argv := []string{RegistryBinary, "serve", cfg}
	if s.Net != nil {
		argv = Wrap(s.Net.RegFile, argv)
	}
	spec := injector.UnitSpec{Name: s.RegistryUnit, Argv: argv, Dir: dir,
		Env: []string{"HOME=" + s.Dir}, RestartSec: rs, TimeoutStopSec: 10 * time.Second,
		LogPath: filepath.Join(s.LogDir, "registry.log")}
	if err := s.run.Sup.Start(ctx, spec); err != nil {
		return fmt.Errorf("stack: start registry: %w", err)
	}
	s.unitsUp[s.RegistryUnit] = true
	s.RegistryURL = "http://" + addr
	s.RegistryStorage = filepath.Join(dir, "storage")
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return s.WaitRegistry(wctx)
}

// WaitRegistry waits until the registry answers GET /v2/ with 200.
func (s *Stack) WaitRegistry(ctx context.Context) error {
	c := s.RegistryClient(2 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.RegistryURL+"/v2/", nil)
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack: registry %s not answering /v2/: %v", s.RegistryURL, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// freeLoopbackAddr is a port of the stack's own loopback address (ip)
// nothing listens on now. The registry binds it a moment later (and again
// after each restart): no other case listens on ip, and a port taken in
// between fails the case's setup loudly, never silently.
func freeLoopbackAddr(ip string) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}
