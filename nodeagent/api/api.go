// Package api holds the shapes of the node agent's HTTP API (PUT/GET/DELETE
// /v1/vms/{name}, GET /v1/vms over <state-dir>/agent.sock) and the files it
// publishes in its state dir (docs/architecture.md §6): the contract between
// the agent and its clients. It imports only the standard library, so a
// client (the scenario stack, the checker) never links the agent itself.
package api

import "time"

// Files the agent publishes inside its state dir.
const (
	// SocketName is the unix socket the HTTP API listens on.
	SocketName = "agent.sock"
	// MetricsAddrName holds the bound address of /metrics ("host:port\n").
	MetricsAddrName = "metrics.addr"
)

// Intent is the body of PUT /v1/vms/{name}: what the caller wants for a VM.
type Intent struct {
	Snapshot  string `json:"snapshot"`  // source snapshot for create (id or name)
	Hibernate bool   `json:"hibernate"` // true: hibernated; false: ready
}

// Lifecycle values of Status.Lifecycle.
const (
	LifecycleCreating    = "creating"
	LifecycleReady       = "ready"
	LifecycleHibernating = "hibernating"
	LifecycleHibernated  = "hibernated"
	LifecycleDeleting    = "deleting"
	LifecycleFailed      = "failed"
)

// PostClone values of Status.PostClone.
const (
	PostCloneRunning = "running"
	PostCloneDone    = "done"
	PostCloneFailed  = "failed"
)

// Status is the durable status markers of one VM.
type Status struct {
	Lifecycle          string    `json:"lifecycle"`
	ObservedGeneration int64     `json:"observed_generation"`
	Message            string    `json:"message,omitempty"`
	PostClone          string    `json:"post_clone,omitempty"`
	VMID               string    `json:"vm_id,omitempty"`
	Address            string    `json:"address,omitempty"` // guest SSH address ip:port
	FailedReason       string    `json:"failed_reason,omitempty"`
	FailedAttempts     int       `json:"failed_attempts,omitempty"`
	UpdatedAt          time.Time `json:"updated_at"`
}

// VMView is the body of GET /v1/vms/{name} and one element of GET /v1/vms
// (a JSON array).
type VMView struct {
	Name       string `json:"name"`
	Intent     Intent `json:"intent"`
	Generation int64  `json:"generation"`
	Deleted    bool   `json:"deleted,omitempty"` // a DELETE was accepted and is in progress
	Status     Status `json:"status"`
	Op         string `json:"op,omitempty"`   // operation owed or in flight (create|wake|hibernate|delete)
	Step       string `json:"step,omitempty"` // last durable step of Op
}

// APIError is the JSON body of every 4xx/5xx answer.
type APIError struct {
	Error string `json:"error"`
}
