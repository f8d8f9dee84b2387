package fakech

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// The guest's workload writer (issue #13): `vmchaos-writer` appends
// sequence-numbered markers for as long as its SSH session lives, and streams
// one ack line per marker. Each marker is a disk file seq-N under the disk
// dir, made durable (the fake guest's sync is fsync of file and directory in
// one), then a RAM file seq-N under the RAM dir. All of a marker happens under
// the guest lock that a pause takes, so a marker is either wholly before a
// pause or wholly after the resume, and the ack line is sent under the same
// lock: a paused guest makes no progress and says nothing.
//
// Output, one line each:
//
//	start <first seq> <boot id>
//	ack <seq> <begin ns> <ack ns>
//
// Times are the guest's clock, which on the fake guest is the host's
// CLOCK_MONOTONIC (failpoint.Now), the clock of the harness's trace.
const (
	WriterCmd        = "vmchaos-writer"
	WriterDiskDir    = "/var/lib/vmchaos/workload"
	WriterRAMDir     = "/run/vmchaos-workload"
	writerMaxBatch   = 64                    // markers made durable by one sync at most
	writerMaxBacklog = time.Second           // a starved writer catches up at most this much
	writerPausedWait = 20 * time.Millisecond // waiting longer than this for the guest lock: it was paused
)

type writerOpts struct {
	rate  float64 // markers per second (real time)
	start int     // first seq; 0 = continue after the highest seq present
	count int     // stop after this many markers; 0 = until the session ends
	group time.Duration
	disk  string
	ram   string
}

func parseWriterArgs(args []string) (writerOpts, error) {
	o := writerOpts{rate: 200, group: 5 * time.Millisecond, disk: WriterDiskDir, ram: WriterRAMDir}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if i+1 >= len(args) {
			return o, fmt.Errorf("%s: option %s needs a value", WriterCmd, a)
		}
		v := args[i+1]
		i++
		var err error
		switch a {
		case "--rate":
			o.rate, err = strconv.ParseFloat(v, 64)
			if err == nil && (o.rate <= 0 || o.rate > 100000) {
				err = fmt.Errorf("want 0 < rate <= 100000")
			}
		case "--start":
			if v == "auto" {
				o.start = 0
			} else if o.start, err = strconv.Atoi(v); err == nil && o.start < 1 {
				err = fmt.Errorf("want a seq >= 1 or auto")
			}
		case "--count":
			if o.count, err = strconv.Atoi(v); err == nil && o.count < 0 {
				err = fmt.Errorf("want >= 0")
			}
		case "--group-ms":
			var ms float64
			if ms, err = strconv.ParseFloat(v, 64); err == nil {
				o.group = time.Duration(ms * float64(time.Millisecond))
			}
		case "--dir":
			o.disk = guestPath(v)
		case "--ram-dir":
			o.ram = guestPath(v)
		default:
			return o, fmt.Errorf("%s: unknown option %s", WriterCmd, a)
		}
		if err != nil {
			return o, fmt.Errorf("%s: %s %q: %v", WriterCmd, a, v, err)
		}
	}
	if isRAM(o.disk) || !isRAM(o.ram) {
		return o, fmt.Errorf("%s: --dir must be on disk and --ram-dir under /run, /tmp or /dev/shm", WriterCmd)
	}
	return o, nil
}

// writerSeq is the seq in a marker file name ("seq-12" → 12), 0 if none.
func writerSeq(name string) int {
	n, ok := strings.CutPrefix(name, "seq-")
	if !ok {
		return 0
	}
	s, err := strconv.Atoi(n)
	if err != nil || s < 1 {
		return 0
	}
	return s
}

// nextSeqLocked continues after the highest marker the guest holds, on disk
// or in RAM: a restored guest carries on from its captured state.
func (g *guest) nextSeqLocked(o writerOpts) int {
	hi := 0
	for _, dir := range []string{o.disk, o.ram} {
		for _, n := range g.list(dir) {
			hi = max(hi, writerSeq(n))
		}
	}
	return hi + 1
}

// writeMarkersLocked makes markers seq..seq+n-1 durable on disk, then in RAM.
func (g *guest) writeMarkersLocked(o writerOpts, seq, n int) error {
	for _, d := range []string{o.disk, o.ram} {
		for p := d; p != "/" && !g.isDir(p); p = parentDir(p) {
			g.treeFor(p).Dirs[p] = true
		}
	}
	for i := 0; i < n; i++ {
		g.disk.Files[fmt.Sprintf("%s/seq-%d", o.disk, seq+i)] = []byte{}
	}
	if err := g.syncLocked(); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		g.ram.Files[fmt.Sprintf("%s/seq-%d", o.ram, seq+i)] = []byte{}
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
	seq := o.start
	if seq == 0 {
		seq = g.nextSeqLocked(o)
	}
	_, err = fmt.Fprintf(stdout, "start %d %s\n", seq, g.bootID)
	g.mu.Unlock()
	if err != nil {
		return 141 // SIGPIPE: the reader went away
	}
	interval := time.Duration(float64(time.Second) / o.rate)
	next := time.Now() // when the next marker is due
	var lastSync time.Time
	done := 0
	for o.count == 0 || done < o.count {
		// syncs stay o.group apart; a higher rate is met by batching
		wake := next
		if gs := lastSync.Add(o.group); gs.After(wake) {
			wake = gs
		}
		if d := time.Until(wake); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return 0
			case <-t.C:
			}
		}
		asked := time.Now()
		if err := g.lockRunning(ctx); err != nil {
			return 0
		}
		now := time.Now()
		// A writer starved of CPU catches up (markers due together share
		// a sync); a paused guest's writer does not: its process did not
		// run, so it owes nothing for the pause.
		if now.Sub(asked) > writerPausedWait || now.Sub(next) > writerMaxBacklog {
			next = now
		}
		// group commit: every marker due by now goes under one sync
		n := 1 + int(now.Sub(next)/interval)
		n = min(n, writerMaxBatch)
		if o.count > 0 {
			n = min(n, o.count-done)
		}
		begin := failpoint.Now()
		if err := g.writeMarkersLocked(o, seq, n); err != nil {
			g.mu.Unlock()
			fmt.Fprintf(stderr, "%s: seq %d: %v\n", WriterCmd, seq, err)
			return 1
		}
		ack := failpoint.Now()
		var b strings.Builder
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "ack %d %d %d\n", seq+i, begin, ack)
		}
		_, err := io.WriteString(stdout, b.String())
		g.mu.Unlock()
		if err != nil {
			return 141
		}
		seq += n
		done += n
		next = next.Add(time.Duration(n) * interval)
		lastSync = now
	}
	return 0
}
