package ledger

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/ledger/writerproto"
	"github.com/vmchaos/vmchaos/timescale"
	"golang.org/x/crypto/ssh"
)

// The workload driver (issue #13): it starts the guest's writer
// (`vmchaos-writer`: simulated by the fake guest, cmd/vmchaos-writer in a
// real one; protocol in ledger/writerproto) over one SSH session and journals
// what it streams — a wl-start entry with the first seq and boot id, then the
// acks in batches (one fsynced line per batch of lines that arrived together)
// — until the session ends: Stop, a NIC drop, a dead VMM.

// Guest-side paths of the writer's markers.
const (
	WorkloadDiskDir = writerproto.DiskDir
	WorkloadRAMDir  = writerproto.RAMDir
	WorkloadCmd     = writerproto.Cmd
	// DefaultWorkloadRate is markers per second per guest (real time).
	DefaultWorkloadRate = writerproto.DefaultRate
)

// WorkloadOpts configure one writer session.
type WorkloadOpts struct {
	Rate  float64 // markers/s; 0 = DefaultWorkloadRate
	Start int     // first seq; 0 = continue after the highest marker the guest holds
}

// Workload is one running writer session.
type Workload struct {
	l      *Ledger
	g      Guest
	First  int    // the session's first seq
	BootID string // the boot id the session started under
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	started time.Time
	ended   time.Time
	acks    int
	last    int
	lastNs  int64 // host time of the last ack
	end     string
	err     error
}

// WorkloadStats summarise a session.
type WorkloadStats struct {
	Guest   string
	First   int
	Last    int // last acked seq (First-1 when none)
	Acks    int
	End     string        // how the session ended
	Err     error         // journal failure, if any (the acks after it are not journaled)
	Elapsed time.Duration // from the start line to the end of the stream
}

// StartWorkload starts the writer in g and returns once it reported its
// first seq (journaled as wl-start). The session runs until Stop or until
// the guest connection goes away; ctx bounds the start only.
func (l *Ledger) StartWorkload(ctx context.Context, g Guest, o WorkloadOpts) (*Workload, error) {
	if err := checkGuest(g); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHarnessSSH, err)
	}
	if o.Rate <= 0 {
		o.Rate = DefaultWorkloadRate
	}
	start := "auto"
	if o.Start > 0 {
		start = strconv.Itoa(o.Start)
	}
	cmd := fmt.Sprintf("%s --rate %g --start %s", WorkloadCmd, o.Rate, start)
	// the session outlives ctx: it is ended by Stop (or by the guest)
	sctx, cancel := context.WithCancel(context.Background())
	actx, acancel := context.WithTimeout(ctx, l.AttemptTimeout)
	defer acancel()
	stopOnStart := context.AfterFunc(actx, cancel) // an abandoned start ends the session too
	defer stopOnStart()
	client, err := l.dialRetry(sctx, g)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("ledger %s: workload: %w", g.Name, err)
	}
	sess, err := client.NewSession()
	if err != nil {
		cancel()
		client.Close()
		return nil, fmt.Errorf("ledger %s: workload: open session: %w", g.Name, err)
	}
	out, err := sess.StdoutPipe()
	if err != nil {
		cancel()
		client.Close()
		return nil, fmt.Errorf("ledger %s: workload: %w", g.Name, err)
	}
	// stdin stays open for the session's life: the real guest's writer ends
	// on stdin EOF (a session without stdin sends EOF at once); it closes
	// with the connection.
	if _, err := sess.StdinPipe(); err != nil {
		cancel()
		client.Close()
		return nil, fmt.Errorf("ledger %s: workload: %w", g.Name, err)
	}
	var stderr strings.Builder
	sess.Stderr = &stderr
	if err := sess.Start(cmd); err != nil {
		cancel()
		client.Close()
		return nil, fmt.Errorf("ledger %s: workload: start %q: %w", g.Name, cmd, err)
	}
	r := bufio.NewReaderSize(out, 64<<10)
	first, err := r.ReadString('\n')
	if err != nil {
		werr := sess.Wait()
		cancel()
		client.Close()
		var ee *ssh.ExitError
		if errors.As(werr, &ee) {
			return nil, &CommandError{Guest: g.Name, Cmd: cmd, Status: ee.ExitStatus(), Stderr: stderr.String()}
		}
		return nil, fmt.Errorf("ledger %s: workload: no start line: %w", g.Name, err)
	}
	seq, boot, err := writerproto.ParseStart(first)
	if err != nil {
		cancel()
		client.Close()
		return nil, fmt.Errorf("ledger %s: workload: %w", g.Name, err)
	}
	if err := l.append(Entry{Kind: KindWorkloadStart, Guest: g.Name, Addr: g.Addr, Seq: seq, BootID: boot,
		HostNs: failpoint.Now(), Note: cmd}); err != nil {
		cancel()
		client.Close()
		return nil, fmt.Errorf("ledger %s: workload: %w: %w", g.Name, ErrHarnessSSH, err)
	}
	w := &Workload{l: l, g: g, First: seq, BootID: boot, cancel: cancel, done: make(chan struct{}), last: seq - 1, started: time.Now()}
	go w.read(sctx, client, sess, r, &stderr)
	return w, nil
}

