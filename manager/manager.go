package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
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

// Verbs an embedder runs besides the catalogue's (issue 33: the bundled
// agent drives its manager only through Command). They are no rows of the
// catalogue's verb list; the capability table carries the optional ones as
// features of the same name (FeatureNIC, FeatureGuestExec, FeatureInspect,
// FeatureExport, FeatureImport, FeatureEvents), and an adapter without one
// returns ErrNotSupported.
const (
	VerbInspect      Verb = "inspect"         // one VM by Call.VM (id or name), as JSON (Embedder.ParseVM)
	VerbList         Verb = "list"            // every VM, as JSON (Embedder.ParseVMs)
	VerbSnapshotList Verb = "snapshot-list"   // every snapshot, as JSON (Embedder.ParseSnapshots)
	VerbNIC          Verb = "nic-change"      // set Call.VM's NIC count to *Call.NICs
	VerbExec         Verb = "guest-exec"      // run Call.Argv in Call.VM's guest
	VerbExport       Verb = "snapshot-export" // export Call.Snapshot into the file Call.File
	VerbImport       Verb = "snapshot-import" // import the file Call.File as snapshot Call.Name
	VerbEvents       Verb = "events"          // the event stream, polling every Call.Interval
)

// Call is one invocation of a verb. VM and Snapshot name existing objects
// (by name or id); Name is the name of the object the verb creates.
type Call struct {
	Verb     Verb
	VM       string
	Snapshot string
	Name     string
	// NICs is the NIC count of VerbNIC, and of a VerbClone that sets one
	// (nil: the manager's default; the catalogue's clone sets none).
	NICs *int
	// Argv is the guest command of VerbExec.
	Argv []string
	// File is the archive of VerbExport and VerbImport.
	File string
	// Interval is VerbEvents' poll interval, as the embedder writes it in
	// seconds ("1", "0.5"); the adapter turns it into its manager's form.
	Interval string
}

func (c Call) String() string {
	s := string(c.Verb)
	kvs := [][2]string{{"vm", c.VM}, {"snapshot", c.Snapshot}, {"name", c.Name}, {"file", c.File}, {"interval", c.Interval}}
	if c.NICs != nil {
		kvs = append(kvs, [2]string{"nics", strconv.Itoa(*c.NICs)})
	}
	if len(c.Argv) > 0 {
		kvs = append(kvs, [2]string{"argv", strings.Join(c.Argv, " ")})
	}
	for _, kv := range kvs {
		if kv[1] != "" {
			s += " " + kv[0] + "=" + kv[1]
		}
	}
	return s
}

// Outcomes of VerbRecoverStale (Embedder.ParseRecoverStale).
const (
	StaleBusy        = "busy"         // the owner is alive: the create is in flight
	StaleNotFound    = "not-found"    // no such record
	StaleNotCreating = "not-creating" // the record left creating
	StaleCollected   = "collected"    // the owner was dead: the record is gone
)

// Embedder is what an embedder (the bundled agent, docs/architecture.md
// §6) needs of an adapter besides Manager: its refusals typed, and the JSON
// of its read verbs decoded. The embedder runs every argv itself, as a
// child it tracks, and hands the stdout to these parsers; it never decodes
// a manager's output on its own.
type Embedder interface {
	Manager
	Classifier
	// ParseVM decodes VerbInspect's stdout.
	ParseVM(b []byte) (VM, error)
	// ParseVMs decodes VerbList's stdout.
	ParseVMs(b []byte) ([]VM, error)
	// ParseSnapshots decodes VerbSnapshotList's stdout.
	ParseSnapshots(b []byte) ([]Snapshot, error)
	// ParseRecoverStale decodes VerbRecoverStale's stdout into a Stale*
	// outcome.
	ParseRecoverStale(b []byte) (string, error)
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
	// OneFS: lay the store out on as few filesystems as the manager's own
	// default does (cocoon: the run dir inside the root, as
	// /var/lib/cocoon/run is in /var/lib/cocoon), so that a power cut's
	// lazy mount of the root does not split what the manager expects on
	// one filesystem (a hard link from a snapshot into a VM's run dir).
	OneFS bool
	// NetPool is the CIDR the guests' addresses come from when a verb
	// gives a VM a NIC (GuestNet adapters; the case's own loopback /24):
	// "" for the manager's default.
	NetPool string
}

