package vmctl

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
)

// canned answers each verb with fixed stdout and error.
func canned(out map[string]string, errs map[string]error) Exec {
	return func(_ context.Context, args ...string) ([]byte, error) {
		k := strings.Join(args, " ")
		return []byte(out[k]), errs[k]
	}
}

func TestVMsReadsStatePidAndAddress(t *testing.T) {
	o := NewObserver(canned(map[string]string{
		"vm list -o json": `[{"id":"A1","name":"a","state":"running","pid":42,"network":[{"id":"n1","mac":"52:54:00:00:00:01","ip":"127.1.0.2","ssh_port":2222}],"ejecting":["n0"]},
		                     {"id":"B1","name":"b","state":"stopped (stale)","network":[]}]`,
	}, nil), "/r", "/run")
	vms, err := o.VMs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []manager.VM{{ID: "A1", Name: "a", State: "running", PID: 42, Address: "127.1.0.2:2222",
		NICs: []manager.NIC{{ID: "n1", MAC: "52:54:00:00:00:01"}}, Ejecting: []string{"n0"}},
		{ID: "B1", Name: "b", State: manager.StateStale}}
	if !reflect.DeepEqual(vms, want) {
		t.Fatalf("vms = %+v", vms)
	}
}

// TestListErrorsAreReturned: a failed or garbled list is an error, never an
// empty list (an empty list would make "no pending snapshot" hold).
func TestListErrorsAreReturned(t *testing.T) {
	boom := errors.New("exit 1: Error: index corrupt")
	for name, ex := range map[string]Exec{
		"verb fails": canned(nil, map[string]error{"vm list -o json": boom, "snapshot list -o json": boom}),
		"garbled":    canned(map[string]string{"vm list -o json": `[{"id":`, "snapshot list -o json": `{}`}, nil),
		"no id":      canned(map[string]string{"vm list -o json": `[{"name":"a"}]`, "snapshot list -o json": `[{"name":"s"}]`}, nil),
	} {
		o := NewObserver(ex, "/r", "/run")
		if vms, err := o.VMs(context.Background()); err == nil {
			t.Errorf("%s: VMs = %v, nil error", name, vms)
		}
		if ss, err := o.Snapshots(context.Background()); err == nil {
			t.Errorf("%s: Snapshots = %v, nil error", name, ss)
		}
	}
}

func TestCheckReadsAReportWithViolationsDespiteExit1(t *testing.T) {
	exit1 := errors.New("exit 1")
	rep := `{"ok":false,"violations":[{"invariant":"no-leftover-staging","evidence":"staging dir X without a live builder"}]}`
	o := NewObserver(canned(map[string]string{"check": rep}, map[string]error{"check": exit1}), "/r", "/run")
	got, err := o.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ev := got.Of(manager.CheckLeftoverStaging); len(ev) != 1 || !strings.Contains(ev[0], "staging dir X") {
		t.Fatalf("report = %+v", got)
	}
	for name, c := range map[string]struct {
		out string
		err error
	}{
		"verb died, no report":  {"", exit1},
		"ok but exit 1":         {`{"ok":true,"violations":[]}`, exit1},
		"violations but exit 0": {rep, nil},
		"no violations field":   {`{"ok":true}`, nil},
		"ok with a violation":   {`{"ok":true,"violations":[{"invariant":"x","evidence":"y"}]}`, nil},
		"garbage":               {`Error: unknown command`, exit1},
	} {
		o := NewObserver(canned(map[string]string{"check": c.out}, map[string]error{"check": c.err}), "/r", "/run")
		if r, err := o.Check(context.Background()); err == nil {
			t.Errorf("%s: report %+v, nil error", name, r)
		}
	}
}

func TestVMMOfMatchesOnlyThisStoresAPISocket(t *testing.T) {
	o := NewObserver(nil, "/r", "/x/run")
	for _, c := range []struct {
		argv []string
		id   string
		ok   bool
	}{
		{[]string{"/bin/cloud-hypervisor", "--api-socket", "path=/x/run/A1/api.sock"}, "A1", true},
		{[]string{"cloud-hypervisor", "--api-socket", "/x/run/B2/api.sock"}, "B2", true},
		{[]string{"/bin/cloud-hypervisor", "--api-socket", "path=/y/run/A1/api.sock"}, "", false},
		{[]string{"/bin/cloud-hypervisor", "--serial", "file=/x/run/A1/serial.log"}, "", false},
		{[]string{"/bin/vmctl", "vm", "clone", "/x/run/A1/api.sock"}, "", false},
		{nil, "", false},
	} {
		id, ok := o.VMMOf(c.argv)
		if id != c.id || ok != c.ok {
			t.Errorf("VMMOf(%q) = %q %v, want %q %v", c.argv, id, ok, c.id, c.ok)
		}
	}
}

