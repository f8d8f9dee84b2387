package fakech

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/ledger/writerproto"
)

// The guest's workload writer (issue #13): `vmchaos-writer` appends
// sequence-numbered markers for as long as its SSH session lives, and streams
// one ack line per marker (protocol, arguments and pacing: ledger/writerproto,
// shared with the real guest's cmd/vmchaos-writer). Each marker is a disk
// file seq-N under the disk dir, made durable (the fake guest's sync is fsync
// of file and directory in one), then a RAM file seq-N under the RAM dir. All
// of a marker happens under the guest lock that a pause takes, so a marker is
// either wholly before a pause or wholly after the resume, and the ack line is
// sent under the same lock: a paused guest makes no progress and says nothing.
//
// Times are the guest's clock, which on the fake guest is the host's
// CLOCK_MONOTONIC (failpoint.Now), the clock of the harness's trace.
const (
	WriterCmd        = writerproto.Cmd
	WriterDiskDir    = writerproto.DiskDir
	WriterRAMDir     = writerproto.RAMDir
	writerPausedWait = 20 * time.Millisecond // waiting longer than this for the guest lock: it was paused
)

// parseWriterArgs parses the shared arguments and keeps the directories in
// the fake guest's trees: the disk dir on disk, the RAM dir in RAM.
func parseWriterArgs(args []string) (writerproto.Opts, error) {
	o, err := writerproto.Parse(args)
	if err != nil {
		return o, err
	}
	o.Disk, o.RAM = guestPath(o.Disk), guestPath(o.RAM)
	if isRAM(o.Disk) || !isRAM(o.RAM) {
		return o, fmt.Errorf("%s: --dir must be on disk and --ram-dir under /run, /tmp or /dev/shm", WriterCmd)
	}
	return o, nil
}

// writerSeq is the seq in a marker file name ("seq-12" → 12), 0 if none.
func writerSeq(name string) int { return writerproto.Seq(name) }

// nextSeqLocked continues after the highest marker the guest holds, on disk
// or in RAM: a restored guest carries on from its captured state.
func (g *guest) nextSeqLocked(o writerproto.Opts) int {
	hi := 0
	for _, dir := range []string{o.Disk, o.RAM} {
		for _, n := range g.list(dir) {
			hi = max(hi, writerSeq(n))
		}
	}
	return hi + 1
}

// writeMarkersLocked makes markers seq..seq+n-1 durable on disk, then in RAM.
func (g *guest) writeMarkersLocked(o writerproto.Opts, seq, n int) error {
	for _, d := range []string{o.Disk, o.RAM} {
		for p := d; p != "/" && !g.isDir(p); p = parentDir(p) {
			g.treeFor(p).Dirs[p] = true
		}
	}
	for i := 0; i < n; i++ {
		g.disk.Files[o.Disk+"/"+writerproto.Marker(seq+i)] = []byte{}
	}
	if err := g.syncLocked(); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		g.ram.Files[o.RAM+"/"+writerproto.Marker(seq+i)] = []byte{}
	}
	return nil
}

// writer runs the workload until ctx ends (the session or the guest went
// away), the count is reached or stdout fails (the harness hung up).
func (g *guest) writer(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseWriterArgs(args)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if err := g.lockRunning(ctx); err != nil {
		return 255
	}
	seq := o.Start
	if seq == 0 {
		seq = g.nextSeqLocked(o)
	}
	_, err = io.WriteString(stdout, writerproto.StartLine(seq, g.bootID))
	g.mu.Unlock()
	if err != nil {
		return 141 // SIGPIPE: the reader went away
	}
	p := writerproto.NewPacer(o, time.Now())
	for !p.Finished() {
		if !p.Wait(ctx) {
			return 0
		}
		asked := time.Now()
		if err := g.lockRunning(ctx); err != nil {
			return 0
		}
		now := time.Now()
		// A paused guest's writer did not run while it waited for the lock:
		// it owes nothing for the pause.
		n := p.Batch(now, now.Sub(asked) > writerPausedWait)
		begin := failpoint.Now()
		if err := g.writeMarkersLocked(o, seq, n); err != nil {
			g.mu.Unlock()
			fmt.Fprintf(stderr, "%s: seq %d: %v\n", WriterCmd, seq, err)
			return 1
		}
		_, err := io.WriteString(stdout, writerproto.AckLines(seq, n, begin, failpoint.Now()))
		g.mu.Unlock()
		if err != nil {
			return 141
		}
		seq += n
		p.Synced(n, now)
	}
	return 0
}
