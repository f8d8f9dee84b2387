package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/failpoint"
)

// The workload against real fakech guests. The test plays the manager: a
// save is pause → vm.snapshot → copy the disk → resume, as vmctl does it; the
// inconsistent double copies the disk only after the resume (a manager that
// copies the disk outside the pause window). A clone is a new VMM restored
// from the snapshot with the copied disk, on its own address.

// copyDisk copies the guest image the way a manager copies a VM's disk.
func copyDisk(t testing.TB, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// save snapshots v under workload; diskLate copies the disk after the
// resume (the inconsistent double). It returns the snapshot dir and the
// window on the trace clock.
// startWriter starts the guest's writer at its default rate and waits for n acks.
func (r *rig) startWriter(ctx context.Context, n int) *Workload {
	r.t.Helper()
	w, err := r.ledger.StartWorkload(ctx, r.guest, WorkloadOpts{})
	if err != nil {
		r.t.Fatal(err)
	}
	if err := w.WaitAcks(ctx, n); err != nil {
		r.t.Fatal(err)
	}
	return w
}

func (r *rig) save(ctx context.Context, v *vmm, w *Workload, diskLate bool) (string, CutWindow) {
	r.t.Helper()
	r.vmms++
	snap := filepath.Join(r.dir, fmt.Sprintf("save-%d", r.vmms))
	if err := os.MkdirAll(snap, 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := v.api.Pause(ctx, false); err != nil {
		r.t.Fatalf("pause: %v", err)
	}
	win := CutWindow{Snapshot: filepath.Base(snap), PauseNs: failpoint.Now(), GuestClock: true}
	if err := v.api.Snapshot(ctx, snap); err != nil {
		r.t.Fatalf("snapshot: %v", err)
	}
	if !diskLate {
		copyDisk(r.t, r.img, filepath.Join(snap, "disk.img"))
	}
	if err := v.api.Resume(ctx, false); err != nil {
		r.t.Fatalf("resume: %v", err)
	}
	win.ResumeNs = failpoint.Now()
	if diskLate {
		// the double: the guest writes on while the disk is copied
		if err := w.WaitAcks(ctx, w.Acks()+20); err != nil {
			r.t.Fatal(err)
		}
		copyDisk(r.t, r.img, filepath.Join(snap, "disk.img"))
	}
	return snap, win
}

// clone restores snap with its copied disk into a new VMM answering on a new
// address, as vmctl's clone does.
func (r *rig) clone(ctx context.Context, snap, name string) (*vmm, Guest) {
	r.t.Helper()
	dir := filepath.Join(r.dir, "clone-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	for _, f := range []string{"state.json", "memory-ranges"} {
		copyDisk(r.t, filepath.Join(snap, f), filepath.Join(dir, f))
	}
	disk := filepath.Join(dir, "disk.img")
	copyDisk(r.t, filepath.Join(snap, "disk.img"), disk)
	b, err := os.ReadFile(filepath.Join(snap, "config.json"))
	if err != nil {
		r.t.Fatal(err)
	}
	var cfg chapi.VmConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		r.t.Fatal(err)
	}
	ip := randomLoopback()
	cfg.Disks[0].Path = disk
	cfg.Net = []chapi.NetConfig{{IP: ip}}
	if b, err = json.Marshal(cfg); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		r.t.Fatal(err)
	}
	v := r.start(ctx)
	if err := v.api.Restore(ctx, chapi.RestoreConfig{SourceURL: "file://" + dir}); err != nil {
		r.t.Fatalf("restore clone: %v", err)
	}
	if err := v.api.Resume(ctx, false); err != nil {
		r.t.Fatalf("resume clone: %v", err)
	}
	_, port, _ := net.SplitHostPort(r.guest.Addr)
	return v, Guest{Name: name, Addr: net.JoinHostPort(ip, port)}
}

