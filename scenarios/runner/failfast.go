package runner

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/onsi/gomega"
	"github.com/vmchaos/vmchaos/scenarios/checker"
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

// retriesExhausted is what the agent's status message says once it gave up
// on an intent for its generation (nodeagent's fail: automatic retries
// exhausted, waiting for a new PUT): a terminal error the product reports.
const retriesExhausted = "automatic retries exhausted"

// failFast is the convergence phase's watch for a certain verdict: the
// agent log's offset when the phase began, and why it stopped early.
type failFast struct {
	logFrom int64
	started bool
	certain string
}

// terminalIntent names an intent whose goal the agent reported it will no
// longer pursue: failed with its retries exhausted. The agent counts
// retries per generation and a PUT resets them, and every PUT of the case
// was acknowledged before this phase, so the message is about the
// generation the harness asked for. Nothing in the convergence phase PUTs
// an intent again, so its goal cannot be reached within the budget; ""
// when none.
func terminalIntent(in *checker.Input, p *checker.Poll) string {
	names := make([]string, 0, len(in.Goals))
	for n := range in.Goals {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		v, ok := p.Views[name]
		if !ok || in.Goals[name] == checker.GoalDeleted || v.Lifecycle != "failed" || in.Goals[name] == v.Lifecycle {
			continue
		}
		if strings.Contains(v.Message, retriesExhausted) {
			return fmt.Sprintf("the agent reported a terminal error for %s: %s", name, v.Message)
		}
	}
	return ""
}

// stopIfCertain ends the convergence poll at once (Gomega's StopTrying)
// when its failure is already certain: the agent crash-looped since the
// phase began, or reported an intent it gave up on. The poll's last
// invariants are the verdict's evidence either way; only the wait goes.
func (cr *caseRun) stopIfCertain(in *checker.Input, p *checker.Poll) {
	if !cr.ff.started {
		cr.ff.started, cr.ff.logFrom = true, logSize(cr.agentLog())
	}
	why := terminalIntent(in, p)
	if msg, n, loop := crashLoop(cr.agentLog(), cr.ff.logFrom); loop {
		why = fmt.Sprintf("the agent's unit %s %v: its last %d starts each exited with %q", cr.st.AgentUnit, errCrashLoop, n, msg)
	}
	if why != "" {
		cr.ff.certain = why + "; the verdict is certain, so the case did not wait out its budget"
		gomega.StopTrying(cr.ff.certain).Now()
	}
}