func TestAPISocketsListsPresentSockets(t *testing.T) {
	run := t.TempDir()
	for _, id := range []string{"A1", "B2"} {
		if err := os.MkdirAll(filepath.Join(run, id), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(run, "A1", "api.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	o := NewObserver(nil, "/r", run)
	got, err := o.APISockets()
	if err != nil || len(got) != 1 || got["A1"] != filepath.Join(run, "A1", "api.sock") {
		t.Fatalf("APISockets = %v, %v", got, err)
	}
	if o.OpsLockPath("A1") != "/r/locks/vm/A1.lock" || o.LeasePath("S1") != "/r/snapshots/S1.lease" {
		t.Fatal("lock paths do not follow docs/architecture.md §4.1")
	}
}

// TestReadStoreIsTheThreeVerbs: `vmctl observe` read through ReadStore
// gives the same VMs, snapshots and check report as the three verbs (a
// report with violations included), and the same errors where a verb's
// answer is missing or garbled: one exec, never a weaker read.
func TestReadStoreIsTheThreeVerbs(t *testing.T) {
	vms := `[{"id":"A1","name":"a","state":"running","pid":42,"network":[{"id":"n1","mac":"m","ip":"127.1.0.2","ssh_port":2222}]}]`
	snaps := `[{"id":"S1","name":"base","state":"ready","vm_id":"","dir":"/d"}]`
	rep := `{"ok":false,"violations":[{"invariant":"no-leftover-staging","evidence":"X"}]}`
	three := NewObserver(canned(map[string]string{"vm list -o json": vms, "snapshot list -o json": snaps, "check": rep},
		map[string]error{"check": errors.New("exit 1")}), "/r", "/run")
	one := NewObserver(canned(map[string]string{"observe": `{"vms":` + vms + `,"snapshots":` + snaps + `,"check":` + rep + `}`}, nil), "/r", "/run").WithObserveVerb()
	want := manager.ReadStore(context.Background(), three, true)
	if _, ok := three.ReadStore(context.Background(), true); ok {
		t.Fatal("an Observer without WithObserveVerb read with observe")
	}
	got, ok := one.ReadStore(context.Background(), true)
	if !ok || !reflect.DeepEqual(got, want) || want.VMsErr != nil || want.SnapsErr != nil || want.CheckErr != nil || len(got.VMs) != 1 || len(got.Check.Violations) != 1 {
		t.Fatalf("observe read %+v (ok %v), the three verbs %+v", got, ok, want)
	}
	if got := manager.ReadStore(context.Background(), one, true); !reflect.DeepEqual(got, want) {
		t.Fatalf("manager.ReadStore did not take the one call: %+v", got)
	}
}

// TestReadStoreMissingDataIsAnError: a list absent without its error, a
// record without an id, a check report without ok/violations or
// contradicting itself, a failed exec: each is that source's error, never
// an empty store.
func TestReadStoreMissingDataIsAnError(t *testing.T) {
	boom := errors.New("exit 1: Error: unknown command \"observe\"")
	okRep := `{"ok":true,"violations":[]}`
	for name, c := range map[string]struct {
		out            string
		err            error
		vms, snaps, ck bool // which sources must fail
	}{
		"exec fails":          {"", boom, true, true, true},
		"garbled":             {`{"vms":[`, nil, true, true, true},
		"no vms":              {`{"snapshots":[],"check":` + okRep + `}`, nil, true, false, false},
		"vms null":            {`{"vms":null,"snapshots":[],"check":` + okRep + `}`, nil, true, false, false},
		"vms error":           {`{"vms":null,"vms_error":"index corrupt","snapshots":[],"check":` + okRep + `}`, nil, true, false, false},
		"snapshot without id": {`{"vms":[],"snapshots":[{"name":"s"}],"check":` + okRep + `}`, nil, false, true, false},
		"no check":            {`{"vms":[],"snapshots":[]}`, nil, false, false, true},
		"check without ok":    {`{"vms":[],"snapshots":[],"check":{"violations":[]}}`, nil, false, false, true},
		"ok with a violation": {`{"vms":[],"snapshots":[],"check":{"ok":true,"violations":[{"invariant":"x","evidence":"y"}]}}`, nil, false, false, true},
	} {
		o := NewObserver(canned(map[string]string{"observe": c.out}, map[string]error{"observe": c.err}), "/r", "/run").WithObserveVerb()
		st, ok := o.ReadStore(context.Background(), true)
		if !ok || (st.VMsErr != nil) != c.vms || (st.SnapsErr != nil) != c.snaps || (st.CheckErr != nil) != c.ck {
			t.Errorf("%s: errors vms=%v snaps=%v check=%v", name, st.VMsErr, st.SnapsErr, st.CheckErr)
		}
	}
	// --check=false: no report asked, none required
	o := NewObserver(canned(map[string]string{"observe --check=false": `{"vms":[],"snapshots":[]}`}, nil), "/r", "/run").WithObserveVerb()
	if st, ok := o.ReadStore(context.Background(), false); !ok || st.VMsErr != nil || st.SnapsErr != nil || st.CheckErr != nil {
		t.Fatalf("observe --check=false: %+v", st)
	}
}
