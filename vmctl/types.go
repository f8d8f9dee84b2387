package vmctl

import (
	"fmt"

	"github.com/vmchaos/vmchaos/vmctl/api"
)

// The records vmctl stores and prints are its wire contract, defined in
// vmctl/api so that readers of vmctl's output never import vmctl. The names
// below keep the package's own code reading as before.

// VM states stored in the index (api.StateStale is display-only).
const (
	StateCreating = api.StateCreating
	StateCreated  = api.StateCreated
	StateRunning  = api.StateRunning
	StateStopped  = api.StateStopped
	StateError    = api.StateError
	StateStale    = api.StateStale
)

// Snapshot record states.
const (
	SnapPending = api.SnapPending
	SnapReady   = api.SnapReady
)

// Outcomes of reconcile-stale-create.
const (
	OutcomeBusy        = api.OutcomeBusy
	OutcomeNotFound    = api.OutcomeNotFound
	OutcomeNotCreating = api.OutcomeNotCreating
	OutcomeCollected   = api.OutcomeCollected
)

// Event kinds of `vm status --event`.
const (
	EventAdded    = api.EventAdded
	EventModified = api.EventModified
	EventDeleted  = api.EventDeleted
)

// Records and verb outputs (see vmctl/api for each).
type (
	VMConfig          = api.VMConfig
	NIC               = api.NIC
	VM                = api.VM
	Snapshot          = api.Snapshot
	Tombstone         = api.Tombstone
	StaleCreateResult = api.StaleCreateResult
	StatusEvent       = api.StatusEvent
	Violation         = api.Violation
	CheckReport       = api.CheckReport
	PassReport        = api.PassReport
	GCReport          = api.GCReport
)

// Exact strings embedders match on (docs/architecture.md §4.5).
const (
	MsgVMNameExists      = api.MsgVMNameExists
	MsgSnapNameExists    = api.MsgSnapNameExists
	MsgSnapNameInUse     = api.MsgSnapNameInUse
	MsgSnapInUse         = api.MsgSnapInUse
	MsgVMPaused          = api.MsgVMPaused
	MsgVMNotRunningState = api.MsgVMNotRunningState
	MsgVMNotRunningPid   = api.MsgVMNotRunningPid
	MsgVMNotFound        = api.MsgVMNotFound
	MsgSnapshotNotFound  = api.MsgSnapshotNotFound
	MsgEjectPending      = api.MsgEjectPending
)

// Errorf formats one of the Msg constants.
func Errorf(format string, a ...any) error { return fmt.Errorf(format, a...) }
