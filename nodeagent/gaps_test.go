package nodeagent_test

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/nodeagent"
)

// traceSink collects the trace datagrams of the stack's processes.
type traceSink struct {
	mu     sync.Mutex
	events []failpoint.Event
}

// listenTrace opens a trace socket in the stack dir and returns the env
// entry that points the stack at it.
func (s *stack) listenTrace() (*traceSink, []string) {
	s.t.Helper()
	path := filepath.Join(s.dir, "trace.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		s.t.Fatal(err)
	}
	sink := &traceSink{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1<<16)
		for {
			n, err := c.Read(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				continue
			}
			if e, err := failpoint.ParseEvent(buf[:n]); err == nil {
				sink.mu.Lock()
				sink.events = append(sink.events, e)
				sink.mu.Unlock()
			}
		}
	}()
	s.t.Cleanup(func() { c.Close(); <-done })
	return sink, []string{failpoint.EnvTrace + "=" + path}
}

// childRuns returns the agent's children in exec order: argv by child pid,
// and the argv each one's exit event carried.
func (ts *traceSink) childRuns() (execs [][]string, exits map[int][]string, err error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	byPid := map[int][]string{}
	exits = map[int][]string{}
	for _, e := range ts.events {
		// exec and exit only: agent.child.vm-died is the watcher child's
		// report, no run of a child
		if e.Proc != "nodeagent" || (e.Point != "agent.child.exec" && e.Point != "agent.child.exit") {
			continue
		}
		pid, argv, err := childAttrs(e)
		if err != nil {
			return nil, nil, err
		}
		if e.Point == "agent.child.exec" {
			byPid[pid] = argv
			execs = append(execs, argv)
		} else {
			exits[pid] = argv
		}
	}
	for pid, argv := range exits {
		if want, ok := byPid[pid]; ok && !slices.Equal(argv, want) {
			return nil, nil, fmt.Errorf("child %d: exit argv %q, exec argv %q", pid, argv, want)
		}
	}
	return execs, exits, nil
}

func childAttrs(e failpoint.Event) (int, []string, error) {
	pid, ok := e.Attrs["child_pid"].(float64)
	if !ok {
		return 0, nil, fmt.Errorf("%s without child_pid: %v", e.Point, e.Attrs)
	}
	raw, ok := e.Attrs["argv"].([]any)
	if !ok {
		return 0, nil, fmt.Errorf("%s without argv: %v", e.Point, e.Attrs)
	}
	argv := make([]string, len(raw))
	for i, a := range raw {
		if argv[i], ok = a.(string); !ok {
			return 0, nil, fmt.Errorf("%s: argv %v is not strings", e.Point, raw)
		}
	}
	return int(pid), argv, nil
}

// TestHibernateStartsTheVMFirst (seed 001 #2): a fresh hibernate runs
// `vm start ID` (which converges an orphaned pause under the ops lock)
// before the DHCP release that a Paused guest could not answer. The child
// exit events carry the same argv as the exec events, so an injector can
// match a child's exit by its kind.
func TestHibernateStartsTheVMFirst(t *testing.T) {
	s := newStack(t)
	sink, env := s.listenTrace()
	v := s.readyVM("web", env)
	id := v.Status.VMID
	s.put("web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
	s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
	execs, exits, err := sink.childRuns()
	if err != nil {
		t.Fatal(err)
	}
	if len(exits) == 0 {
		t.Fatal("no agent.child.exit event")
	}
	start, release := -1, -1
	for i, argv := range execs {
		args := argv[1:]
		if slices.Equal(args, []string{"vm", "start", id}) && start < 0 && release < 0 {
			start = i
		}
		if slices.Contains(args, "dhclient") && release < 0 {
			release = i
		}
	}
	if release < 0 {
		t.Fatalf("no DHCP release child among %q", execs)
	}
	if start < 0 {
		t.Fatalf("the hibernate did not run vm start %s before the DHCP release: %q", id, execs)
	}
}

// TestDeleteFinishesInterruptedDeleteByName: creates whose clone failed and
// whose cleanup rm died after its tombstone leave tombstones (and VMMs)
// named like the VM but no bound id; the delete rolls them forward through
// `vm rm --force NAME` instead of skipping on "not found".
func TestDeleteFinishesInterruptedDeleteByName(t *testing.T) {
	s := newStack(t)
	s.startAgent(fp("vm.clone.vmm-launched=error(injected);vm.rm.tombstoned=kill"), "--retry-attempts", "1")
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	s.eventually("create failed", budget, func() error {
		v, ok := s.get("web")
		if !ok || v.Status.Lifecycle != nodeagent.LifecycleFailed || v.Status.VMID != "" {
			return fmt.Errorf("not failed without a VM yet: %+v", v)
		}
		return nil
	})
	if _, _, err := s.vmctlResult("check"); err == nil {
		t.Fatal("fault did not land: no tombstone left by the killed cleanup")
	}
	if code, b, _ := s.api("DELETE", "/v1/vms/web", nil); code != 202 {
		t.Fatalf("DELETE: %d %s", code, b)
	}
	s.waitGone("web", budget)
	if vms := s.vms(); len(vms) != 0 {
		t.Fatalf("VMs left: %+v", vms)
	}
	s.checkStore() // no tombstone, no VMM left by the killed cleanups
}
