// Package vmctl is the manager adapter of the bundled vmctl (docs/architecture.md
// §14). It reads vmctl only as a user can: the binary's `-o json` verbs, the
// lock files and socket paths its docs fix (docs/architecture.md §4.1,
// §4.3). It decodes those outputs with vmctl's wire types (vmctl/api) and
// turns them into the manager's observations; it never imports the vmctl
// library.
package vmctl

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/vmctl/api"
)

// Exec runs the vmctl binary with args (the way the stack runs it: its env,
// its pid namespace) and returns stdout; a non-zero exit is an error, with
// whatever stdout it printed.
type Exec func(ctx context.Context, args ...string) ([]byte, error)

// VMMName is the basename of the VMM binary vmctl launches.
const VMMName = "cloud-hypervisor"

// Observer reads one vmctl store (root and run dir) through exec.
type Observer struct {
	exec   Exec
	root   string
	runDir string
}

var _ manager.Observer = (*Observer)(nil)

// NewObserver returns the observer of the store at root/runDir run through exec.
func NewObserver(exec Exec, root, runDir string) *Observer {
	return &Observer{exec: exec, root: root, runDir: runDir}
}

// Name is "vmctl".
func (o *Observer) Name() string { return "vmctl" }

// VMs is `vm list -o json`.
func (o *Observer) VMs(ctx context.Context) ([]manager.VM, error) {
	var ws []api.VM
	if err := o.json(ctx, &ws, "vm", "list", "-o", "json"); err != nil {
		return nil, err
	}
	out := make([]manager.VM, 0, len(ws))
	for _, w := range ws {
		if w.ID == "" {
			return nil, fmt.Errorf("vmctl vm list: a record without an id (name %q)", w.Name)
		}
		v := manager.VM{ID: w.ID, Name: w.Name, State: w.State, PID: w.Pid, Reason: w.Reason, Ejecting: w.Ejecting}
		for _, n := range w.Network {
			v.NICs = append(v.NICs, manager.NIC{ID: n.ID, MAC: n.MAC})
		}
		if len(w.Network) > 0 && w.Network[0].IP != "" {
			v.Address = w.Network[0].Address()
		}
		out = append(out, v)
	}
	return out, nil
}

// Snapshots is `snapshot list -o json`.
func (o *Observer) Snapshots(ctx context.Context) ([]manager.Snapshot, error) {
	var ws []api.Snapshot
	if err := o.json(ctx, &ws, "snapshot", "list", "-o", "json"); err != nil {
		return nil, err
	}
	out := make([]manager.Snapshot, 0, len(ws))
	for _, w := range ws {
		if w.ID == "" {
			return nil, fmt.Errorf("vmctl snapshot list: a record without an id (name %q)", w.Name)
		}
		out = append(out, manager.Snapshot{ID: w.ID, Name: w.Name, State: w.State, VMID: w.VMID, Dir: w.Dir})
	}
	return out, nil
}

// Check is `vmctl check`: it prints its JSON report and exits 1 when a
// violation was found, so a report with violations on stdout is the result,
// not an error.
func (o *Observer) Check(ctx context.Context) (manager.CheckReport, error) {
	var rep manager.CheckReport
	b, err := o.exec(ctx, "check")
	if derr := decodeReport(b, &rep); derr != nil {
		if err != nil {
			return rep, fmt.Errorf("vmctl check: %w", err)
		}
		return rep, fmt.Errorf("vmctl check: %w", derr)
	}
	if err != nil && rep.OK {
		return rep, fmt.Errorf("vmctl check: report says ok but the verb failed: %w", err)
	}
	if err == nil && !rep.OK {
		return rep, fmt.Errorf("vmctl check: report has %d violation(s) but the verb exited 0", len(rep.Violations))
	}
	return rep, nil
}

// decodeReport reads an api.CheckReport strictly: a report that lacks ok or
// violations is missing data, not a clean store.
func decodeReport(b []byte, rep *manager.CheckReport) error {
	var raw struct {
		OK         *bool            `json:"ok"`
		Violations *[]api.Violation `json:"violations"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("decode: %w (%.200q)", err, b)
	}
	if raw.OK == nil || raw.Violations == nil {
		return fmt.Errorf("decode: no ok/violations in %.200q", b)
	}
	rep.OK, rep.Violations = *raw.OK, make([]manager.Violation, 0, len(*raw.Violations))
	for _, v := range *raw.Violations {
		rep.Violations = append(rep.Violations, manager.Violation{Invariant: v.Invariant, Evidence: v.Evidence})
	}
	if rep.OK != (len(rep.Violations) == 0) {
		return fmt.Errorf("decode: ok=%v with %d violation(s)", rep.OK, len(rep.Violations))
	}
	return nil
}

func (o *Observer) json(ctx context.Context, out any, args ...string) error {
	b, err := o.exec(ctx, args...)
	if err != nil {
		return fmt.Errorf("vmctl %s: %w", strings.Join(args, " "), err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("vmctl %s: decode: %w (%.200q)", strings.Join(args, " "), err, b)
	}
	return nil
}

// OpsLockPath is <root>/locks/vm/<ID>.lock (§4.1: outside the VM's dirs,
// never deleted).
func (o *Observer) OpsLockPath(vmID string) string {
	return filepath.Join(o.root, "locks", "vm", vmID+".lock")
}

// LeasePath is <root>/snapshots/<ID>.lease (§4.1: kept forever).
func (o *Observer) LeasePath(snapID string) string {
	return filepath.Join(o.root, "snapshots", snapID+".lease")
}

// APISocket is <run>/<ID>/api.sock (§4.3).
func (o *Observer) APISocket(vmID string) string {
	return filepath.Join(o.runDir, vmID, "api.sock")
}

// APISockets lists <run>/*/api.sock.
func (o *Observer) APISockets() (map[string]string, error) {
	ents, err := os.ReadDir(o.runDir)
	if os.IsNotExist(err) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("vmctl run dir: %w", err)
	}
	out := map[string]string{}
	for _, e := range ents {
		p := o.APISocket(e.Name())
		if _, err := os.Lstat(p); err == nil {
			out[e.Name()] = p
		} else if !os.IsNotExist(err) {
			return nil, fmt.Errorf("vmctl run dir: %w", err)
		}
	}
	return out, nil
}

// VMMOf: a process is this store's VMM of vm ID when its argv[0] basename is
// the VMM binary and an argument names <run>/<ID>/api.sock (the rule vmctl
// itself uses before it signals a VMM, §4.3).
func (o *Observer) VMMOf(argv []string) (string, bool) {
	if len(argv) == 0 || filepath.Base(argv[0]) != VMMName {
		return "", false
	}
	prefix := o.runDir + "/"
	for _, a := range argv[1:] {
		i := strings.Index(a, prefix)
		if i < 0 {
			continue
		}
		if id, rest, ok := strings.Cut(a[i+len(prefix):], "/"); ok && id != "" && strings.HasPrefix(rest, "api.sock") {
			return id, true
		}
	}
	return "", false
}
