package cocoon

import (
	"errors"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
)

// The bundled agent's verbs over each build (issue 33): the argv shape, every
// flag on that verb's page, and ErrNotSupported with the probe's reason for
// the two verbs cocoon lacks.
func TestEmbedderCommandsPerBuild(t *testing.T) {
	zero := 0
	want := map[string]map[manager.Verb]string{
		"head": {manager.VerbClone: "vm clone --name w --nics 0 --output json SNAP"},
		"v03":  {manager.VerbClone: "vm clone --name w --nics 0 SNAP"},
		"v02":  {manager.VerbClone: "vm clone --name w --nics 0 SNAP"},
	}
	for _, b := range builds {
		a := recorded(t, b, manager.Options{Bin: "/x/cocoon"})
		for _, tc := range []struct {
			c    manager.Call
			want string
		}{
			{manager.Call{Verb: manager.VerbClone, Name: "w", Snapshot: "SNAP", NICs: &zero}, want[b][manager.VerbClone]},
			{manager.Call{Verb: manager.VerbInspect, VM: "ID1"}, "vm inspect ID1"},
			{manager.Call{Verb: manager.VerbList}, "vm list --format json"},
			{manager.Call{Verb: manager.VerbSnapshotList}, "snapshot list --format json"},
			{manager.Call{Verb: manager.VerbExport, Snapshot: "SNAP", File: "/r/f"}, "snapshot export SNAP --output /r/f"},
			{manager.Call{Verb: manager.VerbImport, Name: "w", File: "/r/f"}, "snapshot import --name w /r/f"},
			{manager.Call{Verb: manager.VerbEvents, Interval: "0.05"}, "vm status --event --format json --interval 1"},
			{manager.Call{Verb: manager.VerbEvents, Interval: "2.5"}, "vm status --event --format json --interval 3"},
		} {
			argv, err := a.Command(tc.c)
			if err != nil {
				t.Fatalf("%s %s: %v", b, tc.c, err)
			}
			if got := strings.Join(argv[1:], " "); got != tc.want {
				t.Errorf("%s %s: %q, want %q", b, tc.c, got, tc.want)
			}
			assertFlagsOnPage(t, b, argv[1:])
		}
		for _, c := range []manager.Call{{Verb: manager.VerbNIC, VM: "ID1", NICs: &zero}, {Verb: manager.VerbExec, VM: "ID1", Argv: []string{"hostname"}}} {
			_, err := a.Command(c)
			if !errors.Is(err, manager.ErrNotSupported) || !strings.Contains(err.Error(), "not in `cocoon vm --help`") {
				t.Errorf("%s %s: %v, want not supported with the probe's reason", b, c, err)
			}
		}
	}
}

// vm inspect prints one types.VM; a record without an id is no VM.
func TestParseVMInspect(t *testing.T) {
	a := New(manager.Options{})
	vm, err := a.ParseVM([]byte(`{"id":"abc","state":"running","pid":42,"config":{"name":"w"}}`))
	if err != nil || vm.ID != "abc" || vm.Name != "w" || vm.State != manager.StateRunning || vm.PID != 42 {
		t.Fatalf("%+v %v", vm, err)
	}
	if _, err := a.ParseVM([]byte(`{"state":"running"}`)); err == nil {
		t.Error("a record without an id decoded")
	}
	if _, err := a.ParseVM([]byte("VM not found")); err == nil {
		t.Error("text decoded as a VM")
	}
}
