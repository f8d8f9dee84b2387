// Package failpoint marks named phases inside vmctl, nodeagent and fakech.
//
// Every component calls Hit at each named phase. With nothing configured a hit
// costs one atomic load. With VMCHAOS_TRACE set, each hit sends one JSON
// datagram (Event) to the harness's trace socket before any action runs, so the
// harness sees the phase even when the action kills the process. With
// VMCHAOS_FAILPOINTS set, a hit may pause, sleep, exit, SIGKILL itself or make
// its call site return an error.
package failpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Environment variables read by Init.
const (
	EnvTrace      = "VMCHAOS_TRACE"
	EnvFailpoints = "VMCHAOS_FAILPOINTS"
	EnvCtl        = "VMCHAOS_FAILPOINT_CTL"
)

// Attrs are extra fields of a hit. The keys "vm" and "op" are lifted into the
// event's top-level fields.
type Attrs map[string]any

// Event is one trace datagram.
type Event struct {
	TsNs int64 `json:"ts_ns"`
	// Seq numbers the datagrams of one emitting process from 1, so the
	// harness detects a lost datagram instead of assuming none was lost
	// (0: an emitter that predates it).
	Seq   uint64         `json:"seq,omitempty"`
	Pid   int            `json:"pid"`
	Proc  string         `json:"proc"`
	Point string         `json:"point"`
	VM    string         `json:"vm,omitempty"`
	Op    string         `json:"op,omitempty"`
	Attrs map[string]any `json:"attrs,omitempty"`
}

// ParseEvent decodes one trace datagram and checks the fields the harness
// relies on.
func ParseEvent(b []byte) (Event, error) {
	var e Event
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("trace datagram: %w", err)
	}
	if e.Point == "" || e.Proc == "" || e.Pid <= 0 || e.TsNs <= 0 {
		return e, fmt.Errorf("trace datagram: missing point, proc, pid or ts_ns")
	}
	return e, nil
}

// Now returns CLOCK_MONOTONIC in ns: system-wide, so timestamps from different
// processes compare directly.
func Now() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

type opKey struct{}

// WithOp tags ctx with an operation id that every hit under it reports.
func WithOp(ctx context.Context, op string) context.Context {
	return context.WithValue(ctx, opKey{}, op)
}

// OpFrom returns the operation id set by WithOp.
func OpFrom(ctx context.Context) string {
	s, _ := ctx.Value(opKey{}).(string)
	return s
}

// state is the configured behaviour; nil when disabled.
type state struct {
	proc    string
	pid     int
	trace   *net.UnixConn
	ctlDir  string
	actions map[string][]*rule
	seq     uint64    // last datagram sequence number; under sendMu
	firstNs int64     // ts_ns of datagram #1 (0: none sent yet); under sendMu
	timer   *sigTimer // fires signal(SIG,DELAY) actions; nil without any
}

var (
	enabled atomic.Bool
	current atomic.Pointer[state]
	sendMu  sync.Mutex
)

// Enabled reports whether any trace or action is configured; callers that
// build expensive Attrs may check it first.
func Enabled() bool { return enabled.Load() }

// Init configures the package from the environment for a process called proc
// ("vmctl", "nodeagent", "fakech"). A malformed VMCHAOS_FAILPOINTS is an
// error: a scenario that asked for an action must not silently run without it.
func Init(proc string) error {
	return Configure(proc, os.Getenv(EnvTrace), os.Getenv(EnvFailpoints), os.Getenv(EnvCtl))
}

// Configure sets the trace socket, the action spec and the control dir.
func Configure(proc, tracePath, spec, ctlDir string) error {
	rules, err := ParseSpec(spec)
	if err != nil {
		return err
	}
	st := &state{proc: proc, pid: os.Getpid(), ctlDir: ctlDir, actions: map[string][]*rule{}}
	for _, r := range rules {
		if r.action == actPause && ctlDir == "" {
			return fmt.Errorf("%s: %s=pause needs %s", EnvFailpoints, r.point, EnvCtl)
		}
		if r.once != "" && ctlDir == "" {
			return fmt.Errorf("%s: %s: once= needs %s (where the token is claimed)", EnvFailpoints, r.point, EnvCtl)
		}
		st.actions[r.point] = append(st.actions[r.point], r)
	}
	for _, r := range rules {
		if r.action == actSignal && r.delay > 0 {
			if st.timer, err = startSigTimer(st); err != nil {
				return err
			}
			break
		}
	}
	if tracePath != "" {
		// A missing harness socket must not break the stack under test:
		// the hit still runs its action, the datagram is dropped. But the
		// harness must learn that this process sends nothing: a judgement
		// that reads the trace would take its silence for "no such phase".
		c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: tracePath, Net: "unixgram"})
		if err == nil {
			st.trace = c
		} else {
			reportDialFailure(st, tracePath, err)
		}
	}
	if old := current.Swap(st); old != nil {
		old.close()
	}
	enabled.Store(st.trace != nil || len(st.actions) > 0)
	return nil
}

