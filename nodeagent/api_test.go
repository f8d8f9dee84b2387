package nodeagent_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/vmctl"
)

// TestAPIRejectsBadRequestsWithoutWriting: bad JSON, unknown VM and
// conflicting intents get a 4xx with a clear JSON message, and nothing is
// written (the record file is byte-for-byte unchanged).
func TestAPIRejectsBadRequestsWithoutWriting(t *testing.T) {
	s := newStack(t)
	s.readyVM("web", nil)
	recFile := filepath.Join(s.state, "vms", "web.json")
	before, err := os.ReadFile(recFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, path string
		body               any
		code               int
		want               string
	}{
		{"bad json", "PUT", "/v1/vms/web", `{"snapshot":`, 400, "bad JSON"},
		{"unknown field", "PUT", "/v1/vms/web", `{"snapshot":"x","hibernat":true}`, 400, "unknown field"},
		{"trailing data", "PUT", "/v1/vms/web", `{"snapshot":"x"} {}`, 400, "trailing data"},
		{"missing snapshot", "PUT", "/v1/vms/web", `{"hibernate":true}`, 400, "snapshot"},
		{"bad name", "PUT", "/v1/vms/bad..name", `{"snapshot":"x"}`, 400, "invalid vm name"},
		{"own name as source", "PUT", "/v1/vms/web", `{"snapshot":"web"}`, 400, "reserved"},
		{"unknown vm get", "GET", "/v1/vms/nope", nil, 404, `unknown vm "nope"`},
		{"unknown vm delete", "DELETE", "/v1/vms/nope", nil, 404, `unknown vm "nope"`},
		{"source change", "PUT", "/v1/vms/web", nodeagent.Intent{Snapshot: "other"}, 409, "cannot change"},
		{"new vm hibernated", "PUT", "/v1/vms/fresh", nodeagent.Intent{Snapshot: s.base, Hibernate: true}, 409, "create it with hibernate=false first"},
		{"method", "POST", "/v1/vms/web", nil, 405, "method not allowed"},
		{"endpoint", "GET", "/v2/things", nil, 404, "no such endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, b, err := s.api(tc.method, tc.path, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			var e nodeagent.APIError
			if code != tc.code || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error, tc.want) {
				t.Fatalf("got %d %s, want %d with %q", code, b, tc.code, tc.want)
			}
		})
	}
	after, _ := os.ReadFile(recFile)
	if !bytes.Equal(before, after) {
		t.Fatalf("a rejected request changed the record:\n%s\n%s", before, after)
	}
	if _, ok := s.get("fresh"); ok {
		t.Fatal("a rejected create left a record")
	}

	// hibernate before ready: a create still in flight refuses it.
	s.signalAgent(syscall.SIGTERM)
	s.startAgent(fp("vm.clone.files-copied=pause"))
	s.waitAPI()
	s.put("db", nodeagent.Intent{Snapshot: s.base})
	s.parked("vm.clone.files-copied")
	code, b, _ := s.api("PUT", "/v1/vms/db", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
	if code != 409 || !strings.Contains(string(b), "not ready yet") {
		t.Fatalf("hibernate before ready: %d %s", code, b)
	}
	s.release("vm.clone.files-copied")
	v := s.waitGoal("db", nodeagent.LifecycleReady, budget)
	if v.Generation != 1 {
		t.Fatalf("a refused PUT bumped the generation: %d", v.Generation)
	}
	// An identical PUT is not a change.
	if v2 := s.put("db", nodeagent.Intent{Snapshot: s.base}); v2.Generation != 1 {
		t.Fatalf("identical PUT bumped the generation to %d", v2.Generation)
	}
}

// TestResumeClaimRejectsConcurrentOperation (what held up): a change to a VM
// whose resumed operation is in flight is refused with a clear 409 and
// succeeds once the operation finished.
func TestResumeClaimRejectsConcurrentOperation(t *testing.T) {
	s := newStack(t)
	s.readyVM("web", nil)
	s.signalAgent(syscall.SIGTERM)
	s.startAgent(fp("agent.hibernate.begin=pause"))
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
	s.parked("agent.hibernate.begin")
	s.killAgent()
	// The restarted agent resumes the hibernate; its first vmctl child
	// parks, so the resumed operation stays in flight.
	s.startAgent(fp("vm.net.removed=pause"))
	s.waitAPI()
	s.parked("vm.net.removed")
	want := fmt.Sprintf(nodeagent.MsgResumeInFlight, "web")
	for _, req := range []struct {
		method string
		body   any
	}{{"PUT", nodeagent.Intent{Snapshot: s.base}}, {"DELETE", nil}} {
		code, b, _ := s.api(req.method, "/v1/vms/web", req.body)
		if code != 409 || !strings.Contains(string(b), want) {
			t.Fatalf("%s inside the claim: %d %s", req.method, code, b)
		}
	}
	s.release("vm.net.removed")
	s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
	// The claim ends when the resumed pass returns, a moment after it
	// wrote its goal: a counter-intent in that moment is still refused, and
	// succeeds on retry once released (seed 001, "what held up").
	s.eventually("the claim released", budget, func() error {
		code, b, err := s.api("PUT", "/v1/vms/web", nodeagent.Intent{Snapshot: s.base})
		if err != nil || code/100 != 2 {
			if code == 409 && strings.Contains(string(b), want) {
				return fmt.Errorf("still claimed: %s", b)
			}
			t.Fatalf("PUT web after the claim: %d %s %v", code, b, err)
		}
		return nil
	})
	s.waitGoal("web", nodeagent.LifecycleReady, budget)
}

