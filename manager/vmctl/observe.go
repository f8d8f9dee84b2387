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
	// observeVerb: the binary has `vmctl observe` (the bundled one), so
	// ReadStore reads the three lists in one exec
	observeVerb bool
}

var _ manager.Observer = (*Observer)(nil)

// NewObserver returns the observer of the store at root/runDir run through exec.
func NewObserver(exec Exec, root, runDir string) *Observer {
	return &Observer{exec: exec, root: root, runDir: runDir}
}

// WithObserveVerb is o reading the store with `vmctl observe`, one exec
// instead of three (ReadStore): only for a vmctl binary that has the verb,
// the bundled one; a binary under test (--manager-bin) keeps the three verbs.
func (o *Observer) WithObserveVerb() *Observer {
	c := *o
	c.observeVerb = true
	return &c
}

// Name is "vmctl".
func (o *Observer) Name() string { return "vmctl" }

// VMs is `vm list -o json`.
func (o *Observer) VMs(ctx context.Context) ([]manager.VM, error) {
	var ws []*api.VM
	if err := o.json(ctx, &ws, "vm", "list", "-o", "json"); err != nil {
		return nil, err
	}
	return vmsOf("vmctl vm list", ws)
}

// vmsOf converts vm list's records; a record without an id is an error.
func vmsOf(verb string, ws []*api.VM) ([]manager.VM, error) {
	out := make([]manager.VM, 0, len(ws))
	for _, w := range ws {
		if w == nil {
			return nil, fmt.Errorf("%s: a null record", verb)
		}
		if w.ID == "" {
			return nil, fmt.Errorf("%s: a record without an id (name %q)", verb, w.Name)
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
	var ws []*api.Snapshot
	if err := o.json(ctx, &ws, "snapshot", "list", "-o", "json"); err != nil {
		return nil, err
	}
	return snapsOf("vmctl snapshot list", ws)
}

// snapsOf converts snapshot list's records; a record without an id is an
// error.
func snapsOf(verb string, ws []*api.Snapshot) ([]manager.Snapshot, error) {
	out := make([]manager.Snapshot, 0, len(ws))
	for _, w := range ws {
		if w == nil {
			return nil, fmt.Errorf("%s: a null record", verb)
		}
		if w.ID == "" {
			return nil, fmt.Errorf("%s: a record without an id (name %q)", verb, w.Name)
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

// ReadStore is `vmctl observe` (WithObserveVerb), one exec for what VMs,
// Snapshots and Check read, judged as strictly: a list absent without its
// error, or a check report that lacks ok or violations or whose ok
// contradicts them, is an error, never an empty store. ok=false: this
// Observer reads with the three verbs.
func (o *Observer) ReadStore(ctx context.Context, check bool) (manager.Store, bool) {
	if !o.observeVerb {
		return manager.Store{}, false
	}
	args := []string{"observe"}
	if !check {
		args = append(args, "--check=false")
	}
	var st manager.Store
	var raw struct {
		VMs            *[]*api.VM       `json:"vms"`
		VMsError       string           `json:"vms_error"`
		Snapshots      *[]*api.Snapshot `json:"snapshots"`
		SnapshotsError string           `json:"snapshots_error"`
		Check          json.RawMessage  `json:"check"`
	}
	if err := o.json(ctx, &raw, args...); err != nil {
		st.VMsErr, st.SnapsErr = err, err
		if check {
			st.CheckErr = err
		}
		return st, true
	}
	st.VMs, st.VMsErr = observed("vm list", raw.VMs, raw.VMsError, vmsOf)
	st.Snaps, st.SnapsErr = observed("snapshot list", raw.Snapshots, raw.SnapshotsError, snapsOf)
	if check {
		st.Check, st.CheckErr = observedCheck(raw.Check)
	}
	return st, true
}

// observed is one list of an observation: its records, or its error.
func observed[W, M any](verb string, ws *[]W, errText string, conv func(string, []W) ([]M, error)) ([]M, error) {
	switch {
	case errText != "":
		return nil, fmt.Errorf("vmctl observe: %s: %s", verb, errText)
	case ws == nil:
		return nil, fmt.Errorf("vmctl observe: no %s and no error", verb)
	}
	return conv("vmctl observe: "+verb, *ws)
}

// observedCheck is the check report of an observation, read as strictly
// as Check reads `vmctl check`.
func observedCheck(b json.RawMessage) (manager.CheckReport, error) {
	var rep manager.CheckReport
	if len(b) == 0 || string(b) == "null" {
		return rep, fmt.Errorf("vmctl observe: no check report")
	}
	if err := decodeReport(b, &rep); err != nil {
		return rep, fmt.Errorf("vmctl observe: check: %w", err)
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
