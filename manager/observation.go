// Package manager is what the scenarios know about a VM manager (docs/architecture.md
// §14): the observations the convergence checker reads (this file) and the
// verbs the manager-level catalogue drives (manager.go). One sub-package per
// manager (manager/vmctl, manager/cocoon) turns the manager's own black-box
// outputs (its `-o json` verbs, its lock files, its VMM command lines) into
// these types; the checker never imports a manager's internals.
package manager

import (
	"context"
	"errors"
)

// VM states as a manager's list reports them (cocoon's vocabulary, which
// vmctl shares). StateStale is how a list shows a running record whose VMM is
// dead; it is never written back.
const (
	StateCreating = "creating"
	StateCreated  = "created"
	StateRunning  = "running"
	StateStopped  = "stopped"
	StateError    = "error"
	StateStale    = "stopped (stale)"
)

// Snapshot states.
const (
	SnapPending = "pending" // the name is held; data not finalized yet
	SnapReady   = "ready"
)

// ErrNotSupported is returned by an observation the manager does not expose
// (a manager without a check verb, or without lock files). A check that needs
// it must not pass on it: it reports the data as missing.
var ErrNotSupported = errors.New("manager: observation not supported")

// VM is one VM record as the manager lists it.
type VM struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	State   string `json:"state"`
	PID     int    `json:"pid,omitempty"`     // VMM pid as recorded (0: none)
	Address string `json:"address,omitempty"` // guest SSH address ip:port of the first NIC; "" without a NIC
	Reason  string `json:"reason,omitempty"`  // why the record is in its state, when the manager says
	// Netns is the network namespace file the first NIC lives in, as the
	// manager records it (cocoon's CNI: /var/run/netns/cocoon-<ID>, seen
	// from the mount namespace cocoon ran in); "" when the manager does not
	// say, or the NIC is in the manager's own namespace. Address is reached
	// from inside it.
	Netns string `json:"netns,omitempty"`
	// NICs are the record's network interfaces and Ejecting the NIC ids
	// whose unplug the guest had not acked when the record was written
	// (a manager that does not say leaves both empty).
	NICs     []NIC    `json:"nics,omitempty"`
	Ejecting []string `json:"ejecting,omitempty"`
}

// NIC is one network interface of a VM record: the id its VMM knows the
// device by, and its MAC.
type NIC struct {
	ID  string `json:"id"`
	MAC string `json:"mac"`
}

// Snapshot is one snapshot record as the manager lists it.
type Snapshot struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	State string `json:"state"` // pending | ready
	VMID  string `json:"vm_id,omitempty"`
	// Dir holds the snapshot's data as the VMM wrote it (config.json,
	// state.json); "" when the manager does not say.
	Dir string `json:"dir,omitempty"`
}

// Violation is one broken invariant the manager's own consistency check
// found, with its evidence.
type Violation struct {
	Invariant string `json:"invariant"`
	Evidence  string `json:"evidence"`
}

// CheckReport is the manager's own consistency check (`vmctl check`).
// Invariant names the checker reads from it: CheckLeftoverStaging,
// CheckUnreferencedDirs, CheckStoreLoadable, CheckSnapshotData,
// CheckTombstone, CheckIndexes.
type CheckReport struct {
	OK         bool        `json:"ok"`
	Violations []Violation `json:"violations"`
}

// Invariant names of a CheckReport the checker judges through it.
const (
	CheckLeftoverStaging  = "no-leftover-staging"
	CheckUnreferencedDirs = "no-unreferenced-dirs"
	CheckStoreLoadable    = "store-loadable"
	CheckSnapshotData     = "snapshot-data"
	CheckTombstone        = "no-tombstone"
	CheckIndexes          = "indexes-consistent"
)

// Of returns the evidence of every violation of invariant.
func (r CheckReport) Of(invariant string) []string {
	var out []string
	for _, v := range r.Violations {
		if v.Invariant == invariant {
			out = append(out, v.Evidence)
		}
	}
	return out
}

// Store is one read of a manager's store: its VM list, snapshot list and
// (asked for) check report, each with the error that stands in its place.
type Store struct {
	VMs      []VM
	VMsErr   error
	Snaps    []Snapshot
	SnapsErr error
	Check    CheckReport
	CheckErr error
}

// StoreReader is an Observer that can read VMs, Snapshots and Check in one
// call (vmctl's `observe` verb: one exec a poll instead of three). ReadStore
// returns ok=false when this manager binary has no such call; the caller
// then reads the three in turn (ReadStore below).
type StoreReader interface {
	ReadStore(ctx context.Context, check bool) (st Store, ok bool)
}

// ReadStore reads m's store: in one call when m is a StoreReader that has
// one, else VMs, Snapshots and Check in turn. The data and the errors are
// the same either way; only the cost differs.
func ReadStore(ctx context.Context, m Observer, check bool) Store {
	if r, ok := m.(StoreReader); ok {
		if st, ok := r.ReadStore(ctx, check); ok {
			return st
		}
	}
	var st Store
	st.VMs, st.VMsErr = m.VMs(ctx)
	st.Snaps, st.SnapsErr = m.Snapshots(ctx)
	if check {
		st.Check, st.CheckErr = m.Check(ctx)
	}
	return st
}

// Holder is a process holding a lock, identified through /proc/locks (by
// device and inode) and /proc/PID.
type Holder struct {
	PID  int      `json:"pid"`
	Kind string   `json:"kind"` // FLOCK | POSIX | OFDLCK
	Mode string   `json:"mode"` // READ | WRITE
	Argv []string `json:"argv,omitempty"`
}

// Observer reads one manager's state for the checker, only through what the
// manager shows a user: its list/check verbs, the lock files it documents, the
// command lines of the VMMs it launches. Every method that can fail returns
// its error: a check whose data is missing never passes.
type Observer interface {
	// Name is the manager's name (vmctl, cocoon), for evidence.
	Name() string
	// VMs is `vm list -o json`.
	VMs(ctx context.Context) ([]VM, error)
	// Snapshots is `snapshot list -o json`.
	Snapshots(ctx context.Context) ([]Snapshot, error)
	// Check is the manager's own consistency report; ErrNotSupported when
	// it has none. A report with violations is a result, not an error.
	Check(ctx context.Context) (CheckReport, error)
	// OpsLockPath is the file whose lock a live operation on vm id holds
	// ("" when the manager exposes none).
	OpsLockPath(vmID string) string
	// LeasePath is the file whose lock a live builder or reader of the
	// snapshot holds ("" when the manager exposes none).
	LeasePath(snapID string) string
	// APISocket is the VMM API socket of vm id.
	APISocket(vmID string) string
	// APISockets lists every VMM API socket present, by VM id.
	APISockets() (map[string]string, error)
	// VMMOf tells whether a process with this argv is a VMM this manager
	// launched, and for which VM id.
	VMMOf(argv []string) (vmID string, ok bool)
}
