package vmctl

import (
	"encoding/json"
	"reflect"
	"syscall"
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/vmctl/api"
)

// TestObserveIsTheThreeVerbs: `vmctl observe` prints what `vm list -o
// json`, `snapshot list -o json` and `check` print — on a clean store and on
// one with a violation — so a poller that reads it instead of the three
// verbs sees the same store.
func TestObserveIsTheThreeVerbs(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	s.ok("snapshot", "save", "--name", "c", "a")
	s.same(true)
	// a save killed mid-capture leaves a staging dir: check's violation
	// must come through observe as data
	if r := s.runEnv([]string{failpoint.EnvFailpoints + "=snapshot.save.captured=kill"}, "snapshot", "save", "--name", "d", "a"); r.signal != syscall.SIGKILL {
		t.Fatal(r)
	}
	if o := s.same(false); o.Check.OK || len(o.Check.Violations) == 0 {
		t.Fatalf("observe's check hides the dead build's staging: %+v", o.Check)
	}
	var o api.Observation
	if err := json.Unmarshal([]byte(s.ok("observe", "--check=false")), &o); err != nil || o.Check != nil || o.VMs == nil {
		t.Fatalf("observe --check=false: %+v, %v", o, err)
	}
}

// same requires observe to equal the three verbs' outputs (check exiting
// 0 when wantOK) and returns it.
func (s *stack) same(wantOK bool) api.Observation {
	s.t.Helper()
	var o api.Observation
	if err := json.Unmarshal([]byte(s.ok("observe")), &o); err != nil {
		s.t.Fatalf("observe: %v", err)
	}
	var vms []*api.VM
	var snaps []*api.Snapshot
	var rep api.CheckReport
	if err := json.Unmarshal([]byte(s.ok("vm", "list", "-o", "json")), &vms); err != nil {
		s.t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(s.ok("snapshot", "list", "-o", "json")), &snaps); err != nil {
		s.t.Fatal(err)
	}
	r := s.run("check")
	if (r.code == 0) != wantOK {
		s.t.Fatalf("check: %s", r)
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		s.t.Fatal(err)
	}
	if o.VMsError != "" || o.SnapshotsError != "" || o.Check == nil {
		s.t.Fatalf("observe: %+v", o)
	}
	// a VM record's updated_at or a VMM state may move between two reads
	// of a live store only if something runs; nothing does here
	if !reflect.DeepEqual(o.VMs, vms) || !reflect.DeepEqual(o.Snapshots, snaps) || !reflect.DeepEqual(*o.Check, rep) {
		s.t.Fatalf("observe differs from the three verbs:\nobserve %s\nverbs   %s", mustJSON(o), mustJSON(api.Observation{VMs: vms, Snapshots: snaps, Check: &rep}))
	}
	if len(o.VMs) == 0 || len(o.Snapshots) == 0 {
		s.t.Fatalf("observe read an empty store: %+v", o)
	}
	return o
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
