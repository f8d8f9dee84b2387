package vmctl

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// checkEvidence returns the evidence of rep's violations of invariant inv.
func checkEvidence(rep CheckReport, inv string) []string {
	var out []string
	for _, v := range rep.Violations {
		if v.Invariant == inv {
			out = append(out, v.Evidence)
		}
	}
	return out
}

// TestCheckFindsRecordsWithoutTheirData: a VM record past creating without
// its disk is a violation (what a power cut must never leave: the record
// durable, its data not); with the disk in place the check is clean of it.
func TestCheckFindsRecordsWithoutTheirData(t *testing.T) {
	m := newTestManager(t)
	ctx := context.Background()
	vmID := newID()
	if err := m.updateVMs(ctx, "", func(ix *vmIndex) error {
		ix.VMs[vmID] = &VM{ID: vmID, Name: "a", State: StateStopped}
		ix.Names["a"] = vmID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if ev := checkEvidence(m.Check(ctx), "vm-data"); len(ev) != 1 || !strings.Contains(ev[0], vmID) {
		t.Errorf("vm-data: %v, want vm %s without its disk", ev, vmID)
	}
	if err := os.MkdirAll(m.vmDir(vmID), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.vmDisk(vmID), []byte("disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ev := checkEvidence(m.Check(ctx), "vm-data"); len(ev) > 0 {
		t.Errorf("with the disk in place: %v", ev)
	}
}

// TestCheckFindsSnapshotsMissingAnyFile: a ready snapshot missing any one of
// the files a clone reads (CH's config.json, state.json and memory-ranges,
// the disk, vmctl's own vmctl.json) is a snapshot-data violation naming that
// file; with all of them the check is clean.
func TestCheckFindsSnapshotsMissingAnyFile(t *testing.T) {
	all := []string{"config.json", "state.json", "memory-ranges", snapDiskFile, snapMetaFile}
	for _, missing := range append(all, "") {
		name := missing
		if name == "" {
			name = "none"
		}
		t.Run("missing="+name, func(t *testing.T) {
			m := newTestManager(t)
			ctx := context.Background()
			snapID := newID()
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
			for _, f := range all {
				if f == missing {
					continue
				}
				if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			ev := checkEvidence(m.Check(ctx), "snapshot-data")
			if missing == "" {
				if len(ev) > 0 {
					t.Errorf("with every file in place: %v", ev)
				}
				return
			}
			if len(ev) != 1 || !strings.Contains(ev[0], missing) || !strings.Contains(ev[0], snapID) {
				t.Errorf("snapshot-data: %v, want snapshot %s without %s", ev, snapID, missing)
			}
		})
	}
}
