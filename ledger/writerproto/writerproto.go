// Package writerproto is the guest workload writer's protocol (issue #13):
// its arguments, its output lines, its marker names and its pacing. The fake
// guest's simulated writer (fakech), the real guest's binary
// (cmd/vmchaos-writer) and the ledger's driver all use it, so the three
// cannot drift apart.
//
// Output, one line each:
//
//	start <first seq> <boot id>
//	ack <seq> <begin ns> <ack ns>
//
// An ack is sent only once its disk marker is durable and its RAM marker
// present. Times are the guest's CLOCK_MONOTONIC in ns.
package writerproto

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Names and defaults.
const (
	Cmd         = "vmchaos-writer"
	DiskDir     = "/var/lib/vmchaos/workload"
	RAMDir      = "/run/vmchaos-workload"
	DefaultRate = 200
	// DefaultGroup keeps syncs this far apart: a higher rate is met by
	// putting several markers under one sync.
	DefaultGroup = 5 * time.Millisecond
	MaxBatch     = 64          // markers made durable by one sync at most
	MaxBacklog   = time.Second // a starved writer catches up at most this much
)

// Opts are the writer's arguments.
type Opts struct {
	Rate  float64 // markers per second (real time)
	Start int     // first seq; 0 = continue after the highest seq present
	Count int     // stop after this many markers; 0 = until the session ends
	Group time.Duration
	Disk  string // disk marker dir (--dir)
	RAM   string // RAM marker dir (--ram-dir)
}

// Usage is the one-line synopsis of the arguments Parse takes.
const Usage = "usage: " + Cmd + " [--rate N] [--start SEQ|auto] [--count N] [--group-ms MS] [--dir DISKDIR] [--ram-dir RAMDIR]"

// Parse reads the writer's arguments. The directories are taken as given:
// where they may live is the caller's to check.
func Parse(args []string) (Opts, error) {
	o := Opts{Rate: DefaultRate, Group: DefaultGroup, Disk: DiskDir, RAM: RAMDir}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if i+1 >= len(args) {
			return o, fmt.Errorf("%s: option %s needs a value", Cmd, a)
		}
		v := args[i+1]
		i++
		var err error
		switch a {
		case "--rate":
			o.Rate, err = strconv.ParseFloat(v, 64)
			if err == nil && !(o.Rate > 0 && o.Rate <= 100000) {
				err = errors.New("want 0 < rate <= 100000")
			}
		case "--start":
			if v == "auto" {
				o.Start = 0
			} else if o.Start, err = strconv.Atoi(v); err == nil && o.Start < 1 {
				err = errors.New("want a seq >= 1 or auto")
			}
		case "--count":
			if o.Count, err = strconv.Atoi(v); err == nil && o.Count < 0 {
				err = errors.New("want >= 0")
			}
		case "--group-ms":
			var ms float64
			if ms, err = strconv.ParseFloat(v, 64); err == nil && !(ms >= 0 && ms <= 10000) {
				err = errors.New("want 0 <= ms <= 10000")
			}
			o.Group = time.Duration(ms * float64(time.Millisecond))
		case "--dir":
			o.Disk = v
		case "--ram-dir":
			o.RAM = v
		default:
			return o, fmt.Errorf("%s: unknown option %s", Cmd, a)
		}
		if err == nil && v == "" {
			err = errors.New("empty value")
		}
		if err != nil {
			return o, fmt.Errorf("%s: %s %q: %v", Cmd, a, v, err)
		}
	}
	return o, nil
}

// Seq is the seq in a marker file name ("seq-12" → 12), 0 for any other
// name (leading zeros included: the writer never makes them).
func Seq(name string) int {
	n, ok := strings.CutPrefix(name, "seq-")
	if !ok || n == "" || n[0] == '0' || len(n) > 12 {
		return 0
	}
	s, err := strconv.Atoi(n)
	if err != nil || s < 1 {
		return 0
	}
	return s
}

// Marker is the file name of seq.
func Marker(seq int) string { return "seq-" + strconv.Itoa(seq) }

// StartLine is the writer's first line.
func StartLine(seq int, bootID string) string { return fmt.Sprintf("start %d %s\n", seq, bootID) }

// AckLines are the ack lines of markers seq..seq+n-1, made durable together.
func AckLines(seq, n int, beginNs, ackNs int64) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "ack %d %d %d\n", seq+i, beginNs, ackNs)
	}
	return b.String()
}

// ParseStart reads a start line.
func ParseStart(line string) (seq int, bootID string, err error) {
	if _, err := fmt.Sscanf(line, "start %d %s", &seq, &bootID); err != nil || seq < 1 || bootID == "" {
		return 0, "", fmt.Errorf("bad start line %q", strings.TrimSpace(line))
	}
	return seq, bootID, nil
}

// ParseAck reads an ack line.
func ParseAck(line string) (seq int, beginNs, ackNs int64, err error) {
	if _, err := fmt.Sscanf(line, "ack %d %d %d", &seq, &beginNs, &ackNs); err != nil || seq < 1 {
		return 0, 0, 0, fmt.Errorf("bad ack line %q", strings.TrimSpace(line))
	}
	return seq, beginNs, ackNs, nil
}

// Pacer says when the writer syncs next and how many markers go under that
// sync: markers are due at the rate, syncs stay Group apart, and markers due
// together share one sync (group commit), at most MaxBatch.
type Pacer struct {
	interval, group time.Duration
	next            time.Time // when the next marker is due
	lastSync        time.Time
	left            int // markers still to write; -1: no count
}

// NewPacer starts pacing at now.
func NewPacer(o Opts, now time.Time) *Pacer {
	left := -1
	if o.Count > 0 {
		left = o.Count
	}
	return &Pacer{interval: time.Duration(float64(time.Second) / o.Rate), group: o.Group, next: now, left: left}
}

// Finished: the count is reached.
func (p *Pacer) Finished() bool { return p.left == 0 }

// Wake is when the next sync may happen.
func (p *Pacer) Wake() time.Time {
	if gs := p.lastSync.Add(p.group); gs.After(p.next) {
		return gs
	}
	return p.next
}

// Wait sleeps until Wake; false when ctx ended first.
func (p *Pacer) Wait(ctx context.Context) bool {
	d := time.Until(p.Wake())
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Batch is how many markers are due at now. stalled: the writer did not
// run for a while (a paused guest): it owes nothing for that time, as a
// writer only starved of CPU owes at most MaxBacklog.
func (p *Pacer) Batch(now time.Time, stalled bool) int {
	if stalled || now.Sub(p.next) > MaxBacklog {
		p.next = now
	}
	n := min(1+int(now.Sub(p.next)/p.interval), MaxBatch)
	if p.left >= 0 {
		n = min(n, p.left)
	}
	return n
}

// Synced records that n markers were made durable by the sync at now.
func (p *Pacer) Synced(n int, now time.Time) {
	p.next = p.next.Add(time.Duration(n) * p.interval)
	p.lastSync = now
	if p.left > 0 {
		p.left -= n
	}
}
