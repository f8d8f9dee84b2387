// Package progress keeps a run's progress in view: done/total, the verdicts
// so far, elapsed time and an ETA from the measured case durations. On a
// terminal it is one live line, redrawn every second and kept below the
// per-case lines; elsewhere (CI logs) it is a summary line every 30 s.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/reports"
)

// LogEvery is how often a meter that is not on a terminal prints a line.
const LogEvery = 30 * time.Second

// Meter counts finished cases. It is the io.Writer the runner prints its
// per-case lines to, so that on a terminal the live line is cleared before
// each of them and drawn again below it.
type Meter struct {
	out   io.Writer
	tty   bool
	every time.Duration // redraw (tty) or log (not) interval
	now   func() time.Time

	mu      sync.Mutex
	label   string
	total   int
	workers int
	start   time.Time
	done    int
	counts  map[string]int
	sum     time.Duration // of the finished cases' durations
	shown   bool          // the live line is on screen
	stop    chan struct{}
	stopped chan struct{}
}

// New returns a meter writing to out; it is live when out is a terminal.
func New(out io.Writer) *Meter {
	tty := isTerminal(out)
	every := LogEvery
	if tty {
		every = time.Second
	}
	return &Meter{out: out, tty: tty, every: every, now: time.Now, counts: map[string]int{}}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// Start begins showing progress of total cases run workers at a time.
// Calling it again (a second phase) keeps the counts and sets a new total.
func (m *Meter) Start(label string, total, workers int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.label, m.total, m.workers = label, total, max(workers, 1)
	if m.stop != nil {
		return
	}
	m.start = m.now()
	m.stop, m.stopped = make(chan struct{}), make(chan struct{})
	go m.tick(m.stop, m.stopped)
}

// tick redraws the live line (tty) or logs a summary line; Stop ends it.
func (m *Meter) tick(stop <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	t := time.NewTicker(m.every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			m.mu.Lock()
			if m.tty {
				m.draw()
			} else {
				fmt.Fprintln(m.out, "progress: "+m.line())
			}
			m.mu.Unlock()
		}
	}
}

// Stop ends the live line (leaving the last state on screen as a line of
// its own) or, off a terminal, prints the final summary line.
func (m *Meter) Stop() {
	if m == nil {
		return
	}
	m.mu.Lock()
	stop, stopped := m.stop, m.stopped
	m.stop = nil
	m.mu.Unlock()
	if stop == nil {
		return
	}
	close(stop)
	<-stopped
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tty {
		m.draw()
		fmt.Fprintln(m.out)
		m.shown = false
	} else {
		fmt.Fprintln(m.out, "progress: "+m.line())
	}
}

// Case records a finished case (runner.Options.Done).
func (m *Meter) Case(c reports.Case) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.done++
	v := c.Verdict
	switch v {
	case reports.Pass, reports.Fail, reports.Inconclusive, reports.Error:
	default:
		v = "other"
	}
	m.counts[v]++
	m.sum += time.Duration(c.DurationMs * float64(time.Millisecond))
	if m.tty && m.stop != nil {
		m.draw()
	}
}

// Write passes the runner's per-case lines through, above the live line.
func (m *Meter) Write(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tty && m.shown {
		fmt.Fprint(m.out, "\r\x1b[K")
		m.shown = false
	}
	n, err := m.out.Write(p)
	if m.tty && m.stop != nil && strings.HasSuffix(string(p), "\n") {
		m.draw()
	}
	return n, err
}

// draw rewrites the live line in place; m.mu is held.
func (m *Meter) draw() {
	fmt.Fprint(m.out, "\r\x1b[K"+m.line())
	m.shown = true
}

// line is the status text; m.mu is held.
func (m *Meter) line() string {
	elapsed := m.now().Sub(m.start)
	s := fmt.Sprintf("%s %d/%d", m.label, m.done, m.total)
	var vs []string
	for _, v := range []string{reports.Pass, reports.Fail, reports.Inconclusive, reports.Error, "other"} {
		if n := m.counts[v]; n > 0 || v == reports.Pass || v == reports.Fail || v == reports.Inconclusive {
			vs = append(vs, fmt.Sprintf("%d %s", n, v))
		}
	}
	s += " | " + strings.Join(vs, " ") + " | elapsed " + Round(elapsed)
	if eta, ok := m.eta(); ok {
		s += " | ETA " + Round(eta)
	} else if m.done < m.total {
		s += " | ETA ? (no case finished yet)"
	}
	return s
}

// eta is the mean measured case duration times the cases left, shared
// among the workers; m.mu is held.
func (m *Meter) eta() (time.Duration, bool) {
	if m.done == 0 {
		return 0, false
	}
	left := m.total - m.done
	if left <= 0 {
		return 0, true
	}
	per := m.sum / time.Duration(m.done)
	return per * time.Duration(left) / time.Duration(m.workers), true
}

// Round shows a duration to the second (to 0.1 s under 10 s).
func Round(d time.Duration) string {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
