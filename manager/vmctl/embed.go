package vmctl

import (
	"fmt"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/vmctl/api"
)

// The embedder's parsers (manager.Embedder): the bundled agent runs vmctl's
// read verbs as its own children and hands their stdout here.

// ParseVM decodes `vm inspect -o json`. The address is the first NIC's, as
// the agent always recorded it (api.VM.GuestAddress).
func (a *Adapter) ParseVM(b []byte) (manager.VM, error) {
	var w api.VM
	if err := manager.DecodeJSON(b, &w, "vmctl vm inspect"); err != nil {
		return manager.VM{}, err
	}
	return embedVM(w), nil
}

// ParseVMs decodes `vm list -o json`.
func (a *Adapter) ParseVMs(b []byte) ([]manager.VM, error) {
	var ws []api.VM
	if err := manager.DecodeJSON(b, &ws, "vmctl vm list"); err != nil {
		return nil, err
	}
	out := make([]manager.VM, 0, len(ws))
	for _, w := range ws {
		out = append(out, embedVM(w))
	}
	return out, nil
}

func embedVM(w api.VM) manager.VM {
	return manager.VM{ID: w.ID, Name: w.Name, State: w.State, PID: w.Pid, Reason: w.Reason, Address: w.GuestAddress()}
}

// ParseSnapshots decodes `snapshot list -o json`.
func (a *Adapter) ParseSnapshots(b []byte) ([]manager.Snapshot, error) {
	var ws []api.Snapshot
	if err := manager.DecodeJSON(b, &ws, "vmctl snapshot list"); err != nil {
		return nil, err
	}
	out := make([]manager.Snapshot, 0, len(ws))
	for _, w := range ws {
		out = append(out, manager.Snapshot{ID: w.ID, Name: w.Name, State: w.State, VMID: w.VMID})
	}
	return out, nil
}

// ParseRecoverStale decodes `vm reconcile-stale-create -o json`; an outcome
// vmctl does not document is an error, never a guess.
func (a *Adapter) ParseRecoverStale(b []byte) (string, error) {
	var r api.StaleCreateResult
	if err := manager.DecodeJSON(b, &r, "vmctl vm reconcile-stale-create"); err != nil {
		return "", err
	}
	switch r.Outcome {
	case api.OutcomeBusy:
		return manager.StaleBusy, nil
	case api.OutcomeCollected:
		return manager.StaleCollected, nil
	case api.OutcomeNotCreating:
		return manager.StaleNotCreating, nil
	case api.OutcomeNotFound:
		return manager.StaleNotFound, nil
	}
	return "", fmt.Errorf("vmctl vm reconcile-stale-create %s: unknown outcome %q", r.ID, r.Outcome)
}