func TestWorkloadCloneHoldsItsSnapshotsCut(t *testing.T) {
	r := newRig(t, "wl-src")
	ctx := r.ctx()
	v := r.boot(ctx)
	w := r.startWriter(ctx, 50)
	snap, win := r.save(ctx, v, w, false)
	// the source goes on independently of the capture
	if err := w.WaitAcks(ctx, w.Acks()+50); err != nil {
		t.Fatalf("source writer after the save: %v", err)
	}
	_, cg := r.clone(ctx, snap, "wl-clone")
	st := w.Stop()
	cut, err := r.ledger.JudgeCut(ctx, r.guest.Name, cg, win, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("writer: %d acks, seq %d..%d, %s", st.Acks, st.First, st.Last, st.End)
	t.Logf("clone: %s", cut.Message)
	if !cut.OK || cut.AckedBeforePause < 50 || cut.BeganAfterResume == 0 || cut.Cut < cut.AckedBeforePause {
		t.Fatalf("consistent snapshot judged %+v", cut)
	}
	// the source kept every marker it acked, beyond the clone's cut
	src, err := r.ledger.ListWorkload(ctx, r.guest)
	if err != nil {
		t.Fatal(err)
	}
	if len(src.Disk) < st.Acks || st.Last <= cut.Cut {
		t.Fatalf("source holds %d markers for %d acks (last %d, clone cut %d)", len(src.Disk), st.Acks, st.Last, cut.Cut)
	}
}

// TestInconsistentSnapshotFailsTheCut is the proof of issue #13: a manager
// that copies the disk after the resume makes a snapshot whose disk holds
// markers written after the capture, and the cut verdict says PHANTOM.
func TestInconsistentSnapshotFailsTheCut(t *testing.T) {
	r := newRig(t, "wl-bad")
	ctx := r.ctx()
	v := r.boot(ctx)
	w := r.startWriter(ctx, 30)
	snap, win := r.save(ctx, v, w, true)
	w.Stop()
	_, cg := r.clone(ctx, snap, "wl-bad-clone")
	cut, err := r.ledger.JudgeCut(ctx, r.guest.Name, cg, win, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clone of the inconsistent snapshot: %s", cut.Message)
	if cut.OK || len(cut.Phantom) == 0 {
		t.Fatalf("a disk copied after the resume passed the cut: %s", cut.Message)
	}
	// the RAM came from the capture, so RAM and disk disagree: the RAM
	// side is a consistent cut and the phantoms are the disk's only
	if len(cut.RAMPhantom) != 0 || len(cut.RAMLost) != 0 {
		t.Fatalf("RAM side: %s", cut.Message)
	}
}

// TestWorkloadThroughHibernateWake: the writer runs until the NIC drop cuts
// it off; after the wake every marker acked before the drop is there, on
// disk and in RAM, the boot id is unchanged, and a new session continues
// the sequence from the restored state.
func TestWorkloadThroughHibernateWake(t *testing.T) {
	r := newRig(t, "wl-hib")
	ctx := r.ctx()
	v := r.boot(ctx)
	w := r.startWriter(ctx, 50)
	info, err := v.api.Info(ctx)
	if err != nil || info.Config.Net == nil || len(info.Config.Net) != 1 {
		t.Fatalf("info: %v %+v", err, info.Config.Net)
	}
	if err := v.api.RemoveDevice(ctx, info.Config.Net[0].ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Done():
	case <-ctx.Done():
		t.Fatal("the NIC drop did not end the writer's session")
	}
	dropNs := failpoint.Now()
	st := w.Stop()
	v = r.wake(ctx, r.hibernate(ctx, v))
	if _, err := v.api.AddNet(ctx, chapi.NetConfig{IP: r.ip}); err != nil {
		t.Fatal(err)
	}
	entries, _, err := ReadJournal(r.ledger.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	h := WorkloadFromJournal(entries, r.guest.Name)
	ls, err := r.ledger.ListWorkload(ctx, r.guest)
	if err != nil {
		t.Fatal(err)
	}
	verdict := ClassifyWake(WakeInput{Guest: r.guest.Name, Acks: h.Acks, First: h.First, DropNs: dropNs, GuestClock: true,
		Disk: ls.Disk, RAM: ls.RAM, BootBefore: w.BootID, BootAfter: ls.BootID})
	t.Logf("writer until the drop: %d acks (%s); wake: %s", st.Acks, st.End, verdict.Message)
	if !verdict.OK || verdict.AckedBeforePause != st.Acks {
		t.Fatalf("wake verdict %+v", verdict)
	}
	w2, err := r.ledger.StartWorkload(ctx, r.guest, WorkloadOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if w2.First != verdict.Cut+1 || w2.BootID != w.BootID {
		t.Fatalf("after the wake the writer started at %d under %s, want %d under %s", w2.First, w2.BootID, verdict.Cut+1, w.BootID)
	}
	if err := w2.WaitAcks(ctx, 10); err != nil {
		t.Fatal(err)
	}
	w2.Stop()
}

// The journal records the sessions; a fresh fake guest's writer reaches the
// default rate. The figure is logged, not asserted (the machine is shared).
func TestWorkloadJournalAndRate(t *testing.T) {
	r := newRig(t, "wl-rate")
	ctx := r.ctx()
	r.boot(ctx)
	w, err := r.ledger.StartWorkload(ctx, r.guest, WorkloadOpts{Rate: 400})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := w.WaitAcks(ctx, 200); err != nil {
		t.Fatal(err)
	}
	el := time.Since(t0)
	st := w.Stop()
	t.Logf("rate: %d acks in %s = %.0f/s (asked 400/s)", st.Acks, el.Round(time.Millisecond), float64(200)/el.Seconds())
	entries, torn, err := ReadJournal(r.ledger.JournalPath())
	if err != nil || torn {
		t.Fatalf("journal: torn %v err %v", torn, err)
	}
	h := WorkloadFromJournal(entries, r.guest.Name)
	if h.Sessions != 1 || h.First != 1 || len(h.Acks) != st.Acks {
		t.Fatalf("journal history %d sessions first %d %d acks, writer %d", h.Sessions, h.First, len(h.Acks), st.Acks)
	}
	for i, a := range h.Acks {
		if a.Seq != i+1 || a.HostNs < a.AckNs {
			t.Fatalf("ack %d: %+v", i, a)
		}
	}
	if st.End != "stopped by the harness" {
		t.Fatalf("end %q", st.End)
	}
}
