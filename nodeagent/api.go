package nodeagent

import "github.com/vmchaos/vmchaos/nodeagent/api"

// The HTTP API's shapes are the agent's wire contract, defined in
// nodeagent/api so that clients never import the agent. The names below keep
// the package's own code reading as before.

// Lifecycle values of Status.Lifecycle.
const (
	LifecycleCreating    = api.LifecycleCreating
	LifecycleReady       = api.LifecycleReady
	LifecycleHibernating = api.LifecycleHibernating
	LifecycleHibernated  = api.LifecycleHibernated
	LifecycleDeleting    = api.LifecycleDeleting
	LifecycleFailed      = api.LifecycleFailed
)

// PostClone values of Status.PostClone.
const (
	PostCloneRunning = api.PostCloneRunning
	PostCloneDone    = api.PostCloneDone
	PostCloneFailed  = api.PostCloneFailed
)

// Bodies of the HTTP API (see nodeagent/api for each).
type (
	Intent   = api.Intent
	Status   = api.Status
	VMView   = api.VMView
	APIError = api.APIError
)
