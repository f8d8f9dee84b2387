package vmctl

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
)

func TestAdapterCommandsAndEvents(t *testing.T) {
	a := New(manager.Options{Bin: "/b/vmctl", Dir: "/tmp/s", VMMDir: "/b", Image: "/i/guest.img", Env: []string{"VMCHAOS_TIME_SCALE=0.05"}})
	for _, tc := range []struct {
		call manager.Call
		want string
	}{
		{manager.Call{Verb: manager.VerbCreate, Name: "src"}, "/b/vmctl vm run --name src --nics 0 -o json /i/guest.img"},
		{manager.Call{Verb: manager.VerbClone, Snapshot: "base", Name: "tgt"}, "/b/vmctl vm clone --name tgt -o json base"},
		{manager.Call{Verb: manager.VerbRecoverStale, VM: "tgt"}, "/b/vmctl vm reconcile-stale-create tgt -o json"},
		{manager.Call{Verb: manager.VerbRm, VM: "src"}, "/b/vmctl vm rm --force src"},
	} {
		argv, err := a.Command(tc.call)
		if err != nil || strings.Join(argv, " ") != tc.want {
			t.Errorf("%s: %q %v, want %q", tc.call, strings.Join(argv, " "), err, tc.want)
		}
	}
	if _, err := a.Command(manager.Call{Verb: manager.VerbRestore, VM: "x", Snapshot: "y"}); !errors.Is(err, manager.ErrNotSupported) {
		t.Fatalf("restore: %v, want ErrNotSupported (vmctl has no in-place restore)", err)
	}
	env := strings.Join(a.Env(), "\n")
	for _, want := range []string{"PATH=/b:", "VMCTL_ROOT_DIR=/tmp/s/root", "VMCTL_CH_BINARY=/b/cloud-hypervisor", "VMCHAOS_TIME_SCALE=0.05"} {
		if !strings.Contains(env, want) {
			t.Errorf("env lacks %s:\n%s", want, env)
		}
	}
	e, err := a.ParseEvent([]byte(`{"event":"MODIFIED","vm":{"id":"ABC","name":"src","state":"stopped (stale)","pid":12}}`))
	if err != nil || e != (manager.Event{Type: "MODIFIED", ID: "ABC", Name: "src", State: "stopped (stale)"}) {
		t.Fatalf("event %+v %v", e, err)
	}
	if _, err := a.ParseEvent([]byte(`{"event":"MODIFIED","vm":{}}`)); err == nil {
		t.Fatal("an event without a vm id was accepted")
	}
}

// vmctl reports its full table: every verb it maps, restore missing with
// why, and its features (net, exec, check) present.
func TestCapabilitiesFullTable(t *testing.T) {
	a := New(manager.Options{Bin: "/x/vmctl", Dir: t.TempDir()})
	c, err := manager.CapabilitiesOf(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, it := range c.Missing() {
		missing = append(missing, it.Name)
	}
	if want := []string{string(manager.VerbRestore), manager.FeatureCNIDirs}; !reflect.DeepEqual(missing, want) {
		t.Fatalf("missing %q, want %q", missing, want)
	}
	for _, n := range []string{string(manager.VerbRecoverStale), manager.FeatureNIC, manager.FeatureGuestExec, manager.FeatureCheck} {
		if ok, why := c.Supports(n); !ok {
			t.Errorf("%s: %s", n, why)
		}
	}
	if it, _ := c.Get(string(manager.VerbRecoverStale)); it.How != "vmctl vm reconcile-stale-create VM -o json" {
		t.Errorf("recover-stale how %q", it.How)
	}
}
