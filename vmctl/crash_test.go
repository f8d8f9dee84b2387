package vmctl

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// crashCase SIGKILLs one verb at one failpoint (failpoint action `kill`)
// and then runs the documented converger for that verb.
type crashCase struct {
	point string
	op    string   // create | clone | save | snapshot-rm | rm | net | start | restart | stop | daemon
	verb  []string // the verb killed (setup gives VM "a" running, snapshot "base")
	// committed: the kill came after the verb's final commit, so its
	// effect must be there after convergence.
	committed bool
}

var crashCases = []crashCase{
	{"vm.create.reserved", "create", []string{"vm", "run", "--name", "x", "IMAGE"}, false},
	{"vm.create.created", "create", []string{"vm", "run", "--name", "x", "IMAGE"}, true},
	{"vm.create.committed", "create", []string{"vm", "run", "--name", "x", "IMAGE"}, true},
	{"store.commit.before-rename", "create", []string{"vm", "run", "--name", "x", "IMAGE"}, false},
	{"store.commit.after-rename", "create", []string{"vm", "run", "--name", "x", "IMAGE"}, false},
	{"vm.clone.reserved", "clone", []string{"vm", "clone", "--name", "x", "base"}, false},
	{"vm.clone.files-copied", "clone", []string{"vm", "clone", "--name", "x", "base"}, false},
	{"vm.clone.vmm-launched", "clone", []string{"vm", "clone", "--name", "x", "base"}, false},
	{"vm.clone.restored", "clone", []string{"vm", "clone", "--name", "x", "base"}, false},
	{"vm.clone.resumed", "clone", []string{"vm", "clone", "--name", "x", "base"}, false},
	{"vm.clone.committed", "clone", []string{"vm", "clone", "--name", "x", "base"}, true},
	{"snapshot.save.locked", "save", []string{"snapshot", "save", "--name", "s", "a"}, false},
	{"snapshot.save.paused", "save", []string{"snapshot", "save", "--name", "s", "a"}, false},
	{"snapshot.save.captured", "save", []string{"snapshot", "save", "--name", "s", "a"}, false},
	{"snapshot.save.resumed", "save", []string{"snapshot", "save", "--name", "s", "a"}, false},
	{"snapshot.save.unlocked", "save", []string{"snapshot", "save", "--name", "s", "a"}, false},
	{"snapshot.save.leased", "save", []string{"snapshot", "save", "--name", "s", "a"}, false},
	{"snapshot.save.pending", "save", []string{"snapshot", "save", "--name", "s", "a"}, false},
	{"snapshot.save.finalized", "save", []string{"snapshot", "save", "--name", "s", "a"}, true},
	{"store.commit.before-rename", "save", []string{"snapshot", "save", "--name", "s", "a"}, false},
	{"store.commit.after-rename", "save", []string{"snapshot", "save", "--name", "s", "a"}, false},
	{"snapshot.rm.tombstoned", "snapshot-rm", []string{"snapshot", "rm", "base"}, true},
	{"snapshot.rm.done", "snapshot-rm", []string{"snapshot", "rm", "base"}, true},
	{"vm.rm.tombstoned", "rm", []string{"vm", "rm", "--force", "a"}, true},
	{"vm.rm.vmm-stopped", "rm", []string{"vm", "rm", "--force", "a"}, true},
	{"vm.rm.done", "rm", []string{"vm", "rm", "--force", "a"}, true},
	{"vm.net.removed", "net", []string{"vm", "net", "a", "--nics", "0"}, false},
	{"vm.net.added", "net", []string{"vm", "net", "a", "--nics", "2"}, false},
	{"vm.start.locked", "restart", []string{"vm", "start", "a"}, false},
	{"vm.start.booted", "start", []string{"vm", "start", "a"}, true},
	{"vm.stop.vmm-stopped", "stop", []string{"vm", "stop", "a"}, true},
	{"daemon.pass", "daemon", []string{"daemon", "--once"}, true},
}

// TestCrashCasesCoverEveryVMCtlPoint keeps the table honest: a new vmctl
// point in the catalogue must get a crash case.
func TestCrashCasesCoverEveryVMCtlPoint(t *testing.T) {
	covered := map[string]bool{}
	for _, c := range crashCases {
		covered[c.point] = true
	}
	for _, p := range failpoint.Catalogue {
		if p.Proc == "vmctl" && !covered[p.Name] {
			t.Errorf("vmctl point %s has no crash case", p.Name)
		}
	}
}

