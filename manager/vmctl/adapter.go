package vmctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/vmctl/api"
)

// Adapter drives one case's vmctl store (root, run dir) through the vmctl
// binary: the verbs of the manager-level catalogue and the Observer's reads.
type Adapter struct {
	*Observer
	opts     manager.Options
	root     string
	runDir   string
	firmware string
}

var _ manager.Embedder = (*Adapter)(nil)

// New returns the adapter of the store under o.Dir; Setup creates it.
func New(o manager.Options) *Adapter {
	a := &Adapter{opts: o, root: filepath.Join(o.Dir, "root"), runDir: filepath.Join(o.Dir, "run"),
		firmware: filepath.Join(o.Dir, "CLOUDHV.fd")}
	a.Observer = NewObserver(a.exec, a.root, a.runDir)
	return a
}

// Setup creates the store dirs and the firmware fixture (fakech checks only
// that it exists). vmctl takes the raw guest image as it is.
func (a *Adapter) Setup(ctx context.Context) error {
	for _, d := range []string{a.root, a.runDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("vmctl adapter: %w", err)
		}
	}
	if err := os.WriteFile(a.firmware, []byte("fake firmware\n"), 0o644); err != nil {
		return fmt.Errorf("vmctl adapter: firmware fixture: %w", err)
	}
	if _, err := os.Stat(a.opts.Image); err != nil {
		return fmt.Errorf("vmctl adapter: guest image: %w", err)
	}
	return nil
}

// GuestNet: vmctl's fake NICs are loopback addresses of Options.NetPool
// where fakech's guest answers SSH, in the harness's own namespace.
func (a *Adapter) GuestNet() bool { return true }

// ImageRef is the raw guest image file.
func (a *Adapter) ImageRef() string { return a.opts.Image }

// Env is the environment of every vmctl the adapter runs.
func (a *Adapter) Env() []string {
	env := []string{
		"PATH=" + a.opts.VMMDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + a.opts.Dir,
		"VMCTL_ROOT_DIR=" + a.root,
		"VMCTL_RUN_DIR=" + a.runDir,
		"VMCTL_CH_BINARY=" + filepath.Join(a.opts.VMMDir, VMMName),
		"VMCTL_FIRMWARE=" + a.firmware,
	}
	if a.opts.NetPool != "" {
		env = append(env, "VMCTL_NET_POOL="+a.opts.NetPool)
	}
	return append(env, a.opts.Env...)
}

// Command maps a verb to vmctl's command line. vmctl has no in-place
// restore.
func (a *Adapter) Command(c manager.Call) ([]string, error) {
	var args []string
	switch c.Verb {
	case manager.VerbCreate:
		nics := "0"
		if c.NICs != nil {
			nics = strconv.Itoa(*c.NICs) // a guest the harness reaches (GuestNet)
		}
		args = []string{"vm", "run", "--name", c.Name, "--nics", nics, "-o", "json", a.ImageRef()}
	case manager.VerbClone:
		if c.NICs != nil {
			// The agent's clone: NICs set, the result read from inspect.
			args = []string{"vm", "clone", "--name", c.Name, "--nics", strconv.Itoa(*c.NICs), c.Snapshot}
		} else {
			args = []string{"vm", "clone", "--name", c.Name, "-o", "json", c.Snapshot}
		}
	case manager.VerbSnapshotSave:
		args = []string{"snapshot", "save", "--name", c.Name, c.VM}
	case manager.VerbSnapshotRm:
		args = []string{"snapshot", "rm", c.Snapshot}
	case manager.VerbStart:
		args = []string{"vm", "start", c.VM}
	case manager.VerbStop:
		args = []string{"vm", "stop", c.VM}
	case manager.VerbRm:
		args = []string{"vm", "rm", "--force", c.VM}
	case manager.VerbGC:
		args = []string{"gc"}
	case manager.VerbRecoverStale:
		args = []string{"vm", "reconcile-stale-create", c.VM, "-o", "json"}
	case manager.VerbInspect:
		args = []string{"vm", "inspect", c.VM, "-o", "json"}
	case manager.VerbList:
		args = []string{"vm", "list", "-o", "json"}
	case manager.VerbSnapshotList:
		args = []string{"snapshot", "list", "-o", "json"}
	case manager.VerbNIC:
		if c.NICs == nil {
			return nil, fmt.Errorf("vmctl: %s: no NIC count", c)
		}
		args = []string{"vm", "net", c.VM, "--nics", strconv.Itoa(*c.NICs)}
	case manager.VerbExec:
		args = append([]string{"vm", "exec", c.VM, "--"}, c.Argv...)
	case manager.VerbExport:
		args = []string{"snapshot", "export", c.Snapshot, "-o", c.File}
	case manager.VerbImport:
		args = []string{"snapshot", "import", "--name", c.Name, c.File}
	case manager.VerbEvents:
		args = []string{"vm", "status", "--event", "--format", "json", "-n", c.Interval}
	default:
		return nil, fmt.Errorf("vmctl: %s: %w", c.Verb, manager.ErrNotSupported)
	}
	return append([]string{a.opts.Bin}, args...), nil
}

// EventCommand is `vm status --event --format json -n 1` (vmctl scales the
// interval by VMCHAOS_TIME_SCALE).
func (a *Adapter) EventCommand() []string {
	return []string{a.opts.Bin, "vm", "status", "--event", "--format", "json", "-n", "1"}
}

// ParseEvent decodes one api.StatusEvent ({"event":..., "vm":{inspect
// shape}}).
func (a *Adapter) ParseEvent(line []byte) (manager.Event, error) {
	var w api.StatusEvent
	if err := json.Unmarshal(line, &w); err != nil {
		return manager.Event{}, fmt.Errorf("vmctl event: %w (%.200q)", err, line)
	}
	if w.Event == "" || w.VM.ID == "" {
		return manager.Event{}, fmt.Errorf("vmctl event: no event or vm id in %.200q", line)
	}
	return manager.Event{Type: w.Event, ID: w.VM.ID, Name: w.VM.Name, State: w.VM.State}, nil
}

// TempDirs are the staging dirs without a live builder, as `vmctl check`
// reports them.
func (a *Adapter) TempDirs(ctx context.Context) ([]string, error) {
	rep, err := a.Check(ctx)
	if err != nil {
		return nil, err
	}
	return rep.Of(manager.CheckLeftoverStaging), nil
}

// exec runs vmctl with the adapter's environment; a non-zero exit is an
// error that carries stderr, returned with whatever stdout it printed.
func (a *Adapter) exec(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, a.opts.Bin, args...)
	cmd.Env = a.Env()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out.Bytes(), fmt.Errorf("exit %d: %s", ee.ExitCode(), strings.TrimSpace(errb.String()))
		}
		return out.Bytes(), err
	}
	return out.Bytes(), nil
}

var _ manager.StoreLayout = (*Adapter)(nil)

// StoreDirs: the root (records, images, the VMs' disks, snapshots) is
// durable; the run dir (API sockets, pid files) is what a reboot empties.
func (a *Adapter) StoreDirs() (durable, volatile []string) {
	return []string{a.root}, []string{a.runDir}
}
