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
