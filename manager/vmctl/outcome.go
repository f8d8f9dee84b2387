package vmctl

import (
	"regexp"
	"strings"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/vmctl/api"
)

var _ manager.Classifier = (*Adapter)(nil)

// vmctl's refusals, from the format strings in vmctl/api (api.MsgVMNameExists,
// MsgSnapNameExists, MsgSnapNameInUse, MsgSnapInUse). The patterns are the
// ones the agent matched before issue 33 moved them here, unchanged, so the
// agent over vmctl behaves exactly as before.
var (
	reVMNameExists  = regexp.MustCompile(`vm name "([^"]*)" already exists \(id: ([A-Za-z0-9]+)\)`)
	reSnapExists    = regexp.MustCompile(`snapshot name "([^"]*)" already exists \(held by ([A-Za-z0-9]+)\)`)
	reSnapInUseBy   = regexp.MustCompile(`snapshot name "([^"]*)" already in use by ([A-Za-z0-9]+)`)
	reSnapLeaseHeld = regexp.MustCompile(`snapshot (\S+) is in use by an active clone/restore/export`)
)

// Classify types a failed vmctl's stderr (manager.Classifier). vmctl prints
// its error as one `Error: <msg>` line (cobra); the message is that line, or
// the last line when there is none.
func (a *Adapter) Classify(stderr string) *manager.Refusal { return Classify(stderr) }

// Classify is the adapter's Classifier without an adapter.
func Classify(stderr string) *manager.Refusal {
	msg := Message(stderr)
	ref := func(o manager.Outcome, obj string) *manager.Refusal {
		return &manager.Refusal{Outcome: o, Object: obj, Message: msg}
	}
	if m := reSnapExists.FindStringSubmatch(msg); m != nil {
		r := ref(manager.OutcomeNameHeld, manager.ObjectSnapshot)
		r.Name, r.Holder = m[1], m[2]
		return r
	}
	if m := reSnapInUseBy.FindStringSubmatch(msg); m != nil {
		r := ref(manager.OutcomeNameHeld, manager.ObjectSnapshot)
		r.Name, r.Holder, r.Pending = m[1], m[2], true
		return r
	}
	if m := reVMNameExists.FindStringSubmatch(msg); m != nil {
		r := ref(manager.OutcomeNameHeld, manager.ObjectVM)
		r.Name, r.Holder = m[1], m[2]
		return r
	}
	if m := reSnapLeaseHeld.FindStringSubmatch(msg); m != nil {
		r := ref(manager.OutcomeLeaseHeld, manager.ObjectSnapshot)
		r.Name = m[1]
		return r
	}
	switch {
	case strings.Contains(msg, api.MsgVMNotFound):
		return ref(manager.OutcomeNotFound, manager.ObjectVM)
	case strings.Contains(msg, api.MsgSnapshotNotFound):
		return ref(manager.OutcomeNotFound, manager.ObjectSnapshot)
	case strings.Contains(msg, api.MsgVMPaused):
		return ref(manager.OutcomePaused, manager.ObjectVM)
	case strings.Contains(msg, api.EjectPending):
		return ref(manager.OutcomeEjectPending, manager.ObjectVM)
	}
	return nil
}

// Message returns the `Error: <msg>` text vmctl printed, without the prefix,
// else stderr's last line.
func Message(stderr string) string {
	for _, l := range strings.Split(stderr, "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(l), "Error: "); ok {
			return m
		}
	}
	s := strings.TrimSpace(stderr)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[i+1:])
	}
	return s
}
