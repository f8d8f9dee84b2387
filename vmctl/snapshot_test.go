package vmctl

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// TestSnapshotRmFinishesEveryInterruptedDeleteOfAName: a name whose rm died
// after the tombstone twice (a save of the name between the two) carries two
// tombstones; `snapshot rm NAME` finishes both, as vm rm does, so no delete
// of an older incarnation is left behind with its data.
func TestSnapshotRmFinishesEveryInterruptedDeleteOfAName(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	var ids []string
	for range 2 {
		s.ok("snapshot", "save", "--name", "twice", "a")
		snap, err := s.m.resolveSnap("twice")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, snap.ID)
		r := s.runEnv([]string{failpoint.EnvFailpoints + "=snapshot.rm.tombstoned=kill"}, "snapshot", "rm", "twice")
		if r.signal != syscall.SIGKILL {
			t.Fatalf("snapshot rm not killed: %s", r)
		}
	}
	s.ok("snapshot", "rm", "twice")
	ix, err := s.m.loadSnaps()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, ok := ix.Tombstones[id]; ok {
			t.Errorf("tombstone %s left after rm by name", id)
		}
		if _, err := os.Stat(s.m.snapDir(id)); !os.IsNotExist(err) {
			t.Errorf("snapshot dir of %s left after rm by name: %v", id, err)
		}
	}
	s.fails(MsgSnapshotNotFound, "snapshot", "rm", "twice")
	s.check()
}

// TestSaveRemovesItsCaptureWhenTheMoveToStagingFails: the save parks after
// its capture, a non-empty dir is put where its staging dir goes (rename
// onto it fails, ENOTEMPTY), and the save fails at the move. The capture dir
// (a full copy of guest memory) must be gone when the save returns, not left
// for a later save or gc.
func TestSaveRemovesItsCaptureWhenTheMoveToStagingFails(t *testing.T) {
	s := newStack(t, "0.02")
	a := s.runVM("a")
	const point = "snapshot.save.unlocked"
	p := s.background([]string{failpoint.EnvFailpoints + "=" + point + "=pause"}, "snapshot", "save", "--name", "m", "a")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := failpoint.WaitParked(ctx, s.ctl, point); err != nil {
		t.Fatal(err)
	}
	caps, err := filepath.Glob(filepath.Join(s.m.vmDir(a.ID), capturePrefix+"*"))
	if err != nil || len(caps) != 1 {
		t.Fatalf("want one capture dir of the parked save, got %v (%v)", caps, err)
	}
	sid := strings.TrimPrefix(filepath.Base(caps[0]), capturePrefix)
	blocker := s.m.stagingFor(sid)
	if err := os.MkdirAll(blocker, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(blocker, "occupied"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := failpoint.Release(s.ctl, point); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t)
	if r.code != 1 || !strings.Contains(r.stderr, "move capture to staging") {
		t.Fatalf("save should fail at the move: %s", r)
	}
	if _, err := os.Stat(caps[0]); !os.IsNotExist(err) {
		t.Fatalf("capture dir %s left after the failed move: %v", caps[0], err)
	}
	if err := os.RemoveAll(blocker); err != nil {
		t.Fatal(err)
	}
	s.check()
}
