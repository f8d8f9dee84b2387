package suite

import (
	"context"
	"flag"
	"os"
	"strconv"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
)

// The suite binary is the Kubernetes-e2e shape: `go test ./scenarios/suite
// -args --ginkgo.label-filter='seed:002' --time-scale=0.05`. Without a label
// filter (or VMCHAOS_SUITE=1) it runs nothing: `go test ./...` must stay a
// unit-test run on 2 cores; `vmchaos run` is the catalogue's entry point.
var (
	timeScale  = flag.Float64("time-scale", 0.05, "time scale of the stack")
	supervisor = flag.String("supervisor", "auto", "supervisor kind")
	seed       = flag.Int64("seed", 1, "run seed")
	reportDir  = flag.String("report-dir", "", "run dir (default: a temp dir)")
)

var theRunner *runner.Runner

var _ = func() bool {
	cases, err := scenarios.Expand("fake")
	if err != nil {
		panic(err)
	}
	return Register(cases, func() *runner.Runner { return theRunner })
}()

var _ = ginkgo.BeforeSuite(func(ctx ginkgo.SpecContext) {
	dir := *reportDir
	if dir == "" {
		dir = ginkgo.GinkgoT().TempDir()
	}
	bugs, err := regress.Parse(os.Getenv(regress.Env))
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	theRunner, err = runner.New(context.WithoutCancel(ctx), runner.Options{ReportDir: dir, Scale: *timeScale,
		Supervisor: *supervisor, Seed: *seed, Regress: bugs, Progress: ginkgo.GinkgoWriter})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	ginkgo.DeferCleanup(func() {
		res, err := theRunner.WriteAll()
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		ginkgo.GinkgoWriter.Printf("reports in %s (%s)\n", dir, reports.CountVerdicts(res.Cases))
		gomega.Expect(theRunner.Close()).To(gomega.Succeed())
	})
})

func TestScenarios(t *testing.T) {
	sc, _ := ginkgo.GinkgoConfiguration()
	on, _ := strconv.ParseBool(os.Getenv("VMCHAOS_SUITE"))
	if sc.LabelFilter == "" && !on {
		t.Skip("catalogue suite: pass -ginkgo.label-filter=EXPR (or VMCHAOS_SUITE=1); `vmchaos run` is the usual entry point")
	}
	gomega.RegisterFailHandler(ginkgo.Fail)
	ginkgo.RunSpecs(t, "vmchaos scenarios")
}
