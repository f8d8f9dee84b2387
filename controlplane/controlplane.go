// Package controlplane is the cluster's small control plane
// (docs/controlplane.md): it holds, per VM, the intent's source snapshot
// and the placement (the node that owns the VM), and the migration in
// flight (the source node that still has to release the VM). Agents poll
// it and reconcile (nodeagent/cpsync.go), the way vk-cocoon reconciles
// against the API server. It imports only the standard library and
// product leaves (durable, regress, internal/unixhttp): the agent (the
// system under test) links it, and cmd/controlplane serves it as its own
// process, with its state in a file.
package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"sync"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/regress"
)

// VM is one VM's object on the control plane: GET /v1/vms returns a JSON
// array of them.
type VM struct {
	Name     string `json:"name"`
	Snapshot string `json:"snapshot"` // the intent's source snapshot (the image)
	Node     string `json:"node"`     // placement: the node that must run the VM
	// Source is the node the VM is moving away from: set when the
	// placement moves, cleared when that node released the VM (its
	// snapshot durable in the registry, its VM gone). The target never
	// starts the VM while Source is set.
	Source     string `json:"source,omitempty"`
	Generation int64  `json:"generation"`
}

// Placement is the body of PUT /v1/vms/{name}.
type Placement struct {
	Snapshot string `json:"snapshot"`
	Node     string `json:"node"`
}

// Release is the body of POST /v1/vms/{name}/release: node gives the VM
// up (it hibernated it to the registry and holds no VM of the name).
type Release struct {
	Node string `json:"node"`
}

// Event kinds the server reports to its observer.
const (
	EventPlaced   = "placed"   // a new VM placed on Node
	EventMoved    = "moved"    // the placement moved from Source to Node
	EventReleased = "released" // Source released the VM to Node
)

// Event is one state change of the control plane.
type Event struct {
	Kind string
	VM   VM // the object after the change
	From string
}

// ErrNotSource is the answer to a release by a node the VM is not moving
// away from.
var ErrNotSource = errors.New("not the source of a migration in flight")

var validName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)

// Server is the control plane: its objects in memory, an HTTP handler over
// them. Observe, when set, is called (outside the lock) for every change;
// the harness reads the cluster there (scenarios/runner/cluster.go).
type Server struct {
	Observe func(Event)
	mu      sync.Mutex
	vms     map[string]*VM
	// path is the state file (Open; "" for New: memory only). Every
	// change is written there, atomically and durably, before it is
	// answered: a control plane killed at any moment restarts with every
	// answer it gave.
	path string
}

// New returns an empty control plane that keeps its state in memory only
// (the harness's tests).
func New() *Server { return &Server{vms: map[string]*VM{}} }

// ErrNotDurable is a change the control plane could not write to its
// state file: not made, answered 500.
var ErrNotDurable = errors.New("control plane state not durable")

// Open returns the control plane whose state lives in the file at path:
// what it holds is loaded (none yet: empty), and every change is written
// back (durable.WriteFile: temp file, fsync, rename, fsync of the dir)
// before it takes effect.
func Open(path string) (*Server, error) {
	s := &Server{vms: map[string]*VM{}, path: path}
	if regress.On("controlplane-state-in-memory") {
		return s, nil // the planted bug: a restart forgets every VM
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("control plane: read state: %w", err)
	}
	var vms []VM
	if err := json.Unmarshal(b, &vms); err != nil {
		return nil, fmt.Errorf("control plane: state %s: %w", path, err)
	}
	for i := range vms {
		v := vms[i]
		s.vms[v.Name] = &v
	}
	return s, nil
}