// Reset disables the package (tests).
func Reset() {
	enabled.Store(false)
	if old := current.Swap(nil); old != nil {
		old.close()
	}
}

func (st *state) close() {
	if st.timer != nil {
		st.timer.stop()
	}
	if st.trace != nil {
		st.trace.Close()
	}
}

// Hit marks the named phase. It returns a non-nil error only for an
// `error(msg)` action (or when a paused point's ctx ends); the call site
// returns it as the operation's error.
func Hit(ctx context.Context, name string, attrs Attrs) error {
	if !enabled.Load() {
		return nil
	}
	return hit(ctx, name, attrs)
}

func hit(ctx context.Context, name string, attrs Attrs) error {
	st := current.Load()
	if st == nil {
		return nil
	}
	vm, _ := attrs["vm"].(string)
	op, _ := attrs["op"].(string)
	if op == "" && ctx != nil {
		op = OpFrom(ctx)
	}
	// The action is chosen before the datagram leaves: a delayed signal is
	// armed at the stamp (see send), so a thread preempted after the write
	// does not delay it.
	var act *rule
	for _, r := range st.actions[name] {
		if r.vm != "" && r.vm != vm {
			continue
		}
		if r.limit > 0 && r.hits.Add(1) > int64(r.limit) {
			continue
		}
		// A one-shot action is claimed before the stamp (the claim's
		// syscalls are then not part of its delay); a claim taken by
		// another process means this one goes on as if unconfigured.
		if r.once != "" && !claimOnce(st.ctlDir, r.once) {
			continue
		}
		act = r
		break
	}
	var armed func(ts int64, seq uint64)
	if act != nil && act.action == actSignal && act.delay > 0 && st.timer != nil {
		armed = func(ts int64, seq uint64) {
			st.timer.arm(&pendingSignal{point: name, vm: vm, op: op, once: act.once, sig: act.sig, hitSeq: seq, hitNs: ts, delay: act.delay,
				due: ts + int64(act.delay)})
		}
	}
	if act != nil && act.action == actSignal && act.delay == 0 {
		defer urgent()()
	}
	var ts int64
	var seq uint64
	if st.trace != nil {
		ev := Event{Pid: st.pid, Proc: st.proc, Point: name, VM: vm, Op: op} // stamped by send
		if len(attrs) > 0 {
			ev.Attrs = make(map[string]any, len(attrs))
			for k, v := range attrs {
				if k != "vm" && k != "op" {
					ev.Attrs[k] = v
				}
			}
		}
		ts = st.sendArmed(&ev, armed)
		seq = ev.Seq
	} else {
		ts = Now()
		if armed != nil {
			armed(ts, 0)
		}
	}
	if act != nil && armed == nil {
		return act.run(ctx, st, name, vm, op, seq, ts)
	}
	return nil
}

// send writes one datagram. The number is taken and the datagram written
// under one lock, so a process's datagrams leave (and, on a unixgram socket,
// arrive) in seq order; a failed write still uses its number and shows as a
// gap.
//
// An event without TsNs is stamped here, after it was encoded and right
// before the write: the stamp says the phase was reached (it was, a few µs
// earlier), and a thread preempted between stamp and write delays the
// datagram past its own stamp, so the window is kept to the write. It
// returns the stamp.
func (st *state) send(ev *Event) int64 { return st.sendArmed(ev, nil) }

// sendArmed is send that calls armed(stamp, seq), when set, between the
// stamp and the write.
func (st *state) sendArmed(ev *Event, armed func(ts int64, seq uint64)) int64 {
	sendMu.Lock()
	defer sendMu.Unlock()
	st.seq++
	ev.Seq = st.seq
	stamp := ev.TsNs == 0
	if st.seq == 1 {
		// the trace end (Close) names this stream by its first stamp
		defer func() { st.firstNs = ev.TsNs }()
	}
	b, err := json.Marshal(ev)
	if err != nil {
		if stamp {
			ev.TsNs = Now()
		}
		if armed != nil {
			armed(ev.TsNs, ev.Seq)
		}
		return ev.TsNs
	}
	if stamp {
		// ts_ns is the first field: `{"ts_ns":0,` becomes `{"ts_ns":<now>,`.
		// The buffer is made before the stamp: an allocation after it can
		// start a GC cycle or an assist in this process, between stamp and write.
		rest := b[len(`{"ts_ns":0`):]
		out := append(make([]byte, 0, len(b)+20), `{"ts_ns":`...)
		ev.TsNs = Now()
		b = append(strconv.AppendInt(out, ev.TsNs, 10), rest...)
	}
	if armed != nil {
		armed(ev.TsNs, ev.Seq)
	}
	_, _ = st.trace.Write(b)
	return ev.TsNs
}

