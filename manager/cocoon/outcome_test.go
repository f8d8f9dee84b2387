package cocoon

import (
	"fmt"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
)

// TestClassifyCocoonMessages maps cocoon's own refusals to outcomes. The
// format strings are cocoon's, copied from its source (paths in
// github.com/cocoonstack/cocoon; docs/manager.md lists them per build); the
// stderr shape is cobra's `Error: ` line after cocoon's log lines.
func TestClassifyCocoonMessages(t *testing.T) {
	const (
		id   = "5f1c0a7e9b2d4c61"
		logl = "03 Dec 26 14:32 UTC INF clone started func=cmd/vm.clone\n"
	)
	for _, tc := range []struct {
		src    string // where cocoon prints it
		stderr string
		want   *manager.Refusal
	}{
		{"v0.2.7-1 hypervisor/cloudhypervisor/utils.go", logl + "Error: " + fmt.Sprintf("VM name %q already exists (id: %s)", "tgt", id),
			&manager.Refusal{Outcome: manager.OutcomeNameHeld, Object: "vm", Name: "tgt", Holder: id}},
		{"v0.3.0/HEAD hypervisor/backend.go", "Error: clone: " + fmt.Sprintf("vm name %q already exists (id: %s)", "tgt", id),
			&manager.Refusal{Outcome: manager.OutcomeNameHeld, Object: "vm", Name: "tgt", Holder: id}},
		{"cmd/snapshot/handler.go (finished holder: no id)", "Error: " + fmt.Sprintf("snapshot name %q already exists", "web"),
			&manager.Refusal{Outcome: manager.OutcomeNameHeld, Object: "snapshot", Name: "web"}},
		{"snapshot/localfile/localfile.go Create (pending holder, seed 001 #3)", logl + "Error: save: " + fmt.Sprintf("snapshot name %q already in use by %s", "web", id),
			&manager.Refusal{Outcome: manager.OutcomeNameHeld, Object: "snapshot", Name: "web", Holder: id, Pending: true}},
		{"hypervisor/hypervisor.go ErrNotFound", "Error: inspect x: VM not found", &manager.Refusal{Outcome: manager.OutcomeNotFound, Object: "vm"}},
		{"snapshot/db.go ErrNotFound", "Error: rm x: snapshot not found", &manager.Refusal{Outcome: manager.OutcomeNotFound, Object: "snapshot"}},
		{"gc/orchestrator.go", "Error: gc aborted: modules skipped (lock busy): vm", &manager.Refusal{Outcome: manager.OutcomeBusy}},
		{"cloud-hypervisor's API, passed through", `Error: snapshot: pause: InvalidStateTransition(Paused, Paused)`, &manager.Refusal{Outcome: manager.OutcomePaused, Object: "vm"}},
		// Not outcomes.
		{"hypervisor/hypervisor.go ErrNotRunning", "Error: VM not running", nil},
		{"network/network.go ErrNotFound", "Error: network not found", nil},
		{"cobra, v0.2.x", "Error: unknown shorthand flag: 'o' in -o", nil},
	} {
		got := Classify(tc.stderr)
		if tc.want == nil {
			if got != nil {
				t.Errorf("%s: %q: got %+v, want none", tc.src, tc.stderr, got)
			}
			continue
		}
		if got == nil {
			t.Errorf("%s: %q: no outcome, want %s", tc.src, tc.stderr, tc.want.Outcome)
			continue
		}
		if got.Message == "" {
			t.Errorf("%s: no message", tc.src)
		}
		got.Message = ""
		if *got != *tc.want {
			t.Errorf("%s: %q:\n got %+v\nwant %+v", tc.src, tc.stderr, *got, *tc.want)
		}
	}
}
