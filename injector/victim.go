package injector

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/vmchaos/vmchaos/failpoint"
)

// The victims of the signal kinds, found by the rules each kind names
// (FaultKind.victim), opened as verified pidfds of processes the
// supervisor owns.

// victim is a process resolved ahead of the signal.
type victim struct{ fd *PidFD }

func (v *victim) close() {
	if v != nil && v.fd != nil {
		v.fd.Close()
	}
}

// resolveVictim finds and opens the victim of f by its kind's rule (nil
// for a kind without one: a supervisor call); hit is the trigger hit (nil
// for Inject), cfg the Arm options (nil for Inject). It runs on the trace
// reader thread between a hit and its signal: every call below is static,
// so hit does not escape.
func (in *Injector) resolveVictim(ctx context.Context, k FaultKind, f Fault, hit *Hit, cfg *armCfg) (*victim, error) {
	switch k.traits().rule {
	case victimMain:
		return in.mainVictim(ctx, f.Unit)
	case victimChild:
		return in.childVictim(ctx, f, hit)
	case victimVMM:
		vm := f.VM
		if vm == "" && hit != nil {
			vm = hit.Event.VM
		}
		return in.vmmVictim(vm)
	case victimHitter:
		return in.hitterVictim(ctx, hit, cfg)
	}
	return nil, nil
}

// hitterVictim is the process that sent hit, through cfg's Resolve when
// set, else the supervisor's HostPID vetted by Allow.
func (in *Injector) hitterVictim(ctx context.Context, hit *Hit, cfg *armCfg) (*victim, error) {
	var host int
	var err error
	if cfg != nil {
		host, err = in.hitterHost(ctx, hit, cfg.allow, cfg.resolve)
	} else {
		host, err = in.hitterHost(ctx, hit, nil, nil)
	}
	if err != nil {
		return nil, err
	}
	p, err := Identify(host)
	if err != nil {
		return nil, err
	}
	return in.open(p)
}

// hitterHost is the host pid of the process that sent hit, through resolve
// when set, else HostPID vetted by allow.
func (in *Injector) hitterHost(ctx context.Context, hit *Hit, allow func(int) error, resolve func(int) (int, error)) (int, error) {
	if hit == nil {
		return 0, fmt.Errorf("%s: no trigger hit", FaultSigkillHitter)
	}
	if resolve != nil {
		host, err := resolve(hit.Event.Pid)
		if err != nil {
			return host, fmt.Errorf("pid %d that hit %s: %w", hit.Event.Pid, hit.Event.Point, err)
		}
		return host, nil
	}
	host, err := in.sup.HostPID(ctx, hit.Event.Pid)
	if err != nil {
		return 0, fmt.Errorf("pid %d that hit %s: %w", hit.Event.Pid, hit.Event.Point, err)
	}
	if allow != nil {
		if err := allow(host); err != nil {
			return host, fmt.Errorf("pid %d (host %d) that hit %s: %w", hit.Event.Pid, host, hit.Event.Point, err)
		}
	}
	return host, nil
}

func (in *Injector) open(p Proc) (*victim, error) {
	if !in.sup.Owns(p) {
		return nil, fmt.Errorf("pid %d: %w", p.PID, ErrNotOwned)
	}
	fd, err := OpenPidFD(p)
	if err != nil {
		return nil, err
	}
	return &victim{fd: fd}, nil
}

func (in *Injector) mainVictim(ctx context.Context, unit string) (*victim, error) {
	pid, err := in.sup.MainPID(ctx, unit)
	if err != nil {
		return nil, err
	}
	if pid == 0 {
		return nil, fmt.Errorf("unit %s has no main process", unit)
	}
	p, err := Identify(pid)
	if err != nil {
		return nil, err
	}
	return in.open(p)
}

