package stack

import (
	"os"
	"path/filepath"
	"testing"
)

// TestInRootResolvesLinksInsideTheRoot: /var/run → /run under another
// root must lead to that root's /run, as the process there sees it.
func TestInRootResolvesLinksInsideTheRoot(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"run/netns", "var"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/run", filepath.Join(root, "var", "run")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../run", filepath.Join(root, "rel")); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"/var/run/netns/cocoon-X": root + "/run/netns/cocoon-X",
		"/rel/netns":              root + "/run/netns",
		"/run/netns":              root + "/run/netns",
	} {
		if got, err := inRoot(root, in); err != nil || got != want {
			t.Errorf("inRoot(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	if err := os.Symlink("loop", filepath.Join(root, "loop")); err != nil {
		t.Fatal(err)
	}
	if _, err := inRoot(root, "/loop/x"); err == nil {
		t.Error("a symlink loop resolved")
	}
	if _, err := inRoot(root, "relative"); err == nil {
		t.Error("a relative path resolved")
	}
}

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
