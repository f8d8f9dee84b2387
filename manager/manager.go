package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Verb is one manager operation the manager-level catalogue drives.
type Verb string

// The verbs of the manager-level catalogue (docs/architecture.md §14). An adapter
// maps each to its manager's own command line; a verb the manager does not
// have makes Command return ErrNotSupported, and the catalogue does not
// generate cases for it.
const (
	VerbCreate       Verb = "create"        // create and start a VM from the case image (`vm run`)
	VerbClone        Verb = "clone"         // clone a new VM from a snapshot
	VerbSnapshotSave Verb = "snapshot-save" // save a running VM into a named snapshot
	VerbSnapshotRm   Verb = "snapshot-rm"   // delete a snapshot
	VerbRestore      Verb = "restore"       // restore a running VM to a snapshot in place
	VerbStart        Verb = "start"
	VerbStop         Verb = "stop"
	VerbRm           Verb = "rm" // delete a VM, stopping it first (--force)
	VerbGC           Verb = "gc"
	// VerbRecoverStale is the manager's own verb for a `creating` record
	// whose owner died (vmctl: reconcile-stale-create); managers without
	// one return ErrNotSupported.
	VerbRecoverStale Verb = "recover-stale"
)

// Call is one invocation of a verb. VM and Snapshot name existing objects
// (by name or id); Name is the name of the object the verb creates.
type Call struct {
	Verb     Verb
	VM       string
	Snapshot string
	Name     string
}

func (c Call) String() string {
	s := string(c.Verb)
	for _, kv := range [][2]string{{"vm", c.VM}, {"snapshot", c.Snapshot}, {"name", c.Name}} {
		if kv[1] != "" {
			s += " " + kv[0] + "=" + kv[1]
		}
	}
	return s
}

// Event is one line of the manager's event stream, reduced to what the
// checker reads: which VM changed and the state the stream reported.
type Event struct {
	Type  string `json:"type"` // ADDED | MODIFIED | DELETED
	ID    string `json:"id"`
	Name  string `json:"name"`
	State string `json:"state"`
}

// Options configure one case's manager store.
type Options struct {
	Bin    string // the manager binary (--manager-bin)
	Config string // the manager's own config file (--manager-config), "" for none
	// Dir is the case's store: the adapter keeps its root, run and log
	// dirs under it (short: VMM sockets live there).
	Dir string
	// VMMDir holds the VMM binary installed as `cloud-hypervisor` (fakech),
	// first on the manager's PATH.
	VMMDir string
	// Image is the fake guest disk (raw); the adapter imports it in the
	// format its manager takes.
	Image string
	// Env is appended to every verb's environment (time scale, trace
	// socket, failpoints of the VMM).
	Env []string
}

// Manager is what the manager-level catalogue needs from one manager: the
// observations of Observer, plus the verbs as processes the runner starts
// and kills, the event stream, and the store's temporary dirs.
type Manager interface {
	Observer
	// Setup makes the case's store ready: dirs, the firmware fixture, the
	// imported guest image. ImageRef is valid after it.
	Setup(ctx context.Context) error
	// ImageRef is what VerbCreate creates from.
	ImageRef() string
	// Command is the argv of call (argv[0] is the manager binary), or
	// ErrNotSupported.
	Command(call Call) ([]string, error)
	// Env is the environment of every verb (with Options.Env at its end).
	Env() []string
	// EventCommand is the argv of the manager's event stream.
	EventCommand() []string
	// ParseEvent decodes one line of the event stream.
	ParseEvent(line []byte) (Event, error)
	// TempDirs lists temporary dirs an operation left in the store (a
	// staging or snapshot temp dir no record owns).
	TempDirs(ctx context.Context) ([]string, error)
}

// Supported reports whether m has a command for verb.
func Supported(m Manager, verb Verb) bool {
	_, err := m.Command(Call{Verb: verb, VM: "x", Snapshot: "x", Name: "x"})
	return !errors.Is(err, ErrNotSupported)
}

// DecodeJSON decodes a verb's stdout into out, with the output in the error.
func DecodeJSON(b []byte, out any, what string) error {
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s: decode: %w (%.200q)", what, err, b)
	}
	return nil
}