// TestMetricsNeverDecreaseAcrossSIGKILL: counters scraped before a SIGKILL
// and after the restart never went backwards; with the historical
// process-local metrics they reset.
func TestMetricsNeverDecreaseAcrossSIGKILL(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       []string
		wantReset bool
	}{
		{"fixed", nil, false},
		{"bug-metrics-process-local", bug("metrics-process-local"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t)
			s.readyVM("web", tc.env)
			s.put("web", nodeagent.Intent{Snapshot: s.base, Hibernate: true})
			s.waitGoal("web", nodeagent.LifecycleHibernated, budget)
			before := s.scrape()
			s.killAgent()
			s.startAgent(tc.env)
			s.waitAPI()
			after := s.scrape()
			var decreased []string
			for name, series := range before {
				for k, v := range series {
					if after[name][k] < v {
						decreased = append(decreased, fmt.Sprintf("%s %v→%v", k, v, after[name][k]))
					}
				}
			}
			if tc.wantReset != (len(decreased) > 0) {
				t.Fatalf("decreased series: %v (want reset: %v)", decreased, tc.wantReset)
			}
			if !tc.wantReset && before["nodeagent_hibernate_total"][`nodeagent_hibernate_total{phase="snapshot",result="ok"}`] != 1 {
				t.Fatalf("hibernate_total not counted: %v", before["nodeagent_hibernate_total"])
			}
		})
	}
}

// TestWatcherRestartsDeadVM: the VMM of a ready VM is kill -9'd; the event
// watcher sees it stopped (stale) and the agent boots it again.
func TestWatcherRestartsDeadVM(t *testing.T) {
	s := newStack(t)
	v := s.readyVM("web", nil)
	vm := s.vmByName("web")
	_ = syscall.Kill(vm.Pid, syscall.SIGKILL)
	s.waitDead(vm.Pid, "VMM")
	s.eventually("VM booted again", budget, func() error {
		cur := s.vmByName("web")
		if cur == nil || cur.State != vmctl.StateRunning || cur.Pid == vm.Pid {
			return fmt.Errorf("%+v", cur)
		}
		w, _ := s.get("web")
		if w.Status.Lifecycle != nodeagent.LifecycleReady || w.Op != "" {
			return fmt.Errorf("lifecycle %q op %q", w.Status.Lifecycle, w.Op)
		}
		return nil
	})
	if _, err := s.guest(v.Status.VMID, "hostname"); err != nil {
		t.Fatalf("guest not reachable after the restart: %v", err)
	}
}

// TestStartupAdoptsManyWithBoundedFanout (what held up): several VMs survive
// a SIGKILL of the agent and are adopted, not re-created, by the restart.
func TestStartupAdoptsManyWithBoundedFanout(t *testing.T) {
	s := newStack(t)
	s.startAgent(nil, "--startup-fanout", "2")
	s.waitAPI()
	const n = 5
	for i := 0; i < n; i++ {
		s.put(fmt.Sprintf("vm%d", i), nodeagent.Intent{Snapshot: s.base})
	}
	ids := map[string]string{}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("vm%d", i)
		ids[name] = s.waitGoal(name, nodeagent.LifecycleReady, budget).Status.VMID
	}
	s.killAgent()
	start := time.Now()
	s.startAgent(nil, "--startup-fanout", "2")
	s.waitAPI()
	t.Logf("restart to API serving with %d intents: %v", n, time.Since(start))
	for name, id := range ids {
		if v := s.waitGoal(name, nodeagent.LifecycleReady, budget); v.Status.VMID != id {
			t.Fatalf("%s re-created: %s → %s", name, id, v.Status.VMID)
		}
	}
	if vms := s.vms(); len(vms) != n {
		t.Fatalf("want %d VMs, got %d", n, len(vms))
	}
}

// TestReadyVMLostWhileAgentDown: while the agent is down one ready VM's VMM
// is kill -9'd and another VM is removed behind its back; the restart checks
// ready VMs against the listing and brings both back.
func TestReadyVMLostWhileAgentDown(t *testing.T) {
	s := newStack(t)
	s.readyVM("web", nil)
	s.put("db", nodeagent.Intent{Snapshot: s.base})
	db := s.waitGoal("db", nodeagent.LifecycleReady, budget)
	s.killAgent()
	web := s.vmByName("web")
	_ = syscall.Kill(web.Pid, syscall.SIGKILL)
	s.waitDead(web.Pid, "VMM")
	s.vmctl("vm", "rm", "--force", db.Status.VMID)
	s.startAgent(nil)
	s.waitAPI()
	for _, name := range []string{"web", "db"} {
		s.eventually(name+" running again", budget, func() error {
			v, _ := s.get(name)
			vm := s.vmByName(name)
			if v.Status.Lifecycle != nodeagent.LifecycleReady || v.Op != "" || vm == nil || vm.State != vmctl.StateRunning || vm.ID != v.Status.VMID {
				return fmt.Errorf("%q op %q vm %+v", v.Status.Lifecycle, v.Op, vm)
			}
			if _, err := s.guest(vm.ID, "hostname"); err != nil {
				return err
			}
			return nil
		})
	}
}

// TestSdNotifyReady: under systemd (NOTIFY_SOCKET) the agent sends READY=1
// once its API serves.
func TestSdNotifyReady(t *testing.T) {
	s := newStack(t)
	sock := filepath.Join(s.dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s.startAgent([]string{"NOTIFY_SOCKET=" + sock})
	_ = conn.SetReadDeadline(time.Now().Add(budget))
	buf := make([]byte, 4096)
	n, _, err := conn.ReadFromUnix(buf)
	if err != nil || !strings.Contains(string(buf[:n]), "READY=1") {
		t.Fatalf("no READY=1: %q %v", buf[:n], err)
	}
	if _, _, err := s.api("GET", "/v1/vms", nil); err != nil {
		t.Fatalf("READY=1 before the API serves: %v", err)
	}
}
