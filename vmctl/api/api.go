// Package api holds the JSON shapes vmctl's verbs print and the exact
// strings embedders match on (docs/architecture.md §4.2, §4.5): the wire
// contract between vmctl and whoever reads it (nodeagent, the scenario stack,
// the manager adapter). It imports only the standard library, so a reader of
// vmctl's output never links vmctl itself, and a change to vmctl's internals
// cannot move what its readers see.
package api

import (
	"net"
	"strconv"
	"time"
)

// VM states stored in the index. "stopped (stale)" is display-only: a running
// record whose VMM is dead is shown that way by list/inspect/status and never
// written back.
const (
	StateCreating = "creating"
	StateCreated  = "created"
	StateRunning  = "running"
	StateStopped  = "stopped"
	StateError    = "error"
	StateStale    = "stopped (stale)"
)

// Snapshot record states.
const (
	SnapPending = "pending"
	SnapReady   = "ready"
)

// VMConfig is what the VM was created with.
type VMConfig struct {
	CPU     int    `json:"cpu"`
	Memory  int64  `json:"memory"`  // bytes
	Storage int64  `json:"storage"` // bytes
	NICs    int    `json:"nics"`
	Image   string `json:"image"`
}

// NIC is one network interface of a VM and the guest address behind it.
type NIC struct {
	ID      string `json:"id"`
	MAC     string `json:"mac"`
	IP      string `json:"ip"`
	Mask    string `json:"mask,omitempty"`
	SSHPort int    `json:"ssh_port,omitempty"`
	// Tap mode only (real cloud-hypervisor): the TAP device and its host
	// side address, which CH's --net ip= sets; IP above stays the guest's.
	Tap    string `json:"tap,omitempty"`
	HostIP string `json:"host_ip,omitempty"`
}

// Address is the guest's SSH address "ip:port" (port 22 when the record
// names none).
func (n NIC) Address() string {
	p := n.SSHPort
	if p == 0 {
		p = 22
	}
	return net.JoinHostPort(n.IP, strconv.Itoa(p))
}

// VM is the record vmctl stores in its index and the shape `vm inspect -o
// json` and `vm list -o json` print (State may read "stopped (stale)" there,
// and VMMState is filled only when inspect asked the VMM).
type VM struct {
	ID      string   `json:"id"`
	Name    string   `json:"name"`
	State   string   `json:"state"`
	Config  VMConfig `json:"config"`
	RunDir  string   `json:"run_dir"`
	Pid     int      `json:"pid"`
	Network []NIC    `json:"network"`
	// Ejecting: NIC ids vm net asked the VMM to unplug whose eject the
	// guest had not acked yet (CH keeps them in its device tree until then).
	Ejecting    []string  `json:"ejecting,omitempty"`
	SnapshotIDs []string  `json:"snapshot_ids,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
	VMMState    string    `json:"vmm_state,omitempty"`
}

// GuestAddress returns the first NIC's SSH address, or "" with no NIC.
func (v VM) GuestAddress() string {
	if len(v.Network) == 0 {
		return ""
	}
	return v.Network[0].Address()
}

// Snapshot is a snapshot record as stored and as `snapshot list/inspect -o
// json` print it.
type Snapshot struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	State     string    `json:"state"` // pending | ready
	VMID      string    `json:"vm_id"`
	Dir       string    `json:"dir"`
	Size      int64     `json:"size"`
	CreatedAt time.Time `json:"created_at"`
}

// Tombstone marks a delete in progress in the index; a converger rolls it
// forward.
type Tombstone struct {
	ID     string    `json:"id"`
	Name   string    `json:"name"`
	Dirs   []string  `json:"dirs"`
	Pid    int       `json:"pid,omitempty"`
	Since  time.Time `json:"since"`
	Reason string    `json:"reason,omitempty"`
	IPs    []string  `json:"ips,omitempty"` // guest addresses still held until the delete completes
}

// StaleCreateResult is the output of `vm reconcile-stale-create -o json`.
type StaleCreateResult struct {
	ID      string `json:"id"`
	Outcome string `json:"outcome"` // busy | not-found | not-creating | collected
}

// Outcomes of reconcile-stale-create.
const (
	OutcomeBusy        = "busy"
	OutcomeNotFound    = "not-found"
	OutcomeNotCreating = "not-creating"
	OutcomeCollected   = "collected"
)

