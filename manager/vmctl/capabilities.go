package vmctl

import (
	"context"
	"fmt"
	"strings"

	"github.com/vmchaos/vmchaos/manager"
)

var _ manager.CapabilityReporter = (*Adapter)(nil)

// features is what the bundled vmctl has besides the catalogue's verbs
// (cmd/vmctl/vm.go, cmd/vmctl/daemon.go); vmctl ships with vmchaos, so its
// table is known rather than probed. Missing rows say why.
var features = []manager.Capability{
	{Name: manager.FeatureVerbJSON, Present: true, How: "vmctl vm run|clone|start -o json"},
	{Name: manager.FeatureListJSON, Present: true, How: "vmctl vm list -o json; vmctl snapshot list -o json"},
	{Name: manager.FeatureEvents, Present: true, How: "vmctl vm status --event --format json -n 1"},
	{Name: manager.FeatureCNIDirs, Reason: "cni-dirs: vmctl has no CNI: its NICs are fake loopback addresses or TAPs it makes itself (--net-mode fake|tap, --net-pool)"},
	{Name: manager.FeatureNIC, Present: true, How: "vmctl vm net VM --nics N"},
	{Name: manager.FeatureGuestExec, Present: true, How: "vmctl vm exec VM -- ARGV"},
	{Name: manager.FeatureCheck, Present: true, How: "vmctl check -o json"},
	{Name: manager.FeatureInspect, Present: true, How: "vmctl vm inspect VM -o json"},
	{Name: manager.FeatureExport, Present: true, How: "vmctl snapshot export SNAP -o FILE"},
	{Name: manager.FeatureImport, Present: true, How: "vmctl snapshot import --name NAME FILE"},
}

// Capabilities is vmctl's full table: every verb Command maps (restore is
// the one it lacks: vmctl has no in-place restore), and its features.
func (a *Adapter) Capabilities(context.Context) (manager.Capabilities, error) {
	c := manager.Capabilities{Manager: "vmctl", Bin: a.opts.Bin, Version: "bundled with vmchaos"}
	byName := map[string]manager.Capability{}
	for _, f := range features {
		byName[f.Name] = f
	}
	for _, n := range manager.CapabilityNames {
		if f, ok := byName[n]; ok {
			c.Items = append(c.Items, f)
			continue
		}
		it := manager.Capability{Name: n}
		argv, err := a.Command(manager.Call{Verb: manager.Verb(n), VM: "VM", Snapshot: "SNAP", Name: "NAME"})
		switch {
		case err == nil:
			it.Present, it.How = true, strings.TrimSpace("vmctl "+strings.Join(argv[1:], " "))
		case n == string(manager.VerbRestore):
			it.Reason = "restore: vmctl has no in-place restore (no `vm restore` in cmd/vmctl/vm.go); a snapshot is used through clone"
		default:
			return c, fmt.Errorf("vmctl capabilities: %s: %w", n, err)
		}
		c.Items = append(c.Items, it)
	}
	return c, nil
}
