package qemucheck

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/ledger"
)

// writerSession runs vmchaos-writer in the guest through the ledger (acks
// journaled as they arrive) until Markers acks; the session is left running.
func (c *checker) writerSession(ctx context.Context) (*ledger.Workload, error) {
	w, err := c.led.StartWorkload(ctx, c.g, ledger.WorkloadOpts{Rate: c.o.Rate})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := w.WaitAcks(wctx, c.o.Markers); err != nil {
		st := w.Stop()
		return nil, fmt.Errorf("%d acks of %d: %w (session: %s)", st.Acks, c.o.Markers, err, st.End)
	}
	return w, nil
}

// history is the journal's record of the guest's writer.
func (c *checker) history() (ledger.WorkloadHistory, error) {
	entries, _, err := ledger.ReadJournal(c.led.JournalPath())
	if err != nil {
		return ledger.WorkloadHistory{}, err
	}
	return ledger.WorkloadFromJournal(entries, guestName), nil
}

// writeAndKill: the writer acks markers and QEMU is killed with SIGKILL by
// its pid while the writer still runs (a marker may be between its fsync and
// its ack). This is a crash of the guest, not of the host: what QEMU wrote
// to the image file survives in the host's page cache either way, so what
// the kill can lose is what the guest had not yet written out, i.e. what
// was never fsynced.
func (c *checker) writeAndKill(ctx context.Context, v *vm) bool {
	w, err := c.writerSession(ctx)
	if err != nil {
		_ = v.kill()
		return c.record("writer", false, "vmchaos-writer in the guest: %v", err)
	}
	pid, exe := v.Pid(), v.exe()
	c.killNs = failpoint.Now()
	if err := v.kill(); err != nil {
		return c.record("kill-9", false, "%v", err)
	}
	st := w.Stop()
	ok := st.Acks >= c.o.Markers && st.Err == nil && exe != "?"
	return c.record("kill-9", ok, "SIGKILL to qemu pid %d (%s) while vmchaos-writer ran: %d markers acked (seq %d..%d, journaled in %s), exit %v",
		pid, exe, st.Acks, st.First, st.Last, c.led.JournalPath(), v.waitErr)
}

// checkCutAfterKill lists the writer's markers from the guest booted from
// the disk the kill left and judges them by the ledger's cut rules: every
// marker acked before the kill is there (acked means fsynced, and the disk
// cache mode makes that the image), nothing is missing below the highest
// present; markers past the last ack may or may not be (never acked).
func (c *checker) checkCutAfterKill(ctx context.Context, v *vm) bool {
	ls, err := c.led.ListWorkload(ctx, c.g)
	if err != nil {
		return c.record("kill-9-cut", false, "list the markers: %v", err)
	}
	h, err := c.history()
	if err != nil {
		return c.record("kill-9-cut", false, "journal: %v", err)
	}
	vd := ledger.ClassifyCut(ledger.CutInput{Source: guestName, Target: guestName, Acks: h.Acks, First: h.First,
		Window: ledger.CutWindow{Snapshot: "kill -9", PauseNs: c.killNs}, Disk: ls.Disk})
	replay := journalReplay(v.spec.Serial)
	ok := vd.OK && ls.BootID != "" && ls.BootID != c.bootID
	return c.record("kill-9-cut", ok, "after the kill and a boot (boot id %s → %s; %s): %d markers acked before the kill, %d on disk (cut seq %d, %d past the last ack), lost %d, holes %d, phantoms %d: %s",
		c.bootID, ls.BootID, replay, vd.AckedBeforePause, vd.Present, vd.Cut, max(0, vd.Cut-maxAck(h.Acks)),
		len(vd.Lost), len(vd.Hole), len(vd.Phantom), vd.Message)
}

// writeAndShutdown: a second writer session continues after the highest
// marker on disk; then a clean poweroff, and the image file itself, read by
// e2fsprogs with QEMU gone, must hold every acked marker.
func (c *checker) writeAndShutdown(ctx context.Context, v *vm) bool {
	before, _ := c.history()
	w, err := c.writerSession(ctx)
	if err != nil {
		_ = v.kill()
		return c.record("writer", false, "second vmchaos-writer session: %v", err)
	}
	st := w.Stop()
	c.record("writer", st.Err == nil && st.First > maxAck(before.Acks), "vmchaos-writer acked seq %d..%d (%d) after the kill's seq ..%d: `--start auto` read the disk; session %s",
		st.First, st.Last, st.Acks, maxAck(before.Acks), st.End)
	offNs := failpoint.Now()
	if _, err := c.led.Exec(ctx, c.g, "systemctl poweroff --no-block"); err != nil {
		_ = v.kill()
		return c.record("clean-shutdown", false, "poweroff: %v", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	err = v.wait(sctx)
	down := lastLine(v.spec.Serial, "reboot: Power down")
	if !c.record("clean-shutdown", err == nil && down != "", "`systemctl poweroff`: qemu exited (%v) %s after; serial: %q", err, time.Duration(failpoint.Now()-offNs).Round(time.Millisecond), down) {
		return false
	}
	return c.checkImage(ctx, offNs)
}

// checkImage reads the image file after the clean shutdown: e2fsck finds
// nothing to repair or replay, and the markers there obey the cut rules
// against every ack journaled before the poweroff.
func (c *checker) checkImage(ctx context.Context, offNs int64) bool {
	off, err := rootPartitionOffset(c.disk)
	if err != nil {
		return c.record("acked-on-image", false, "%v", err)
	}
	fsck, err := fsckClean(ctx, c.disk, off)
	if err != nil {
		return c.record("acked-on-image", false, "the root file system after a clean shutdown: %v", err)
	}
	names, err := listDir(ctx, c.disk, off, ledger.WorkloadDiskDir)
	if err != nil {
		return c.record("acked-on-image", false, "%v", err)
	}
	h, err := c.history()
	if err != nil {
		return c.record("acked-on-image", false, "journal: %v", err)
	}
	vd := ledger.ClassifyCut(ledger.CutInput{Source: guestName, Target: guestName, Acks: h.Acks, First: h.First,
		Window: ledger.CutWindow{Snapshot: "poweroff", PauseNs: offNs}, Disk: names})
	lines := strings.Split(fsck, "\n")
	return c.record("acked-on-image", vd.OK, "debugfs on %s (offset %d): %d markers acked in %d sessions, %d on the image (cut seq %d), lost %d, holes %d, phantoms %d: %s; e2fsck -fn: %q",
		c.disk, off, vd.AckedBeforePause, h.Sessions, vd.Present, vd.Cut, len(vd.Lost), len(vd.Hole), len(vd.Phantom), vd.Message, lines[len(lines)-1])
}

func maxAck(acks []ledger.WorkloadAck) int {
	m := 0
	for _, a := range acks {
		m = max(m, a.Seq)
	}
	return m
}

// journalReplay is the guest kernel's line saying it replayed the ext4
// journal the kill left (evidence that the kill was a crash).
func journalReplay(serial string) string {
	if l := lastLine(serial, "recovery complete"); l != "" {
		return fmt.Sprintf("%q", l)
	}
	return "no ext4 journal recovery on the console"
}

// lastLine is the last line of the file holding sub, escapes removed.
func lastLine(path, sub string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	found := ""
	for _, ln := range strings.Split(string(b), "\n") {
		if strings.Contains(ln, sub) {
			found = plain(ln)
		}
	}
	return found
}
