package checker

import (
	"errors"
	"strings"
	"testing"

	agentapi "github.com/vmchaos/vmchaos/nodeagent/api"
)

func TestAckedIntentsKeptJudgesEveryAckBeforeTheCut(t *testing.T) {
	acks := []Ack{
		{Name: "a", Generation: 1, AtNs: 10},
		{Name: "b", Generation: 2, AtNs: 20},
		{Name: "c", Delete: true, AtNs: 30},
		{Name: "late", Generation: 1, AtNs: 200}, // after the cut: not owed
	}
	kept := []agentapi.VMView{{Name: "a", Generation: 1}, {Name: "b", Generation: 3}, {Name: "c", Generation: 1, Deleted: true}}
	cases := []struct {
		name   string
		listed []agentapi.VMView
		err    error
		ok     bool
		want   string
	}{
		{"all kept", kept, nil, true, "3 intent change(s)"},
		{"a PUT lost", kept[1:], nil, false, "a: PUT acknowledged"},
		{"a generation rolled back", []agentapi.VMView{kept[0], {Name: "b", Generation: 1}, kept[2]}, nil, false, "generation 2 acknowledged"},
		{"a DELETE undone", []agentapi.VMView{kept[0], kept[1], {Name: "c", Generation: 1}}, nil, false, "c: DELETE acknowledged"},
		{"a DELETE finished", kept[:2], nil, true, ""},
		{"no list", nil, errors.New("connection refused"), false, "could not be listed"},
	}
	for _, c := range cases {
		inv := AckedIntentsKeptInvariant(acks, 100, c.listed, c.err)
		if inv.OK != c.ok || !strings.Contains(inv.Evidence, c.want) {
			t.Errorf("%s: ok=%v %q, want ok=%v containing %q", c.name, inv.OK, inv.Evidence, c.ok, c.want)
		}
	}
}

// A migration's source that released a VM to the control plane before the
// cut (after the placement's PUT) may list it hibernated, deleting or not
// at all after the reboot, never running again.
func TestAckedIntentsKeptAfterARelease(t *testing.T) {
	acks := []Ack{{Name: "m", Generation: 1, AtNs: 10}, {Name: "m", Released: true, AtNs: 20}}
	hib := agentapi.VMView{Name: "m", Generation: 2}
	hib.Status.Lifecycle = agentapi.LifecycleHibernated
	ready := hib
	ready.Status.Lifecycle = agentapi.LifecycleReady
	for _, c := range []struct {
		name   string
		listed []agentapi.VMView
		ok     bool
	}{
		{"kept hibernated", []agentapi.VMView{hib}, true},
		{"deleted since", nil, true},
		{"running again", []agentapi.VMView{ready}, false},
	} {
		if inv := AckedIntentsKeptInvariant(acks, 100, c.listed, nil); inv.OK != c.ok {
			t.Errorf("%s: ok=%v (%s), want %v", c.name, inv.OK, inv.Evidence, c.ok)
		}
	}
	// without the release the same deleted listing loses the PUT
	if inv := AckedIntentsKeptInvariant(acks[:1], 100, nil, nil); inv.OK {
		t.Errorf("a PUT with no release, listed by nobody: passed (%s)", inv.Evidence)
	}
}
