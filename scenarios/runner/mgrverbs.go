package runner

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
)

// Points the runner adds to a manager case's trace for the verb under test
// (a manager's verb emits no trace of its own): its window for the one
// landing judgement.
const (
	mgrVerbStarted = "mgr.verb.started"
	mgrVerbExited  = "mgr.verb.exited"
)

// verbResult is one finished verb.
type verbResult struct {
	call manager.Call
	code int // -1: killed by a signal
	err  error
	dur  time.Duration
	log  string
	tail string
}

func (v verbResult) String() string {
	if v.err == nil {
		return fmt.Sprintf("%s: ok in %s", v.call, v.dur.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s: %v: %s", v.call, v.err, v.tail)
}

// running is a verb the runner started; exit delivers its exit code once
// (-1 when a signal killed it) and exitNs is when the runner saw it exit.
type running struct {
	cmd    *exec.Cmd
	log    string
	exit   chan int
	exitNs int64
}

// startVerb starts a verb as a child of the runner, logging into the case's
// logs dir.
func (mc *mgrCase) startVerb(call manager.Call) (*running, error) {
	argv, err := mc.m.Command(call)
	if err != nil {
		return nil, err
	}
	mc.seq++
	logPath := filepath.Join(mc.caseDir, "logs", fmt.Sprintf("%02d-%s.log", mc.seq, call.Verb))
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "$ %s\n", strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = mc.m.Env()
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", call, err)
	}
	mc.timeline = append(mc.timeline, reports.TimelineEvent{TsNs: failpoint.Now(), Kind: "phase", Proc: mc.m.Name(),
		Point: string(call.Verb), Note: strings.Join(argv[1:], " ")})
	rv := &running{cmd: cmd, log: logPath, exit: make(chan int, 1)}
	go func() {
		err := cmd.Wait()
		rv.exitNs = failpoint.Now()
		f.Close()
		code := 0
		if err != nil {
			code = -1
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() >= 0 {
				code = ee.ExitCode()
			}
		}
		rv.exit <- code
	}()
	return rv, nil
}

// verb runs a call to completion (bounded).
func (mc *mgrCase) verb(ctx context.Context, call manager.Call) verbResult {
	res := verbResult{call: call}
	t0 := time.Now()
	rv, err := mc.startVerb(call)
	if err != nil {
		res.err = err
		return res
	}
	res.log = rv.log
	code, err := rv.wait(ctx, 2*time.Minute)
	res.dur, res.code = time.Since(t0), code
	if err != nil {
		res.err = err
	} else if code != 0 {
		res.err = fmt.Errorf("exit %d", code)
	}
	if res.err != nil {
		res.tail = logTail(rv.log, 3)
	}
	return res
}

// wait waits for the verb's exit, killing it after limit.
func (rv *running) wait(ctx context.Context, limit time.Duration) (int, error) {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case code := <-rv.exit:
		rv.exit <- code // keep it readable for a second wait
		return code, nil
	case <-ctx.Done():
	case <-t.C:
	}
	_ = rv.cmd.Process.Kill()
	return -1, fmt.Errorf("%s: no exit after %s", strings.Join(rv.cmd.Args, " "), limit)
}

// ansi matches terminal colour sequences (cocoon colours its log lines
// even into a file).
var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

// logTail is what a failed verb said: its last "Error" line when it
// printed one (cocoon logs every step before it), else its last n lines.
func logTail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(ansi.ReplaceAllString(string(b), "")), "\n")
	if len(lines) > 1 && strings.HasPrefix(lines[0], "$ ") {
		lines = lines[1:] // the command line, already in the call
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "Error") {
			return lines[i]
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// event is one event-stream line with the time the harness read it.
type event struct {
	ns int64
	ev manager.Event
}

// mgrEvents is the manager's event stream, running for the whole case.
type mgrEvents struct {
	rv   *running
	mu   sync.Mutex
	evs  []event
	bad  []string
	done chan struct{}
}

func (mc *mgrCase) startEvents() (*mgrEvents, error) {
	argv := mc.m.EventCommand()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = mc.m.Env()
	errf, err := os.Create(filepath.Join(mc.caseDir, "logs", "event-stream.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = errf
	out, err := cmd.StdoutPipe()
	if err != nil {
		errf.Close()
		return nil, err
	}
	raw, err := os.Create(filepath.Join(mc.caseDir, "events.jsonl"))
	if err != nil {
		errf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		errf.Close()
		raw.Close()
		return nil, fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	es := &mgrEvents{rv: &running{cmd: cmd, exit: make(chan int, 1)}, done: make(chan struct{})}
	go func() {
		defer close(es.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			ns := failpoint.Now()
			line := sc.Bytes()
			fmt.Fprintf(raw, "%s\n", line)
			ev, err := mc.m.ParseEvent(line)
			es.mu.Lock()
			if err != nil {
				es.bad = append(es.bad, err.Error())
			} else {
				es.evs = append(es.evs, event{ns: ns, ev: ev})
			}
			es.mu.Unlock()
		}
		err := cmd.Wait()
		raw.Close()
		errf.Close()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		es.rv.exit <- code
	}()
	return es, nil
}

func (es *mgrEvents) since(ns int64) []event {
	es.mu.Lock()
	defer es.mu.Unlock()
	var out []event
	for _, e := range es.evs {
		if e.ns >= ns {
			out = append(out, e)
		}
	}
	return out
}

// unparsable is the stream's lines its adapter could not decode.
func (es *mgrEvents) unparsable() []string {
	es.mu.Lock()
	defer es.mu.Unlock()
	return append([]string(nil), es.bad...)
}

func (es *mgrEvents) describe(ns int64) string {
	var parts []string
	for _, e := range es.since(ns) {
		parts = append(parts, fmt.Sprintf("%s %s %q", e.ev.Type, e.ev.Name, e.ev.State))
	}
	if bad := es.unparsable(); len(bad) > 0 {
		parts = append(parts, fmt.Sprintf("%d unparsable line(s), first: %s", len(bad), bad[0]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

// exited reports whether the stream's process is gone, with its code.
func (es *mgrEvents) exited() (int, bool) {
	select {
	case <-es.done:
		code := <-es.rv.exit
		es.rv.exit <- code
		return code, true
	default:
		return 0, false
	}
}

func (es *mgrEvents) stop() {
	if es == nil {
		return
	}
	_ = es.rv.cmd.Process.Kill()
	<-es.done
}
