package nodeagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/vmchaos/vmchaos/nodeagent/api"
)

// maxBody bounds an intent body; real ones are tiny.
const maxBody = 64 << 10

// MsgResumeInFlight is the 409 a change gets while a resumed operation on the
// same VM is in flight (seed 001, "resume claim mutual exclusion").
const MsgResumeInFlight = "resumed operation still in flight for %s"

func (a *Agent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/vms", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			methodNotAllowed(w, "GET")
			return
		}
		a.handleList(w, r)
	})
	mux.HandleFunc("/v1/vms/{name}", func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			a.handleGet(w, r)
		case http.MethodPut:
			a.handlePut(w, r)
		case http.MethodDelete:
			a.handleDelete(w, r)
		default:
			methodNotAllowed(w, "GET, PUT, DELETE")
		}
	})
	mux.HandleFunc(api.EventsPath, a.handleEvents)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	return mux
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeErr(w, http.StatusMethodNotAllowed, "method not allowed (allowed: "+allow+")")
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, APIError{Error: msg})
}

func (a *Agent) handleList(w http.ResponseWriter, r *http.Request) {
	out := []VMView{}
	for _, n := range a.store.names() {
		if rec := a.store.get(n); rec != nil {
			out = append(out, rec.view())
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *Agent) handleGet(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := ValidName(name); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	rec := a.store.get(name)
	if rec == nil {
		writeErr(w, http.StatusNotFound, fmt.Sprintf("unknown vm %q", name))
		return
	}
	writeJSON(w, http.StatusOK, rec.view())
}

// DecodeIntent parses and validates a PUT body.
func DecodeIntent(body []byte) (Intent, error) {
	var in Intent
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return in, fmt.Errorf("bad JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return in, errors.New("bad JSON: trailing data after the intent object")
	}
	if in.Snapshot == "" {
		return in, errors.New(`bad intent: "snapshot" (the source snapshot id or name) is required`)
	}
	return in, nil
}

// Conflicts of a PUT with the current record (documented in docs/nodeagent.md).
func conflict(name string, cur *record, in Intent) string {
	if cur == nil {
		if in.Hibernate {
			return fmt.Sprintf("vm %s does not exist: create it with hibernate=false first, then hibernate it once it is ready", name)
		}
		return ""
	}
	if cur.Deleted {
		return fmt.Sprintf("vm %s is being deleted; PUT it again after the delete finished", name)
	}
	// The image guard's refusal (snapshot.go imageGuard) is left by putting
	// the intent back on the image the snapshot was taken from: no VM was
	// created from the refused image.
	imageRefused := cur.Status.FailedReason == reasonImageChanged && cur.Status.VMID == ""
	if in.Snapshot != cur.Intent.Snapshot && !imageRefused {
		return fmt.Sprintf("vm %s was created from snapshot %q; the source cannot change (delete and recreate it)", name, cur.Intent.Snapshot)
	}
	if in.Hibernate && !cur.Intent.Hibernate {
		creating := cur.Op == opCreate || cur.Op == opWake || cur.Status.Lifecycle == "" || cur.Status.Lifecycle == LifecycleCreating
		if creating {
			return fmt.Sprintf("vm %s is not ready yet (lifecycle %q, op %q): hibernate it once it is ready", name, cur.Status.Lifecycle, cur.Op)
		}
	}
	return ""
}

func (a *Agent) handlePut(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := ValidName(name); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		writeErr(w, http.StatusBadRequest, "reading body: "+err.Error())
		return
	}
	if len(body) > maxBody {
		writeErr(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("intent body larger than %d bytes", maxBody))
		return
	}
	in, err := DecodeIntent(body)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	if in.Snapshot == name {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("bad intent: source snapshot %q has the VM's own name, which is reserved for its hibernate snapshot", name))
		return
	}
	code, view, msg := a.putIntent(a.baseCtx(r), name, in)
	if msg != "" {
		writeErr(w, code, msg)
		return
	}
	writeJSON(w, code, view)
}

