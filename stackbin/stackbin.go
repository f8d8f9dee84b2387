// Package stackbin finds (or builds) the binaries of the bundled stack:
// vmctl, nodeagent, fakech and fakech installed as cloud-hypervisor, and the
// cluster's control plane. Tests and the runner use it so that every
// process under test is the real binary.
package stackbin

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vmchaos/vmchaos/internal/ownedtemp"
)

// Env names a directory that already holds the built binaries (make sets it).
const Env = "VMCHAOS_BIN"

// Names are the binaries a stack dir must hold.
var Names = []string{"vmctl", "nodeagent", "fakech", "cloud-hypervisor", "controlplane", "vmchaos-writer"}

var (
	once   sync.Once
	dir    string
	dirErr error
	built  bool // dir is a temp dir this process built and must remove
)

// Dir returns a directory holding every binary in Names. Order: $VMCHAOS_BIN;
// the directory of the running executable (an installed vmchaos); otherwise a
// fresh `go build` of ./cmd/... into a temp dir (tests run from the module).
func Dir() (string, error) {
	once.Do(func() { dir, dirErr = find() })
	return dir, dirErr
}

// Path returns the path of one binary.
func Path(name string) (string, error) {
	d, err := Dir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, name), nil
}

// Cleanup removes the binaries if this process built them (a TestMain calls
// it after m.Run); a $VMCHAOS_BIN or installed dir is never touched.
func Cleanup() {
	if built {
		_ = os.RemoveAll(dir)
	}
}

func complete(d string) bool {
	for _, n := range Names {
		if fi, err := os.Stat(filepath.Join(d, n)); err != nil || fi.IsDir() {
			return false
		}
	}
	return true
}

func find() (string, error) {
	if d := os.Getenv(Env); d != "" {
		if !complete(d) {
			return "", fmt.Errorf("%s=%s does not hold %s (run `make build`)", Env, d, strings.Join(Names, ", "))
		}
		return d, nil
	}
	if exe, err := os.Executable(); err == nil && complete(filepath.Dir(exe)) {
		return filepath.Dir(exe), nil
	}
	return build()
}

func build() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("stack binaries: set %s or run from the vmchaos module", Env)
	}
	// owned by this test binary: a killed `go test` leaves it for
	// `vmchaos doctor --clean`, which removes it once this process is gone
	d, err := ownedtemp.Mkdir("vmchaos-bin-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", d+"/", "./cmd/vmctl", "./cmd/nodeagent", "./cmd/fakech", "./cmd/controlplane", "./cmd/vmchaos-writer")
	cmd.Dir = filepath.Dir(mod)
	// static, as `make build` builds them: the stack execs vmctl dozens of
	// times a case, and a static binary skips the dynamic loader
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(d)
		return "", fmt.Errorf("stack binaries: go build: %v\n%s", err, b)
	}
	if err := copyFile(filepath.Join(d, "fakech"), filepath.Join(d, "cloud-hypervisor")); err != nil {
		return "", err
	}
	built = true
	return d, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Main is a test package's TestMain body: it points *path at the named
// binary ($VMCHAOS_BIN's, or built once), runs the tests and removes what
// it built: `func TestMain(m *testing.M) { os.Exit(stackbin.Main(m, "fakech", &fakechBin)) }`.
func Main(m interface{ Run() int }, name string, path *string) int {
	p, err := Path(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer Cleanup()
	*path = p
	return m.Run()
}