// saveLocked writes every VM to the state file (none with New).
func (s *Server) saveLocked() error {
	if s.path == "" {
		return nil
	}
	out := make([]VM, 0, len(s.vms))
	for _, v := range s.vms {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	b, err := json.Marshal(out)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	if err := durable.WriteFile(s.path, b, 0o644); err != nil {
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	return nil
}

// Handler serves the API: GET /v1/vms, GET and PUT /v1/vms/{name},
// POST /v1/vms/{name}/release.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/vms", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, s.List()) })
	mux.HandleFunc("GET /v1/vms/{name}", func(w http.ResponseWriter, r *http.Request) {
		v, ok := s.Get(r.PathValue("name"))
		if !ok {
			writeErr(w, http.StatusNotFound, fmt.Errorf("unknown vm %q", r.PathValue("name")))
			return
		}
		writeJSON(w, http.StatusOK, v)
	})
	mux.HandleFunc("PUT /v1/vms/{name}", func(w http.ResponseWriter, r *http.Request) {
		var p Placement
		if err := decode(r.Body, &p); err != nil {
			writeErr(w, http.StatusBadRequest, err)
			return
		}
		v, err := s.Place(r.PathValue("name"), p)
		if err != nil {
			writeErr(w, errStatus(err, http.StatusBadRequest), err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	})
	mux.HandleFunc("POST /v1/vms/{name}/release", func(w http.ResponseWriter, r *http.Request) {
		var rel Release
		if err := decode(r.Body, &rel); err != nil {
			writeErr(w, http.StatusBadRequest, err)
			return
		}
		v, err := s.Release(r.PathValue("name"), rel.Node)
		if err != nil {
			writeErr(w, errStatus(err, http.StatusConflict), err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	})
	return mux
}

// List returns every VM, by name.
func (s *Server) List() []VM {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]VM, 0, len(s.vms))
	for _, v := range s.vms {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Get returns one VM.
func (s *Server) Get(name string) (VM, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vms[name]
	if !ok {
		return VM{}, false
	}
	return *v, true
}

// Place sets name's intent and placement. Moving the placement of a
// placed VM starts a migration: the old node becomes its Source. A move
// while a migration is in flight keeps the first Source: that node still
// holds the VM until it releases it.
func (s *Server) Place(name string, p Placement) (VM, error) {
	if !validName.MatchString(name) || !validName.MatchString(p.Node) || p.Snapshot == "" {
		return VM{}, fmt.Errorf("place %q on %q: want a vm name, a node name and a snapshot", name, p.Node)
	}
	s.mu.Lock()
	v, ok := s.vms[name]
	var before VM
	if ok {
		before = *v
	}
	ev := Event{Kind: EventPlaced}
	switch {
	case !ok:
		v = &VM{Name: name}
		s.vms[name] = v
	case v.Node != p.Node:
		ev = Event{Kind: EventMoved, From: v.Node}
		if v.Source == "" {
			v.Source = v.Node
		}
		if v.Source == p.Node {
			v.Source = "" // moved back before the source released it: it keeps it
		}
	case v.Snapshot == p.Snapshot:
		out := *v
		s.mu.Unlock()
		return out, nil // no change, no new generation
	}
	v.Snapshot, v.Node = p.Snapshot, p.Node
	v.Generation++
	if err := s.saveLocked(); err != nil {
		if ok {
			*v = before
		} else {
			delete(s.vms, name)
		}
		s.mu.Unlock()
		return VM{}, fmt.Errorf("place %q on %q: %w", name, p.Node, err)
	}
	out := *v
	s.mu.Unlock()
	s.observe(Event{Kind: ev.Kind, VM: out, From: ev.From})
	return out, nil
}

// Release records that node gave name up. A repeated release by the node
// that already released is answered with the object (idempotent: the
// node may have died between its release and its acting on the answer).
// The observer sees the release before it takes effect: no target can
// have acted on it yet.
func (s *Server) Release(name, node string) (VM, error) {
	v, done, err := s.checkRelease(name, node)
	if err != nil || done {
		return v, err
	}
	v.Source = ""
	s.observe(Event{Kind: EventReleased, VM: v, From: node})
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.vms[name]; cur != nil && cur.Source == node {
		cur.Source = ""
		if err := s.saveLocked(); err != nil {
			cur.Source = node
			return VM{}, fmt.Errorf("release %s by %s: %w", name, node, err)
		}
		return *cur, nil
	}
	return s.checkReleaseLocked(name, node)
}

// checkRelease: done when there is nothing to release (already released).
func (s *Server) checkRelease(name, node string) (VM, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vms[name]
	if ok && v.Source == node {
		return *v, false, nil
	}
	out, err := s.checkReleaseLocked(name, node)
	return out, true, err
}

// checkReleaseLocked answers a release that has nothing to do.
func (s *Server) checkReleaseLocked(name, node string) (VM, error) {
	v, ok := s.vms[name]
	switch {
	case !ok:
		return VM{}, fmt.Errorf("release %s by %s: unknown vm", name, node)
	case v.Source == "" && v.Node != node:
		return *v, nil
	case v.Source != node:
		return VM{}, fmt.Errorf("release %s by %s: %w (source %q, node %q)", name, node, ErrNotSource, v.Source, v.Node)
	}
	return *v, nil
}

func (s *Server) observe(e Event) {
	if s.Observe != nil {
		s.Observe(e)
	}
}

func decode(r io.Reader, v any) error {
	b, err := io.ReadAll(io.LimitReader(r, 1<<16))
	if err != nil {
		return fmt.Errorf("reading body: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decoding body: %w", err)
	}
	return nil
}

// errStatus is the answer's status for err: 500 for a change that could not
// be made durable, else def.
func errStatus(err error, def int) int {
	if errors.Is(err, ErrNotDurable) {
		return http.StatusInternalServerError
	}
	return def
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// apiError is the JSON body of every 4xx answer.
type apiError struct {
	Error string `json:"error"`
}

func writeErr(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, apiError{Error: err.Error()})
}