type actionKind int

const (
	actPause actionKind = iota + 1
	actSleep
	actExit
	actKill
	actError
	actSignal
)

type rule struct {
	point  string
	action actionKind
	arg    int
	msg    string
	limit  int
	vm     string
	sig    syscall.Signal // signal(SIG,DELAY)
	delay  time.Duration  // signal(SIG,DELAY)
	once   string         // signal(SIG,DELAY,once=TOKEN): see OnceClaimFile
	hits   atomic.Int64
}

// ErrPauseCancelled is returned by a paused point whose context ended before
// it was released.
var ErrPauseCancelled = errors.New("failpoint: pause cancelled")

func (r *rule) run(ctx context.Context, st *state, name, vm, op string, hitSeq uint64, hitNs int64) error {
	switch r.action {
	case actSignal:
		// The operation goes on; the fault comes DELAY after the hit.
		signalAction(st, &pendingSignal{point: name, vm: vm, op: op, once: r.once, sig: r.sig, hitSeq: hitSeq, hitNs: hitNs, delay: r.delay})
	case actSleep:
		time.Sleep(time.Duration(r.arg) * time.Millisecond)
	case actExit:
		// a clean exit: the trace end says how many datagrams were sent
		Close()
		os.Exit(r.arg)
	case actKill:
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never returns: the kernel delivers SIGKILL
	case actError:
		return errors.New(r.msg)
	case actPause:
		return park(ctx, st.ctlDir, name)
	}
	return nil
}

// Park parks the calling goroutine at name as a pause action does (dir is
// the control dir): for a process that marks its phases without the
// package's configuration, the harness's own ledger writer
// (runner/ledgerpark.go), whose runs share one process.
func Park(ctx context.Context, dir, name string) error { return park(ctx, dir, name) }

// park announces itself with <ctl>/<name>.paused (holding our pid) and blocks
// until <ctl>/<name>.release appears.
func park(ctx context.Context, dir, name string) error {
	paused := filepath.Join(dir, name+".paused")
	release := filepath.Join(dir, name+".release")
	if err := os.WriteFile(paused, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("failpoint %s: pause: %w", name, err)
	}
	done := context.Background().Done()
	if ctx != nil {
		done = ctx.Done()
	}
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for i := 1; ; i++ {
		if _, err := os.Stat(release); err == nil {
			return nil
		}
		// A harness arming a new park clears stale control files; if it
		// cleared ours while we were already parked, announce again, or it
		// would wait for a park that never shows and we would never be
		// released.
		if i%20 == 0 {
			if _, err := os.Stat(paused); os.IsNotExist(err) {
				_ = os.WriteFile(paused, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644)
			}
		}
		select {
		case <-done:
			return ErrPauseCancelled
		case <-t.C:
		}
	}
}