// GuestNet is an adapter whose create and clone give a VM a NIC
// (Call.NICs) that the harness reaches the guest's SSH on, at the address
// the list verb records (VM.Address): from its own network namespace, or
// through the adapter's GuestDialer. The manager-verb workload cases (the
// guest writer through a save, the clone judged as the save's consistent
// cut) are generated only for one. GuestNet reports whether this host lets
// it (cocoon: the CNI plugins and root); an adapter whose answer can be no
// says why in GuestNetReason (GuestNetOf).
type GuestNet interface {
	GuestNet() bool
}

// GuestDialer is a GuestNet adapter whose guests answer only inside
// namespaces of its own (cocoon: each VM's netns): the harness dials their
// SSH through it.
type GuestDialer interface {
	DialGuest(ctx context.Context, network, addr string) (net.Conn, error)
}

// GuestNetOf says whether m gives a guest a NIC the harness reaches on
// this host, and why not: the adapter's own reason (a missing package,
// root), or that it is no GuestNet at all.
func GuestNetOf(m Manager) (bool, string) {
	g, ok := m.(GuestNet)
	if !ok {
		return false, "the " + m.Name() + " adapter gives no VM a NIC the harness reaches"
	}
	if g.GuestNet() {
		return true, ""
	}
	if r, ok := m.(interface{ GuestNetReason() string }); ok && r.GuestNetReason() != "" {
		return false, r.GuestNetReason()
	}
	return false, "the " + m.Name() + " adapter gives no VM a NIC the harness reaches on this host"
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

// Features a manager may have besides the catalogue's verbs (issue 32 item 4,
// issue 33 item 2). Each is one row of a Capabilities table.
const (
	// FeatureVerbJSON: the lifecycle verbs (create, clone, restore) print
	// their result as JSON on request (`-o json`).
	FeatureVerbJSON = "verb-json"
	// FeatureListJSON: the VM and snapshot lists print JSON (the Observer
	// needs it: without it no invariant can be read).
	FeatureListJSON = "list-json"
	// FeatureEvents: the event stream (`vm status --event --format json`).
	FeatureEvents = "events"
	// FeatureCNIDirs: per-run CNI config and plugin dirs, so a case can
	// give its VMs real networking in a netns it creates.
	FeatureCNIDirs = "cni-dirs"
	// FeatureNIC: change a VM's NICs (drop or add one before a hibernate).
	FeatureNIC = "nic-change"
	// FeatureGuestExec: run a command in the guest through the manager.
	FeatureGuestExec = "guest-exec"
	// FeatureCheck: the manager's own consistency check (Observer.Check).
	FeatureCheck = "check"
	// FeatureInspect: one VM by id or name as JSON (VerbInspect).
	FeatureInspect = string(VerbInspect)
	// FeatureExport, FeatureImport: a snapshot to and from a portable
	// archive file (VerbExport, VerbImport: the agent's registry push and
	// pull).
	FeatureExport = string(VerbExport)
	FeatureImport = string(VerbImport)
)

// CapabilityNames is every row of a capability table, in its order: the
// verbs of the catalogue, then the features. Every adapter reports each one,
// present or missing, so tables of two managers line up.
var CapabilityNames = append(verbNames(), FeatureVerbJSON, FeatureListJSON, FeatureEvents, FeatureCNIDirs,
	FeatureNIC, FeatureGuestExec, FeatureCheck, FeatureInspect, FeatureExport, FeatureImport)

// verbs are the catalogue's verbs, the first rows of every table.
var verbs = []Verb{VerbCreate, VerbClone, VerbSnapshotSave, VerbSnapshotRm, VerbRestore, VerbStart, VerbStop, VerbRm,
	VerbGC, VerbRecoverStale}

func verbNames() []string {
	out := make([]string, len(verbs))
	for i, v := range verbs {
		out[i] = string(v)
	}
	return out
}

// Capability is one verb or feature as the adapter found it in the binary in
// front of it.
type Capability struct {
	Name    string `json:"name"` // a Verb or a Feature*
	Present bool   `json:"present"`
	// How is the manager's own form of it when present, e.g.
	// "vm run -o json", or "vm run (no -o: result read from vm list)".
	How string `json:"how,omitempty"`
	// Reason says exactly why it is missing, naming where the adapter
	// looked: "vm net: not in `cocoon vm --help`".
	Reason string `json:"reason,omitempty"`
}

// Capabilities is what one manager binary has: the table a run records in
// results.json and the catalogue generates its cases from.
type Capabilities struct {
	Manager string       `json:"manager"`
	Bin     string       `json:"bin,omitempty"`
	Version string       `json:"version"` // the binary's own version string ("" when it has none)
	Items   []Capability `json:"capabilities"`
}

// NotSupportedPrefix starts the results.json reason of a case that was not
// generated because the manager lacks what it needs; it is never a pass.
const NotSupportedPrefix = "not supported by this manager: "

// Get returns the row name.
func (c Capabilities) Get(name string) (Capability, bool) {
	for _, it := range c.Items {
		if it.Name == name {
			return it, true
		}
	}
	return Capability{}, false
}

// Supports says whether the manager has every one of names; when not, the
// reason starts with NotSupportedPrefix and names each missing one. A name
// the table lacks counts as missing: an unknown is never a yes.
func (c Capabilities) Supports(names ...string) (bool, string) {
	var why []string
	for _, n := range names {
		it, ok := c.Get(n)
		switch {
		case !ok:
			why = append(why, n+": not reported by the "+c.Manager+" adapter")
		case !it.Present:
			why = append(why, it.Reason)
		}
	}
	if len(why) == 0 {
		return true, ""
	}
	return false, NotSupportedPrefix + strings.Join(why, "; ")
}

// Missing lists the rows that are not present.
func (c Capabilities) Missing() []Capability {
	var out []Capability
	for _, it := range c.Items {
		if !it.Present {
			out = append(out, it)
		}
	}
	return out
}

// CapabilityReporter is an adapter that reports what its binary has. An
// adapter that probes its binary (cocoon: its --help pages) implements it;
// a failure to probe one row is that row's Reason, never the whole call's
// error, so one verb's absence never hides the others.
type CapabilityReporter interface {
	Capabilities(ctx context.Context) (Capabilities, error)
}

// CapabilitiesOf is m's capability table: its own report when it is a
// CapabilityReporter, else one derived from Command (a verb is present when
// Command gives an argv) with every feature missing for want of a report.
// Case generation calls it once per run and asks Supports for each case.
func CapabilitiesOf(ctx context.Context, m Manager) (Capabilities, error) {
	if r, ok := m.(CapabilityReporter); ok {
		c, err := r.Capabilities(ctx)
		if err != nil {
			return Capabilities{}, fmt.Errorf("%s capabilities: %w", m.Name(), err)
		}
		return c, nil
	}
	c := Capabilities{Manager: m.Name()}
	for i, n := range CapabilityNames {
		it := Capability{Name: n}
		if i >= len(verbs) {
			it.Reason = n + ": the " + m.Name() + " adapter reports no features (not a CapabilityReporter)"
		} else if argv, err := m.Command(Call{Verb: Verb(n), VM: "VM", Snapshot: "SNAP", Name: "NAME"}); err == nil {
			it.Present, it.How = true, strings.Join(argv, " ")
		} else {
			it.Reason = n + ": " + err.Error()
		}
		c.Items = append(c.Items, it)
	}
	return c, nil
}

// DecodeJSON decodes a verb's stdout into out, with the output in the error.
func DecodeJSON(b []byte, out any, what string) error {
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s: decode: %w (%.200q)", what, err, b)
	}
	return nil
}
