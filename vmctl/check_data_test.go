package vmctl

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckFindsRecordsWithoutTheirData: a VM record past creating without
// its disk, and a ready snapshot missing one of its files, are violations
// (what a power cut must never leave: the record durable, its data not);
// with the data in place the check is clean of both.
func TestCheckFindsRecordsWithoutTheirData(t *testing.T) {
	m := newTestManager(t)
	ctx := context.Background()
	vmID, snapID := newID(), newID()
	if err := m.updateVMs(ctx, "", func(ix *vmIndex) error {
		ix.VMs[vmID] = &VM{ID: vmID, Name: "a", State: StateStopped}
		ix.Names["a"] = vmID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	dir := m.snapDir(snapID)
	if err := m.updateSnaps(ctx, "", func(ix *snapIndex) error {
		ix.Snapshots[snapID] = &Snapshot{ID: snapID, Name: "s", State: SnapReady, Dir: dir}
		ix.Names["s"] = snapID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", snapDiskFile} { // no state.json
		if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	of := func(rep CheckReport, inv string) []string {
		var out []string
		for _, v := range rep.Violations {
			if v.Invariant == inv {
				out = append(out, v.Evidence)
			}
		}
		return out
	}
	rep := m.Check(ctx)
	if ev := of(rep, "vm-data"); len(ev) != 1 || !strings.Contains(ev[0], vmID) {
		t.Errorf("vm-data: %v, want vm %s without its disk", ev, vmID)
	}
	if ev := of(rep, "snapshot-data"); len(ev) != 1 || !strings.Contains(ev[0], "state.json") {
		t.Errorf("snapshot-data: %v, want the missing state.json", ev)
	}

	if err := os.MkdirAll(m.vmDir(vmID), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.vmDisk(vmID), []byte("disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep = m.Check(ctx)
	if ev := append(of(rep, "vm-data"), of(rep, "snapshot-data")...); len(ev) > 0 {
		t.Errorf("with the data in place: %v", ev)
	}
}
