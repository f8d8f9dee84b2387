package cocoon

import (
	"fmt"

	"github.com/vmchaos/vmchaos/manager"
)

// The embedder's parsers (manager.Embedder): the bundled agent runs cocoon's
// read verbs as its own children and hands their stdout here.

// ParseVM decodes `vm inspect` (types.VM as JSON), with the first NIC's
// guest address and netns as ParseVMs reads them ("" for a VM without NIC).
func (a *Adapter) ParseVM(b []byte) (manager.VM, error) {
	var w vmWire
	if err := manager.DecodeJSON(StripLogLines(b), &w, "cocoon vm inspect"); err != nil {
		return manager.VM{}, err
	}
	if w.ID == "" {
		return manager.VM{}, fmt.Errorf("cocoon vm inspect: a record without an id (%.200q)", b)
	}
	addr, netns := w.guest()
	return manager.VM{ID: w.ID, Name: w.Config.Name, State: w.State, PID: w.PID, Address: addr, Netns: netns}, nil
}

// ParseVMs decodes `vm list --format json` (ParseVMs).
func (a *Adapter) ParseVMs(b []byte) ([]manager.VM, error) { return ParseVMs(b) }

// ParseSnapshots decodes `snapshot list --format json` (ParseSnapshots).
func (a *Adapter) ParseSnapshots(b []byte) ([]manager.Snapshot, error) { return ParseSnapshots(b) }

// ParseRecoverStale: cocoon has no stale-create verb (Command refuses it
// first; this is never reached with an output of cocoon's).
func (a *Adapter) ParseRecoverStale([]byte) (string, error) {
	return "", fmt.Errorf("cocoon recover-stale: %w", manager.ErrNotSupported)
}