// childVictim picks the agent child to kill, judged as of the trigger hit:
// the one the hit names (agent.child.exec); else the process that sent the
// hit, when it is an agent child of the asked kind (a vmctl parked at one of
// its own points); else the latest child exec'd up to the hit that has not
// exited. Children exec'd after the hit are never picked: a restarted agent's
// next child is not the one the case meant, however late the trace reader is.
func (in *Injector) childVictim(ctx context.Context, f Fault, hit *Hit) (*victim, error) {
	var pid int
	forVM := func(e failpoint.Event) bool { return f.VM == "" || e.VM == f.VM }
	if hit != nil && hit.Event.Point == "agent.child.exec" && childMatches(hit.Event, f.Child) && forVM(hit.Event) {
		pid = childPID(hit.Event)
	}
	v := in.tr.view()
	last := v.Len() - 1
	if hit != nil && hit.Index < last {
		last = hit.Index
	}
	if pid == 0 && hit != nil && hit.Event.Proc != "nodeagent" {
		// The hitter's exec record may trail its own first datagrams
		// (the agent emits it once Start returns), so the whole view counts.
		for i := v.Len() - 1; i >= 0; i-- {
			if e := *v.at(i); e.Point == "agent.child.exec" && childPID(e) == hit.Event.Pid {
				if childMatches(e, f.Child) && forVM(e) {
					pid = hit.Event.Pid
				}
				break
			}
		}
	}
	if pid == 0 {
		exited := map[int]bool{}
		for i := v.Len() - 1; i >= 0; i-- {
			e := *v.at(i)
			switch e.Point {
			case "agent.child.exit":
				exited[childPID(e)] = true
			case "agent.child.exec":
				if c := childPID(e); i <= last && c != 0 && !exited[c] && childMatches(e, f.Child) && forVM(e) {
					pid = c
				}
			}
			if pid != 0 {
				break
			}
		}
	}
	if pid == 0 {
		return nil, fmt.Errorf("no in-flight agent child%s in the trace", map[bool]string{true: " of kind " + f.Child}[f.Child != ""])
	}
	host, err := in.sup.HostPID(ctx, pid)
	if err != nil {
		return nil, fmt.Errorf("child pid %d: %w", pid, err)
	}
	p, err := Identify(host)
	if err != nil {
		return nil, err
	}
	return in.open(p)
}

// vmmVictim finds the VM's VMM: argv[0] basename is the VMM name and an
// argument names <run>/<vm>/api.sock (the identity rule of docs/architecture.md §4.3).
func (in *Injector) vmmVictim(vm string) (*victim, error) {
	if vm == "" {
		return nil, fmt.Errorf("sigkill-vmm: no VM id (set Fault.VM or trigger on a hit that carries vm)")
	}
	want := "/" + vm + "/api.sock"
	for _, pid := range allPIDs() {
		argv := cmdline(pid)
		if len(argv) == 0 || filepath.Base(argv[0]) != in.opt.VMMName {
			continue
		}
		for _, a := range argv[1:] {
			if strings.HasSuffix(a, want) || strings.Contains(a, want+",") {
				p, err := Identify(pid)
				if err != nil {
					return nil, err
				}
				return in.open(p)
			}
		}
	}
	return nil, fmt.Errorf("sigkill-vmm: no %s process with %s in its arguments", in.opt.VMMName, want)
}

// childPID reads attrs.child_pid (a JSON number).
func childPID(e failpoint.Event) int {
	switch v := e.Attrs["child_pid"].(type) {
	case float64:
		return int(v)
	case int:
		return v
	case json.Number:
		n, _ := v.Int64()
		return int(n)
	}
	return 0
}

// ChildKind names an agent child by its argv: the leading non-flag words after
// the binary joined by "-" ("vmctl snapshot save --name x vm" → "snapshot-save").
func ChildKind(argv []string) string {
	var words []string
	for _, a := range argv[min(1, len(argv)):] {
		if strings.HasPrefix(a, "-") || len(words) == 2 {
			break
		}
		words = append(words, a)
	}
	return strings.Join(words, "-")
}

func eventArgv(e failpoint.Event) []string {
	raw, _ := e.Attrs["argv"].([]any)
	out := make([]string, 0, len(raw))
	for _, a := range raw {
		s, _ := a.(string)
		out = append(out, s)
	}
	return out
}

func childMatches(e failpoint.Event, kind string) bool {
	if kind == "" {
		return true
	}
	k := ChildKind(eventArgv(e))
	return k == kind || strings.HasPrefix(k, kind+"-")
}

func childExitMatch(kind, vm string) func(*failpoint.Event) bool {
	return func(e *failpoint.Event) bool {
		return e.Point == "agent.child.exit" && (vm == "" || e.VM == vm) && childMatches(*e, kind)
	}
}