// dialRetry connects to g, retrying transport failures with the same
// backoff as exec (a guest still booting or waking refuses for a while) until
// ctx ends. The connection closes when ctx ends.
func (l *Ledger) dialRetry(ctx context.Context, g Guest) (*ssh.Client, error) {
	delay := max(timescale.D(backoffFirst), backoffFirstMin)
	ceiling := max(timescale.D(backoffMax), backoffMaxMin)
	for attempt := 1; ; attempt++ {
		client, _, err := l.dialClient(ctx, g)
		if err == nil {
			return client, nil
		}
		if errors.Is(err, ErrHostKeyChanged) {
			return nil, err
		}
		if serr := timescale.SleepRaw(ctx, delay); serr != nil {
			// the last error stays matchable (ErrHarnessSSH: the run's key refused)
			return nil, fmt.Errorf("unreachable after %d attempt(s): %w (last error: %w)", attempt, serr, err)
		}
		delay = min(delay*2, ceiling)
	}
}

// read journals acks until the stream ends.
func (w *Workload) read(ctx context.Context, client *ssh.Client, sess *ssh.Session, r *bufio.Reader, stderr *strings.Builder) {
	defer close(w.done)
	started := time.Now()
	var batch []WorkloadAck
	var end string
	flush := func() {
		if len(batch) == 0 {
			return
		}
		err := w.l.append(Entry{Kind: KindWorkloadAcks, Guest: w.g.Name, Acks: batch, HostNs: failpoint.Now()})
		w.mu.Lock()
		if err != nil && w.err == nil {
			w.err = err
		}
		if err == nil {
			w.acks += len(batch)
			w.last = batch[len(batch)-1].Seq
			w.lastNs = batch[len(batch)-1].HostNs
		}
		w.mu.Unlock()
		batch = nil
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			if ctx.Err() != nil {
				end = "stopped by the harness"
			} else {
				end = "stream ended: " + err.Error()
			}
			break
		}
		now := failpoint.Now()
		var a WorkloadAck
		var perr error
		if a.Seq, a.BeginNs, a.AckNs, perr = writerproto.ParseAck(line); perr != nil {
			end = perr.Error()
			break
		}
		a.HostNs = now
		batch = append(batch, a)
		// one fsynced journal line per burst of lines that arrived together
		if r.Buffered() == 0 || len(batch) >= 512 {
			flush()
		}
	}
	flush()
	// the session is over either way: close it (the writer stops on its
	// next write) and record how it ended
	w.cancel()
	client.Close()
	_ = sess.Wait() // its stderr copier is done after this: stderr may be read
	if s := strings.TrimSpace(stderr.String()); s != "" {
		end += "; stderr: " + s
	}
	w.mu.Lock()
	w.end, w.ended = end, time.Now()
	w.mu.Unlock()
	_ = w.l.append(Entry{Kind: KindWorkloadEnd, Guest: w.g.Name, Seq: w.Last(), HostNs: failpoint.Now(),
		Note: fmt.Sprintf("%s after %s", end, time.Since(started).Round(time.Millisecond))})
}

