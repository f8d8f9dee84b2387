package suite

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
)

// failT is the GinkgoTestingT of a programmatic run: Ginkgo only needs Fail.
type failT struct{ failed bool }

func (t *failT) Fail() { t.failed = true }

// Run runs cases through Ginkgo from inside the vmchaos binary (no `go
// test`): the tree is built from cases, the label filter is Ginkgo's own,
// and Ginkgo writes ginkgo.json into the report dir. Ginkgo allows one
// RunSpecs per process, so Run is called once.
func Run(ctx context.Context, r *runner.Runner, cases []scenarios.Case, labelFilter, reportDir string, seed int64) error {
	Register(cases, func() *runner.Runner { return r })
	sc, rc := ginkgo.GinkgoConfiguration()
	sc.LabelFilter = labelFilter
	sc.RandomSeed = seed
	sc.RandomizeAllSpecs = false // catalogue order: determinism across runs
	rc.JSONReport = filepath.Join(reportDir, "ginkgo.json")
	rc.Succinct = true
	rc.NoColor = true
	if _, err := types.ParseLabelFilter(labelFilter); err != nil {
		return fmt.Errorf("label filter %q: %w", labelFilter, err)
	}
	t := &failT{}
	ginkgo.RunSpecs(t, "vmchaos", sc, rc)
	_ = ctx
	return nil
}
