package runner

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A broken product fails fast (issue #37 item 4): when the agent's unit
// crash-loops, the verdict that it did not serve again is certain long
// before the 60 s the harness would wait for it, and the case ends at once
// with the same verdict and evidence.

// crashLoopLimit is the agent unit's restart limit as the harness judges
// it: this many consecutive starts that each ended with the same fatal
// error before serving. The unit's Restart=always would go on restarting
// it forever (StartLimitIntervalSec=0), but an agent that failed the same
// way three times in a row on state nothing else changes will fail the
// fourth time too.
const crashLoopLimit = 3

// errCrashLoop marks a wait that ended on a crash-looping agent.
var errCrashLoop = errors.New("crash-looped past its restart limit")

// fatalPrefix is how cmd/nodeagent reports the error it exits with, one
// line per incarnation in the unit's log.
const fatalPrefix = "Error: "

// agentLog is the agent unit's log, every incarnation appended
// (scenarios/stack: the unit's LogPath).
func (cr *caseRun) agentLog() string { return filepath.Join(cr.st.LogDir, "nodeagent.log") }

// logSize is the size of the file at p (0 when it does not exist yet).
func logSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// crashLoop reads the agent log from offset and reports the fatal error
// its last crashLoopLimit incarnations all exited with, when they did.
// Any line other than a fatal one between them (an incarnation that got
// further) breaks the run of identical exits.
func crashLoop(path string, offset int64) (string, int, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, false
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return "", 0, false
	}
	last, run := "", 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		msg, fatal := strings.CutPrefix(line, fatalPrefix)
		switch {
		case !fatal:
			if strings.Contains(line, "nodeagent started") {
				last, run = "", 0 // this incarnation came up
			}
		case msg == last:
			run++
		default:
			last, run = msg, 1
		}
	}
	return last, run, run >= crashLoopLimit
}

// waitServing waits up to limit until the agent answers again, like
// st.Agent.WaitUp, but ends as soon as the agent crash-loops: the error
// then names the loop, its fatal error and how many starts had it.
func (cr *caseRun) waitServing(ctx context.Context, limit time.Duration) error {
	log := cr.agentLog()
	from := logSize(log)
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	up := make(chan error, 1)
	go func() { up <- cr.st.Agent.WaitUp(wctx) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-up:
			return err
		case <-tick.C:
			if msg, n, loop := crashLoop(log, from); loop {
				cancel()
				<-up
				return fmt.Errorf("the agent's unit %s %w: its last %d starts each exited with %q (%s); the verdict is certain, so the case does not wait out the %s it allows",
					cr.st.AgentUnit, errCrashLoop, n, msg, filepath.Base(log), limit)
			}
		}
	}
}
