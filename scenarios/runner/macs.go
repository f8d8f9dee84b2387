package runner

import (
	"context"
	"fmt"
)

// noteMACs lists, right before a hibernate or delete of name, the MACs of
// its VM (Expect.MACKept): a wake, or a create under the same name, in tap
// mode must bring the same ones back. The first listing of a name counts.
func (cr *caseRun) noteMACs(ctx context.Context, name string) {
	if !cr.s.Expect.MACKept {
		return
	}
	macs, err := cr.vmMACs(ctx, name)
	if err != nil {
		if cr.macsErr == nil {
			cr.macsErr = err
		}
		return
	}
	if cr.macs == nil {
		cr.macs = map[string][]string{}
	}
	if _, seen := cr.macs[name]; !seen {
		cr.macs[name] = macs
	}
}

// vmMACs lists the MACs of the VM named name, in NIC order.
func (cr *caseRun) vmMACs(ctx context.Context, name string) ([]string, error) {
	v, ok, err := cr.st.VMByName(ctx, name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("no vm named %s", name)
	}
	out := make([]string, 0, len(v.Network))
	for _, n := range v.Network {
		out = append(out, n.MAC)
	}
	return out, nil
}
