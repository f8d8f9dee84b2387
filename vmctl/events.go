package vmctl

import (
	"bytes"
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/vmchaos/vmchaos/regress"
)

// Event kinds of `vm status --event`.
const (
	EventAdded    = "ADDED"
	EventModified = "MODIFIED"
	EventDeleted  = "DELETED"
)

// StatusEvents emits one StatusEvent per change between passes taken every
// interval, until ctx ends or emit fails. The first pass emits ADDED for
// every VM.
//
// The previous pass is kept as frozen values (the display state computed at
// capture time). Comparing against live records instead re-evaluates the
// old side against the same dead PID, so a VMM killed with -9 never shows
// as a change (seed 000).
func (m *Manager) StatusEvents(ctx context.Context, interval time.Duration, emit func(StatusEvent) error) error {
	interval = max(interval, minInterval)
	pointers := regress.On("event-stream-pointer-snapshot")
	prevVals := map[string]VM{}
	prevRecs := map[string]*VM{}
	for {
		ix, err := m.loadVMs()
		if err != nil {
			return err
		}
		ids := make([]string, 0, len(ix.VMs))
		for id := range ix.VMs {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			cur := m.view(ix.VMs[id], false)
			var old *VM
			if pointers {
				// The bug: the stored record is re-reconciled now, against
				// the same dead PID, so old and new always agree on state.
				if r, ok := prevRecs[id]; ok {
					old = m.view(r, false)
				}
			} else if o, ok := prevVals[id]; ok {
				old = &o
			}
			switch {
			case old == nil:
				if err := emit(StatusEvent{Event: EventAdded, VM: *cur}); err != nil {
					return err
				}
			case !sameView(old, cur):
				if err := emit(StatusEvent{Event: EventModified, VM: *cur}); err != nil {
					return err
				}
			}
			prevVals[id] = *cur
			prevRecs[id] = ix.VMs[id]
		}
		gone := make([]string, 0)
		for id := range prevVals {
			if _, ok := ix.VMs[id]; !ok {
				gone = append(gone, id)
			}
		}
		sort.Strings(gone)
		for _, id := range gone {
			if err := emit(StatusEvent{Event: EventDeleted, VM: prevVals[id]}); err != nil {
				return err
			}
			delete(prevVals, id)
			delete(prevRecs, id)
		}
		if err := sleepRaw(ctx, interval); err != nil {
			return nil
		}
	}
}

func sameView(a, b *VM) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}
