package nodeagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/vmchaos/vmchaos/durable"
)

// Operations a record can owe. The durable Op/Step pair is the only source of
// owed work after a restart: nothing is derived from process memory.
const (
	opCreate    = "create"
	opWake      = "wake"
	opHibernate = "hibernate"
	opDelete    = "delete"
)

// Steps, in execution order per operation. A step is written durably after it
// completed, so a resumed operation redoes at most the step it was killed in.
const (
	stepNone         = ""
	stepPulled       = "pulled"        // wake: verified snapshot available locally
	stepCloned       = "cloned"        // create/wake: VM id bound
	stepDHCPReleased = "dhcp-released" // hibernate: guest dhclient -r done
	stepNICDropped   = "nic-dropped"   // hibernate: vm net --nics 0 done
	stepSaved        = "saved"         // hibernate: snapshot saved
	stepPushed       = "pushed"        // hibernate: snapshot in the registry
	stepRemoved      = "removed"       // hibernate/delete: VM removed
)

var hibernateOrder = map[string]int{stepNone: 0, stepDHCPReleased: 1, stepNICDropped: 2, stepSaved: 3, stepPushed: 4, stepRemoved: 5}

// record is one VM's durable document: the intent, its generation, the status
// markers and the operation in flight.
type record struct {
	Name       string `json:"name"`
	Intent     Intent `json:"intent"`
	Generation int64  `json:"generation"`
	Deleted    bool   `json:"deleted,omitempty"`
	Status     Status `json:"status"`

	Op         string `json:"op,omitempty"`
	Step       string `json:"step,omitempty"`
	SnapshotID string `json:"snapshot_id,omitempty"`  // local hibernate snapshot
	RemoveVMID string `json:"remove_vm_id,omitempty"` // VM being removed after its id was cleared
	NICDropped bool   `json:"nic_dropped,omitempty"`
	FailedGen  int64  `json:"failed_generation,omitempty"` // generation of the last failed write
	// EvidenceChecked: this create already looked for a hibernate snapshot
	// (and counted the lookup); a resumed create does not look twice.
	EvidenceChecked bool `json:"evidence_checked,omitempty"`
	// KeepRegistry: a delete that releases the VM to another node (a
	// migration's source, cpsync.go) keeps its :hibernate artifact in the
	// registry, which the target wakes from.
	KeepRegistry bool `json:"keep_registry,omitempty"`
	// CPGeneration is the control plane generation of the VM this record
	// last applied (cpsync.go; 0: never synced): each newer one is applied
	// once, as a new generation here when it asks for something else or
	// the record is failed.
	CPGeneration int64 `json:"cp_generation,omitempty"`
}

func (r *record) view() VMView {
	return VMView{Name: r.Name, Intent: r.Intent, Generation: r.Generation, Deleted: r.Deleted, Status: r.Status, Op: r.Op, Step: r.Step}
}

// goal is the lifecycle the intent asks for ("" for deleted).
func (r *record) goal() string {
	switch {
	case r.Deleted:
		return ""
	case r.Intent.Hibernate:
		return LifecycleHibernated
	default:
		return LifecycleReady
	}
}

// nameRE keeps names safe as file names and as vmctl names.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidName reports whether name may be used as a VM name.
func ValidName(name string) error {
	if !nameRE.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("invalid vm name %q: want 1-63 characters [A-Za-z0-9._-], starting with a letter or digit", name)
	}
	return nil
}

// store keeps one file per VM under <state>/vms. Every change is written with
// durable.WriteFile before the caller proceeds, so the API answers only after
// the intent survives a power cut.
type store struct {
	dir string
	mu  sync.Mutex
	m   map[string]*record
}

func openStore(stateDir string) (*store, error) {
	dir := filepath.Join(stateDir, "vms")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("intent store: %w", err)
	}
	s := &store{dir: dir, m: map[string]*record{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("intent store: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		if !strings.HasSuffix(n, ".json") || strings.HasPrefix(n, ".") {
			continue // temp files of an interrupted durable write
		}
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, fmt.Errorf("intent store: %w", err)
		}
		r, err := decodeRecord(b)
		if err != nil {
			// A corrupt record is never silently dropped: an intent that
			// vanished would strand its VM.
			return nil, fmt.Errorf("intent store: %s: %w", n, err)
		}
		if r.Name+".json" != n {
			return nil, fmt.Errorf("intent store: %s holds vm %q", n, r.Name)
		}
		s.m[r.Name] = r
	}
	return s, nil
}

func decodeRecord(b []byte) (*record, error) {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if err := ValidName(r.Name); err != nil {
		return nil, err
	}
	if r.Generation < 1 {
		return nil, errors.New("generation < 1")
	}
	return &r, nil
}

// get returns a copy of the record, or nil.
func (s *store) get(name string) *record {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.m[name]
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

// names returns every name, sorted.
func (s *store) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.m))
	for n := range s.m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// put writes r durably and makes it current.
func (s *store) put(r *record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.putLocked(r)
}

func (s *store) putLocked(r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := durable.WriteFile(filepath.Join(s.dir, r.Name+".json"), b, 0o644); err != nil {
		return fmt.Errorf("intent store: %w", err)
	}
	c := *r
	s.m[r.Name] = &c
	return nil
}

// update applies f to the current record and writes it. f returning an error
// leaves the record untouched (nothing half-written).
func (s *store) update(name string, f func(r *record) error) (*record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.m[name]
	if cur == nil {
		return nil, fmt.Errorf("vm %s: %w", name, errUnknownVM)
	}
	c := *cur
	if err := f(&c); err != nil {
		return nil, err
	}
	if err := s.putLocked(&c); err != nil {
		return nil, err
	}
	out := c
	return &out, nil
}

// forget removes the record durably.
func (s *store) forget(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(filepath.Join(s.dir, name+".json")); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("intent store: forget %s: %w", name, err)
	}
	if err := durable.SyncDir(s.dir); err != nil {
		return err
	}
	delete(s.m, name)
	return nil
}

var errUnknownVM = errors.New("unknown vm")
