package stack

import (
	"os"
	"testing"
)

// TestCocoonVerbsAreTheAgentsVerbsInFlight: the agent's cocoon children at
// every stage (the wrapper's shell, nsenter, cocoon) are verbs in flight;
// its event stream, the harness's own reads and the VMMs are not.
func TestCocoonVerbsAreTheAgentsVerbsInFlight(t *testing.T) {
	s := &Stack{opts: Options{Cocoon: &CocoonOptions{Bin: "/peers/cocoon"}}, cocoonNet: &cocoonNet{wrapper: "/tmp/vmchaos-x/c1/cocoon-in-ns"}}
	agent := 4242
	procs := []Proc{
		{PID: 1, PPID: agent, Argv: []string{"/bin/sh", "/tmp/vmchaos-x/c1/cocoon-in-ns", "vm", "clone", "--name", "web", "base"}},
		{PID: 2, PPID: agent, Argv: []string{"nsenter", "--target", "7", "--net", "--mount", "--", "/peers/cocoon", "vm", "inspect", "web"}},
		{PID: 3, PPID: agent, Argv: []string{"/peers/cocoon", "snapshot", "save", "--name", "web", "ID"}},
		{PID: 4, PPID: agent, Argv: []string{"/peers/cocoon", "vm", "status", "--event", "--format", "json", "--interval", "1"}},
		{PID: 5, PPID: os.Getpid(), Argv: []string{"/peers/cocoon", "vm", "list", "--format", "json"}},
		{PID: 6, PPID: 1, Argv: []string{"/tmp/vmchaos-x/c1/bin/cloud-hypervisor", "--api-socket", "/tmp/vmchaos-x/c1/cocoon/run/cloudhypervisor/ID/api.sock"}},
	}
	var got []int
	for _, p := range s.CocoonVerbs(procs) {
		got = append(got, p.PID)
	}
	if len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Fatalf("verbs in flight: pids %v, want 1 2 3", got)
	}
	if v := (&Stack{}).CocoonVerbs(procs); v != nil {
		t.Fatalf("a vmctl stack has no cocoon verbs: %v", v)
	}
}