// TestCrashSafetyAtEveryPoint: SIGKILL at each point, run the documented
// converger, then require full consistency (vmctl check: one record per name,
// no orphan VMM, no VMM left Paused, no pending record or tombstone, indexes
// consistent, store loadable) and that the surviving VMs still work.
func TestCrashSafetyAtEveryPoint(t *testing.T) {
	for _, c := range crashCases {
		t.Run(c.op+"/"+c.point, func(t *testing.T) {
			// each point has its own stack and the kill lands at the point
			// itself (no clock): two at a time (go test -parallel), as the
			// points mostly wait on the processes they start (issue 37)
			t.Parallel()
			s := newStack(t, "0.02")
			a := s.runVM("a")
			s.ok("snapshot", "save", "--name", "base", "a")
			if c.op == "start" || c.op == "restart" {
				s.ok("vm", "stop", "a")
			}
			verb := append([]string(nil), c.verb...)
			for i, v := range verb {
				if v == "IMAGE" {
					verb[i] = s.image
				}
			}
			r := s.runEnv([]string{failpoint.EnvFailpoints + "=" + c.point + "=kill"}, verb...)
			if r.signal != syscall.SIGKILL {
				t.Fatalf("%s was not killed at %s: %s", strings.Join(verb, " "), c.point, r)
			}
			t0 := time.Now()
			converge(t, s, c)
			t.Logf("converged in %s", time.Since(t0))
			s.check()
			t.Logf("checked at %s", time.Since(t0))

			// The survivors work and the names are usable again.
			if c.op == "stop" {
				if v := s.vm("a"); v.State != StateStopped || v.Reason != "unexpected-exit" {
					t.Fatalf("stopped VM after convergence: %+v", v)
				}
				s.ok("vm", "start", "a")
			}
			if c.op != "rm" {
				if v := s.vm("a"); v.State != StateRunning || v.VMMState != "Running" {
					t.Fatalf("source VM after convergence: %+v", v)
				}
				s.waitGuest("a")
			}
			switch c.op {
			case "create", "clone":
				x := findByName(s.list(), "x")
				if c.committed != (x != nil) {
					t.Fatalf("VM x present=%v, want %v", x != nil, c.committed)
				}
				if x == nil {
					s.ok("vm", "clone", "--name", "x", "base")
				}
				s.waitGuest("x")
			case "save":
				if c.committed {
					s.fails("already exists (held by", "snapshot", "save", "--name", "s", "a")
				} else {
					s.ok("snapshot", "save", "--name", "s", "a")
				}
			case "snapshot-rm":
				if len(s.snaps()) != 0 {
					t.Fatalf("snapshot survived its rm: %+v", s.snaps())
				}
			case "rm":
				if len(s.list()) != 0 {
					t.Fatalf("VM survived its rm: %+v", s.list())
				}
				if pids := s.m.findVMMs()[a.ID]; len(pids) != 0 {
					t.Fatalf("VMM of removed VM alive: %v", pids)
				}
			}
			s.check()
		})
	}
}

func findByName(vs []VM, name string) *VM {
	for i := range vs {
		if vs[i].Name == name {
			return &vs[i]
		}
	}
	return nil
}

// converge runs the documented converger of the killed verb (docs/vmctl.md).
func converge(t *testing.T, s *stack, c crashCase) {
	t.Helper()
	switch c.op {
	case "create", "clone":
		// reconcile-stale-create on every creating record.
		for _, v := range s.list() {
			if v.State != StateCreating {
				continue
			}
			var res StaleCreateResult
			if err := json.Unmarshal([]byte(s.ok("vm", "reconcile-stale-create", v.ID, "-o", "json")), &res); err != nil {
				t.Fatal(err)
			}
			if res.Outcome != OutcomeCollected {
				t.Fatalf("reconcile-stale-create %s: %+v", v.ID, res)
			}
		}
		// A created record (run killed between its created commit and its
		// start) is finished by vm start, as the agent does.
		for _, v := range s.list() {
			if v.State == StateCreated {
				s.ok("vm", "start", v.ID)
			}
		}
	case "save":
		// vm net converges the orphaned pause; snapshot rm <ID> frees a
		// pending name; gc removes a dead build's staging dir.
		s.ok("vm", "net", "a", "--nics", "1")
		for _, sn := range s.snaps() {
			if sn.State == SnapPending {
				s.ok("snapshot", "rm", sn.ID)
			}
		}
		s.ok("gc")
	case "snapshot-rm", "rm", "start", "stop":
		// One daemon pass: tombstones rolled forward, a VMM whose start
		// died before the commit adopted, a dead VMM recorded stopped.
		s.ok("daemon", "--once")
	case "restart":
		// killed before it touched anything: the same start again
		s.ok(c.verb...)
	case "net":
		s.ok(c.verb...)
		if c.verb[4] == "0" {
			s.ok("vm", "net", "a", "--nics", "1")
		}
	case "daemon":
	}
}