// putIntent applies a PUT of in to name from the API and kicks the VM's
// worker when the record changed. It answers the HTTP code and either the
// VM's view or an error message.
func (a *Agent) putIntent(ctx context.Context, name string, in Intent) (int, VMView, string) {
	code, view, msg, owed := a.storeIntent(name, in, 0)
	if owed {
		a.kick(ctx, name, false, nil)
	}
	return code, view, msg
}

// storeIntent records in for name: the API's and the control plane
// sync's one way in (cpsync.go; cpGen is the control plane's generation it
// applies, 0 from the API). owed: the record changed and its worker must
// be kicked; the caller kicks, so the sync can mark "applied, not yet
// acted on" (agent.migrate.applied) before the worker sees it.
func (a *Agent) storeIntent(name string, in Intent, cpGen int64) (code int, view VMView, msg string, owed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.store.get(name)
	if msg := conflict(name, cur, in); msg != "" {
		return http.StatusConflict, VMView{}, msg, false
	}
	if cur != nil && cur.Intent == in && cur.Status.Lifecycle != LifecycleFailed {
		if cpGen > cur.CPGeneration {
			// applied: nothing else to do for it
			rec, err := a.store.update(name, func(r *record) error { r.CPGeneration = cpGen; return nil })
			if err != nil {
				return http.StatusInternalServerError, VMView{}, err.Error(), false
			}
			return http.StatusOK, rec.view(), "", false
		}
		return http.StatusOK, cur.view(), "", false // no change, no new generation
	}
	if cur != nil && a.claims[name] {
		return http.StatusConflict, VMView{}, fmt.Sprintf(MsgResumeInFlight, name), false
	}
	code = http.StatusOK
	var rec *record
	var err error
	if cur == nil {
		rec = &record{Name: name, Intent: in, Generation: 1, CPGeneration: cpGen, Status: Status{UpdatedAt: time.Now().UTC()}}
		err = a.store.put(rec)
		code = http.StatusCreated
	} else {
		// A new generation always resets the automatic-retry count: this
		// is the operator's way out of a parked failed (seed 001 #5).
		rec, err = a.store.update(name, func(r *record) error {
			r.Intent = in
			r.Generation++
			r.CPGeneration = max(r.CPGeneration, cpGen)
			r.Status.FailedAttempts = 0
			if r.Status.Lifecycle == LifecycleFailed {
				r.Status.Message = "retrying on a new intent generation"
			}
			return nil
		})
	}
	if err != nil {
		return http.StatusInternalServerError, VMView{}, err.Error(), false
	}
	return code, rec.view(), "", true
}

func (a *Agent) handleDelete(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := ValidName(name); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	code, view, msg := a.deleteIntent(a.baseCtx(r), name, false)
	if msg != "" {
		writeErr(w, code, msg)
		return
	}
	writeJSON(w, code, view)
}

// deleteIntent applies a DELETE to name; keepRegistry (a release to
// another node, cpsync.go) keeps its :hibernate artifact in the registry.
func (a *Agent) deleteIntent(ctx context.Context, name string, keepRegistry bool) (int, VMView, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.store.get(name)
	if cur == nil {
		return http.StatusNotFound, VMView{}, fmt.Sprintf("unknown vm %q", name)
	}
	if cur.Deleted {
		return http.StatusAccepted, cur.view(), ""
	}
	if a.claims[name] {
		return http.StatusConflict, VMView{}, fmt.Sprintf(MsgResumeInFlight, name)
	}
	rec, err := a.store.update(name, func(r *record) error {
		r.Deleted = true
		r.KeepRegistry = keepRegistry
		r.Generation++
		r.Status.FailedAttempts = 0
		return nil
	})
	if err != nil {
		return http.StatusInternalServerError, VMView{}, err.Error()
	}
	a.kickLocked(ctx, name, false, nil)
	return http.StatusAccepted, rec.view(), ""
}

// baseCtx is the lifecycle context workers run on (not the request's).
func (a *Agent) baseCtx(*http.Request) context.Context { return a.ctx }