// Event kinds of `vm status --event`.
const (
	EventAdded    = "ADDED"
	EventModified = "MODIFIED"
	EventDeleted  = "DELETED"
)

// StatusEvent is one line of `vm status --event --format json`.
type StatusEvent struct {
	Event string `json:"event"` // ADDED | MODIFIED | DELETED
	VM    VM     `json:"vm"`
}

// Violation is one broken store invariant with its evidence.
type Violation struct {
	Invariant string `json:"invariant"`
	Evidence  string `json:"evidence"`
}

// CheckReport is the output of `vmctl check` (it exits 1 when Violations is
// not empty).
type CheckReport struct {
	OK         bool        `json:"ok"`
	Violations []Violation `json:"violations"`
}

// Observation is the output of `vmctl observe`: what `vm list -o json`,
// `snapshot list -o json` and `check` print, read one after the other in
// one process (a poller's one exec instead of three). A list that could not
// be read carries its error instead of its data; Check is absent with
// --check=false.
type Observation struct {
	VMs            []*VM        `json:"vms"`
	VMsError       string       `json:"vms_error,omitempty"`
	Snapshots      []*Snapshot  `json:"snapshots"`
	SnapshotsError string       `json:"snapshots_error,omitempty"`
	Check          *CheckReport `json:"check,omitempty"`
}

// PassReport lists what one supervision pass did (`vmctl daemon` logs it,
// `gc -o json` prints it inside GCReport).
type PassReport struct {
	Collected   []string `json:"collected,omitempty"`    // ownerless creating records deleted
	Busy        []string `json:"busy,omitempty"`         // creating records with a live owner
	Converged   []string `json:"converged,omitempty"`    // running records whose VMM died, now stopped
	Adopted     []string `json:"adopted,omitempty"`      // stopped records whose VMM is alive (a start died before its commit), now running
	RolledVMs   []string `json:"rolled_vms,omitempty"`   // VM tombstones completed
	RolledSnaps []string `json:"rolled_snaps,omitempty"` // snapshot tombstones completed
	DeadSaves   []string `json:"dead_saves,omitempty"`   // daemon: pending snapshots and staging dirs of dead saves removed
	NetFinished []string `json:"net_finished,omitempty"` // daemon: running VMs whose interrupted NIC change it completed
	Errors      []string `json:"errors,omitempty"`
}

// GCReport is the output of `vmctl gc -o json`: what gc removed.
type GCReport struct {
	PassReport
	Pending  []string `json:"pending,omitempty"` // stale pending snapshots removed
	Staging  []string `json:"staging,omitempty"` // staging dirs of dead builds removed
	Orphans  []string `json:"orphans,omitempty"` // unreferenced VM dirs (and their VMMs) removed
	TempFile []string `json:"temp_files,omitempty"`
	Cgroups  []string `json:"cgroups,omitempty"` // empty per-VM cgroups of unreferenced ids removed
	// Restores: spent restore copies (a clone's memory and state) of VMs
	// committed past creating, which a power cut brought back after the
	// clone's non-durable removal
	Restores []string `json:"restores,omitempty"`
}

// Exact strings embedders match on (docs/architecture.md §4.5). Defined once
// here.
const (
	MsgVMNameExists      = `vm name %q already exists (id: %s)`
	MsgSnapNameExists    = `snapshot name %q already exists (held by %s)`
	MsgSnapNameInUse     = `snapshot name %q already in use by %s`
	MsgSnapInUse         = `snapshot %s is in use by an active clone/restore/export`
	MsgVMPaused          = `vm is paused (snapshot or hibernate in flight); retry after it completes`
	MsgVMNotRunningState = `vm %s is %s: vm not running`
	MsgVMNotRunningPid   = `vm %s pid %d not cloud-hypervisor: vm not running`
	MsgVMNotFound        = `vm not found`
	MsgSnapshotNotFound  = `snapshot not found`
	// MsgEjectPending is the message of a NIC change that asked the guest
	// to eject a device which has not acked within the budget; it starts
	// with EjectPending, which the agent matches to retry the verb.
	MsgEjectPending = EjectPending + `: the guest has not released %s (still in the VMM's device tree after %v); re-run vm net to wait again`
	EjectPending    = `eject pending`
)
