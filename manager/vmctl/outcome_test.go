package vmctl

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/vmctl/api"
)

// TestClassifyVMCtlMessages maps each refusal vmctl prints (built from its
// own format strings in vmctl/api, as cobra prints them) to its outcome.
func TestClassifyVMCtlMessages(t *testing.T) {
	const id = "MPT5A6ZS2FNZWQGFN24AZLREWQ"
	for _, tc := range []struct {
		stderr string
		want   *manager.Refusal // nil: no outcome
	}{
		{"Error: save snapshot: " + fmt.Sprintf(api.MsgSnapNameExists, "web", id),
			&manager.Refusal{Outcome: manager.OutcomeNameHeld, Object: "snapshot", Name: "web", Holder: id}},
		{"some log\nError: save snapshot: " + fmt.Sprintf(api.MsgSnapNameInUse, "web", id),
			&manager.Refusal{Outcome: manager.OutcomeNameHeld, Object: "snapshot", Name: "web", Holder: id, Pending: true}},
		{"Error: reserve VM record: " + fmt.Sprintf(api.MsgVMNameExists, "w-0", id),
			&manager.Refusal{Outcome: manager.OutcomeNameHeld, Object: "vm", Name: "w-0", Holder: id}},
		{"Error: rm: " + fmt.Sprintf(api.MsgSnapInUse, id),
			&manager.Refusal{Outcome: manager.OutcomeLeaseHeld, Object: "snapshot", Name: id}},
		{"Error: inspect x: " + api.MsgVMNotFound, &manager.Refusal{Outcome: manager.OutcomeNotFound, Object: "vm"}},
		{"Error: rm x: " + api.MsgSnapshotNotFound, &manager.Refusal{Outcome: manager.OutcomeNotFound, Object: "snapshot"}},
		{"Error: " + api.MsgVMPaused, &manager.Refusal{Outcome: manager.OutcomePaused, Object: "vm"}},
		{"Error: net: " + fmt.Sprintf(api.MsgEjectPending, "net1", "5s"), &manager.Refusal{Outcome: manager.OutcomeEjectPending, Object: "vm"}},
		// Not an outcome: a plain failure the agent does not branch on.
		{"Error: " + fmt.Sprintf(api.MsgVMNotRunningState, id, "stopped"), nil},
		{"", nil},
		// The message is the Error: line; a log line above it that looks
		// like a refusal does not count (as before issue 33).
		{"vm name \"a\" already exists (id: X)\nError: boom", nil},
	} {
		got := Classify(tc.stderr)
		if tc.want == nil {
			if got != nil {
				t.Errorf("%q: got %+v, want none", tc.stderr, got)
			}
			continue
		}
		if got == nil {
			t.Errorf("%q: no outcome, want %s", tc.stderr, tc.want.Outcome)
			continue
		}
		got.Message = "" // checked below
		if *got != *tc.want {
			t.Errorf("%q:\n got %+v\nwant %+v", tc.stderr, *got, *tc.want)
		}
		if msg := Classify(tc.stderr).Message; !strings.Contains(tc.stderr, msg) || strings.HasPrefix(msg, "Error: ") {
			t.Errorf("%q: message %q", tc.stderr, msg)
		}
	}
}

// FuzzClassify: a holder the classifier reports is always in the text.
func FuzzClassify(f *testing.F) {
	f.Add(`Error: snapshot name "web" already exists (held by MPT5A6ZS2FNZWQGFN24AZLREWQ)`)
	f.Add(`Error: snapshot name "a\"b" already in use by X`)
	f.Add(`Error: vm name "x" already exists (id: Y)`)
	f.Fuzz(func(t *testing.T, s string) {
		if r := Classify(s); r != nil && r.Outcome == manager.OutcomeNameHeld && (r.Holder == "" || !strings.Contains(s, r.Holder)) {
			t.Fatalf("holder %q not in %q", r.Holder, s)
		}
	})
}
