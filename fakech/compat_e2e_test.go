package fakech_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/chapi"
)

// TestRestoreOptionsByVersion: v51's RestoreConfig has only source_url,
// prefault and net_fds, so a JSON "resume":true is ignored and the VM stays
// Paused, and --restore ...,resume=on is an unknown option (exit 1); v52
// added resume and memory_restore_mode. CH: vmm/src/config.rs RestoreConfig
// and RestoreConfig::parse in v51.0 and v52.0.
func TestRestoreOptionsByVersion(t *testing.T) {
	p, c, _, _, dir := bootVM(t)
	snap := snapshotVM(t, c, dir)
	p.kill9()
	for _, tc := range []struct {
		compat    string
		wantState string
	}{{"v51", chapi.StatePaused}, {"v52", chapi.StateRunning}, {"v53", chapi.StateRunning}} {
		t.Run(tc.compat, func(t *testing.T) {
			env := baseEnv("FAKECH_COMPAT=" + tc.compat)
			sock := filepath.Join(vmDir(t, "VMR"+tc.compat), "api.sock")
			_, c2 := startReady(t, sock, env, "--api-socket", "path="+sock)
			ctx := ctxT(t)
			if err := c2.Restore(ctx, chapi.RestoreConfig{SourceURL: "file://" + snap, Resume: true, MemoryRestoreMode: "Copy"}); err != nil {
				t.Fatal(err)
			}
			if info, err := c2.Info(ctx); err != nil || info.State != tc.wantState {
				t.Fatalf("after a JSON restore with resume:true: %v %v, want %s", info.State, err, tc.wantState)
			}
			sock2 := filepath.Join(vmDir(t, "VMC"+tc.compat), "api.sock")
			args := []string{"--api-socket", "path=" + sock2, "--restore", "source_url=file://" + snap + ",resume=on"}
			if tc.compat == "v51" {
				p3 := start(t, sock2, env, args...)
				if code := p3.wait(); code != 1 || !strings.Contains(p3.stderr.String(), "unknown option: resume") {
					t.Fatalf("v51 --restore resume=on: exit %d\n%s", code, p3.stderr.String())
				}
				return
			}
			_, c3 := startReady(t, sock2, env, args...)
			if info, err := c3.Info(ctx); err != nil || info.State != chapi.StateRunning {
				t.Fatalf("--restore resume=on: %v %v", info.State, err)
			}
		})
	}
}