// ParseSpec parses "name=action;name=action". Actions: pause, sleep(ms),
// exit(code), kill, error(msg), signal(SIG,DELAY), the last four with an
// optional once=TOKEN as their last argument; each optionally prefixed
// "N*" and suffixed "@vm=<id>".
func ParseSpec(spec string) ([]*rule, error) {
	var out []*rule
	for _, part := range strings.Split(spec, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		r, err := parseRule(part)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// parseRule parses one "name=[N*]action[@vm=<id>]".
func parseRule(part string) (*rule, error) {
	name, act, ok := strings.Cut(part, "=")
	name, act = strings.TrimSpace(name), strings.TrimSpace(act)
	if !ok || name == "" || act == "" {
		return nil, fmt.Errorf("%s: %q: want name=action", EnvFailpoints, part)
	}
	r := &rule{point: name}
	// "@vm=" is a suffix only after the action's closing paren, so an
	// error message may contain it.
	if i := strings.LastIndex(act, "@vm="); i >= 0 && i > strings.LastIndex(act, ")") {
		r.vm = act[i+4:]
		act = act[:i]
		if r.vm == "" {
			return nil, fmt.Errorf("%s: %q: empty @vm=", EnvFailpoints, part)
		}
	}
	// "N*" is a count only when N is all digits, so an error message may
	// contain '*'.
	if n, rest, ok := strings.Cut(act, "*"); ok && n != "" && strings.Trim(n, "0123456789") == "" {
		var lim int
		if _, err := fmt.Sscanf(n, "%d", &lim); err != nil || lim <= 0 || fmt.Sprint(lim) != n {
			return nil, fmt.Errorf("%s: %q: bad count %q", EnvFailpoints, part, n)
		}
		r.limit, act = lim, rest
	}
	if err := r.parseAction(part, act); err != nil {
		return nil, err
	}
	return r, nil
}

// parseAction sets r's action from act, one of pause, kill, sleep(ms),
// exit(code[,once=TOKEN]), signal(SIG,DELAY[,once=TOKEN]),
// error(msg[,once=TOKEN]), kill(once=TOKEN); part is the
// whole rule, for errors.
func (r *rule) parseAction(part, act string) error {
	verb, arg, hasArg := strings.Cut(act, "(")
	if hasArg {
		if !strings.HasSuffix(arg, ")") {
			return fmt.Errorf("%s: %q: unclosed (", EnvFailpoints, part)
		}
		arg = strings.TrimSuffix(arg, ")")
	}
	// kill, exit and error take once=TOKEN as their last argument, like
	// signal: a restarted victim (or the next vmctl child) gets the same
	// environment, so without it the action fires again at every
	// incarnation's hit and the stack can never converge.
	if verb == "kill" || verb == "exit" || verb == "error" {
		var err error
		if arg, hasArg, err = r.cutOnce(part, arg, hasArg); err != nil {
			return err
		}
	}
	num := func() error {
		var v int
		if _, err := fmt.Sscanf(arg, "%d", &v); err != nil || fmt.Sprint(v) != arg || v < 0 {
			return fmt.Errorf("%s: %q: want a non-negative integer in ()", EnvFailpoints, part)
		}
		r.arg = v
		return nil
	}
	switch {
	case verb == "pause" && !hasArg:
		r.action = actPause
	case verb == "kill" && !hasArg:
		r.action = actKill
	case verb == "sleep" && hasArg:
		r.action = actSleep
		return num()
	case verb == "exit" && hasArg:
		r.action = actExit
		if err := num(); err != nil {
			return err
		}
		if r.arg > 255 {
			return fmt.Errorf("%s: %q: exit code > 255", EnvFailpoints, part)
		}
	case verb == "signal" && hasArg:
		r.action = actSignal
		var err error
		if r.sig, r.delay, r.once, err = parseSignalArg(arg); err != nil {
			return fmt.Errorf("%s: %q: %w", EnvFailpoints, part, err)
		}
	case verb == "error" && hasArg:
		r.action = actError
		r.msg = arg
		if r.msg == "" {
			r.msg = "failpoint " + r.point
		}
	default:
		return fmt.Errorf("%s: %q: unknown action %q (want pause, sleep(ms), exit(code), kill, error(msg), signal(SIG,DELAY))", EnvFailpoints, part, act)
	}
	return nil
}

// cutOnce takes a trailing "once=TOKEN" (alone, or after a comma) off a
// kill, exit or error argument into r.once; hasArg is false when nothing is
// left (kill(once=T) is kill).
func (r *rule) cutOnce(part, arg string, hasArg bool) (string, bool, error) {
	if !hasArg {
		return arg, false, nil
	}
	rest, tail := "", arg
	if i := strings.LastIndex(arg, ","); i >= 0 {
		rest, tail = arg[:i], arg[i+1:]
	}
	k, tok, ok := strings.Cut(strings.TrimSpace(tail), "=")
	if !ok || k != "once" {
		return arg, true, nil
	}
	if !validToken(tok) {
		return "", false, fmt.Errorf("%s: %q: want once=TOKEN (1-64 of A-Za-z0-9_-)", EnvFailpoints, part)
	}
	r.once = tok
	return rest, rest != "", nil
}

// Release releases a parked point by creating <dir>/<name>.release.
func Release(dir, name string) error {
	return os.WriteFile(filepath.Join(dir, name+".release"), nil, 0o644)
}

// WaitParked waits until <dir>/<name>.paused exists and returns the pid in it.
func WaitParked(ctx context.Context, dir, name string) (int, error) {
	p := filepath.Join(dir, name+".paused")
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		if b, err := os.ReadFile(p); err == nil {
			var pid int
			if _, err := fmt.Sscanf(string(b), "%d", &pid); err == nil {
				return pid, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("failpoint %s: not parked: %w", name, ctx.Err())
		case <-t.C:
		}
	}
}
