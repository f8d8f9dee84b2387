package stack

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"github.com/vmchaos/vmchaos/failpoint"
	vmctlapi "github.com/vmchaos/vmchaos/vmctl/api"
)

// Event is one line of the event stream, stamped when the harness read it.
type Event struct {
	TsNs int64
	vmctlapi.StatusEvent
}

// Observer runs `vmctl vm status --event --format json -n SECONDS` (with the
// stack's regress switches: the event stream is under test) and keeps every
// event with the time it arrived.
type Observer struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	events []Event
	out    io.Closer
	done   chan struct{}
}

// StartObserver starts the event-stream observer with interval seconds
// (vmctl scales them by the time scale).
func (s *Stack) StartObserver(interval float64) (*Observer, error) {
	cmd := s.vmctlCmd(context.Background(), "vm", "status", "--event", "--format", "json",
		"-n", strconv.FormatFloat(interval, 'g', -1, 64))
	cmd.Env = s.StackEnv("")
	logf, err := os.Create(filepath.Join(s.LogDir, "observer.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	// its own process group: in a sandbox the vmctl is nsenter's child,
	// and Stop must reach both
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	o := &Observer{cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		defer logf.Close()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			ts := failpoint.Now()
			logf.Write(append(append([]byte{}, sc.Bytes()...), '\n'))
			var ev vmctlapi.StatusEvent
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			o.mu.Lock()
			o.events = append(o.events, Event{TsNs: ts, StatusEvent: ev})
			o.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	s.Observer = o
	return o, nil
}

// Events returns what the observer saw so far.
func (o *Observer) Events() []Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]Event(nil), o.events...)
}

// Alive reports whether the observer process still runs.
func (o *Observer) Alive() bool {
	select {
	case <-o.done:
		return false
	default:
		return true
	}
}

// Stop kills the observer and waits for it.
func (o *Observer) Stop() {
	if o.cmd.Process != nil {
		_ = syscall.Kill(-o.cmd.Process.Pid, syscall.SIGKILL)
	}
	_ = o.out.Close()
	<-o.done
}