// Last is the last seq journaled as acked so far.
func (w *Workload) Last() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// Acks is how many acks were journaled so far.
func (w *Workload) Acks() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acks
}

// Done is closed when the session ended (Stop, or the guest went away).
func (w *Workload) Done() <-chan struct{} { return w.done }

// WaitAcks waits until at least n acks were journaled, the session ended or
// ctx ended.
func (w *Workload) WaitAcks(ctx context.Context, n int) error {
	for w.Acks() < n {
		select {
		case <-w.done:
			return fmt.Errorf("ledger %s: workload ended after %d ack(s), wanted %d", w.g.Name, w.Acks(), n)
		case <-ctx.Done():
			return fmt.Errorf("ledger %s: workload: %d ack(s) of %d: %w", w.g.Name, w.Acks(), n, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// Stop ends the session (if the guest has not already) and waits until the
// last ack is journaled. The writer in the guest ends on its own a moment
// later (stdin EOF, or its next write fails), so markers past Last may still
// appear: unacked, they are never counted as lost.
func (w *Workload) Stop() WorkloadStats {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return WorkloadStats{Guest: w.g.Name, First: w.First, Last: w.last, Acks: w.acks, End: w.end, Err: w.err, Elapsed: w.ended.Sub(w.started)}
}

// WorkloadHistory is what the journal says about one guest's writer.
type WorkloadHistory struct {
	Guest    string
	First    int      // first seq of the first session (0: none)
	Sessions int      // writer sessions started
	BootIDs  []string // boot id of each session
	Acks     []WorkloadAck
}

// WorkloadFromJournal collects the writer history of guest from journal
// entries; a forget of the guest drops what came before it.
func WorkloadFromJournal(entries []Entry, guest string) WorkloadHistory {
	h := WorkloadHistory{Guest: guest}
	for _, e := range entries {
		if e.Guest != guest {
			continue
		}
		switch e.Kind {
		case KindForget:
			h = WorkloadHistory{Guest: guest}
		case KindWorkloadStart:
			if h.First == 0 {
				h.First = e.Seq
			}
			h.Sessions++
			h.BootIDs = append(h.BootIDs, e.BootID)
		case KindWorkloadAcks:
			h.Acks = append(h.Acks, e.Acks...)
		}
	}
	return h
}

// WorkloadListing is a guest's writer markers as it lists them.
type WorkloadListing struct {
	Disk, RAM []string
	BootID    string
}

// ListWorkload lists g's writer markers (disk and RAM) and its boot id.
func (l *Ledger) ListWorkload(ctx context.Context, g Guest) (WorkloadListing, error) {
	out, err := l.exec(ctx, g, "mkdir -p "+WorkloadDiskDir+" && ls -1 "+WorkloadDiskDir,
		"mkdir -p "+WorkloadRAMDir+" && ls -1 "+WorkloadRAMDir, "cat "+BootIDPath)
	if err != nil {
		return WorkloadListing{}, fmt.Errorf("ledger %s: list workload: %w", g.Name, err)
	}
	return WorkloadListing{Disk: listing(out[0]), RAM: listing(out[1]), BootID: strings.TrimSpace(out[2])}, nil
}

// JudgeCut lists target (restored or cloned from a snapshot of source taken
// in window w) and classifies the listing against source's journaled writer
// history. checkRAM: target's memory came from the capture.
func (l *Ledger) JudgeCut(ctx context.Context, source string, target Guest, w CutWindow, checkRAM bool) (CutVerdict, error) {
	entries, _, err := ReadJournal(l.journal)
	if err != nil {
		return CutVerdict{}, fmt.Errorf("ledger %s: judge cut: %w", target.Name, err)
	}
	ls, err := l.ListWorkload(ctx, target)
	if err != nil {
		return CutVerdict{}, err
	}
	h := WorkloadFromJournal(entries, source)
	return ClassifyCut(CutInput{Source: source, Target: target.Name, Acks: h.Acks, First: h.First, Window: w,
		Disk: ls.Disk, RAM: ls.RAM, CheckRAM: checkRAM}), nil
}
