package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/manager/cocoon"
	mvmctl "github.com/vmchaos/vmchaos/manager/vmctl"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// Managers the runner has adapters for (--manager).
var Managers = []string{"vmctl", "cocoon"}

// EnvCaseTag is the variable every process of a manager case inherits (its
// verbs, the VMMs they launch, the event stream): the tag scan finds them
// by it after they were reparented.
const EnvCaseTag = "VMCHAOS_MANAGER_CASE"

// mgrRun is what a manager run shares between its cases (docs/architecture.md
// §14): the manager under test, the fake guest image, and the registration
// of its VMMs with the one reaper (injector.ReapOrphans).
type mgrRun struct {
	name, bin, config string
	binDir            string
	tmp, image        string
	release           func()
	record            *injector.RunRecord
	key               *ledger.Key // the guests' authorized key: the workload cases' writer and ledger
	n                 int         // cases and discoveries so far (under Runner.mu)
	// layout: per verb, the store dirs its successful unarmed run made that
	// no record explains (learnLayout; under Runner.mu)
	layout map[manager.Verb]map[string]bool
}

// NewManager returns the adapter of name for a store.
func NewManager(name string, o manager.Options) (manager.Manager, error) {
	switch name {
	case "vmctl":
		return mvmctl.New(o), nil
	case "cocoon":
		if o.Bin == "" {
			return nil, errors.New("manager cocoon: --manager-bin is required (vmchaos never builds or fetches cocoon)")
		}
		return cocoon.New(o), nil
	}
	return nil, fmt.Errorf("manager %q: want one of %s", name, strings.Join(Managers, ", "))
}

// newManagerRunner is New for a run of the manager-verb cases: no agent
// stack, the manager's own binary driven through its adapter, fakech
// installed as `cloud-hypervisor`, the VMMs the verbs leave behind reaped
// by the one reaper.
func newManagerRunner(ctx context.Context, o Options) (*Runner, error) {
	if o.Backend != "fake" {
		return nil, fmt.Errorf("--manager runs on the fake backend only (fakech installed as cloud-hypervisor)")
	}
	bin, err := binDir()
	if o.BinDir != "" {
		bin, err = o.BinDir, nil
	}
	if err != nil {
		return nil, err
	}
	mr := &mgrRun{name: o.Manager, bin: o.ManagerBin, config: o.ManagerConfig, binDir: bin}
	if mr.bin == "" && mr.name == "vmctl" {
		mr.bin = filepath.Join(bin, "vmctl")
	}
	if _, err := NewManager(mr.name, manager.Options{Bin: mr.bin}); err != nil {
		return nil, err
	}
	if st, err := os.Stat(mr.bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("manager binary %q: not an executable file (%v)", mr.bin, err)
	}
	if _, err := os.Stat(filepath.Join(bin, cocoon.VMMName)); err != nil {
		return nil, fmt.Errorf("fakech as %s: %w", cocoon.VMMName, err)
	}
	if err := os.MkdirAll(o.ReportDir, 0o755); err != nil {
		return nil, fmt.Errorf("report dir: %w", err)
	}
	if mr.tmp, err = os.MkdirTemp(mgrTmpBase(os.TempDir()), "vmchaos-mgr-"); err != nil {
		return nil, fmt.Errorf("manager run: %w", err)
	}
	// The run's record (what a SIGKILLed runner leaves, the VMMs its verbs
	// launched, is cleaned by the next run, as for a supervised run); it
	// cleans what dead runs left first.
	if mr.record, err = injector.NewRunRecord(ctx, []string{mr.tmp}); err != nil {
		_ = os.RemoveAll(mr.tmp)
		return nil, err
	}
	if mr.key, err = ledger.NewKey(filepath.Join(mr.tmp, "key")); err != nil {
		mr.record.Close()
		_ = os.RemoveAll(mr.tmp)
		return nil, fmt.Errorf("manager run: %w", err)
	}
	mr.image = filepath.Join(mr.tmp, "guest.img")
	// the key in the image: a workload case's writer and ledger reach the
	// guest over SSH, whatever the manager does with cloud-init seeds
	if _, err := guestimg.Build(mr.image, guestimg.Options{Hostname: "vmchaos-guest", AuthorizedKeys: []string{mr.key.AuthorizedKey()}}); err != nil {
		mr.record.Close()
		_ = os.RemoveAll(mr.tmp)
		return nil, fmt.Errorf("manager run: guest image: %w", err)
	}
	if mr.release, err = injector.ReapOrphans(cocoon.VMMName); err != nil {
		mr.record.Close()
		_ = os.RemoveAll(mr.tmp)
		return nil, err
	}
	host, _ := os.Hostname()
	return &Runner{opts: o, mgr: mr, res: &reports.Results{RunID: filepath.Base(o.ReportDir), StartedAt: time.Now().UTC(),
		Host: host, Backend: o.Backend, Supervisor: "none (manager: " + mr.name + ")", TimeScale: o.Scale, Seed: o.Seed}}, nil
}

// mgrSockTail is the longest path a manager makes under a run's temp dir
// for a unix socket: a case's store, its root with the run dir inside
// (a power cut's OneFS layout), a VM's run dir named by a 26-character id,
// and the VMM's serial socket (cocoon: console.sock).
const mgrSockTail = len("/vmchaos-mgr-0123456789/m9999/root/run/cloudhypervisor/") + 26 + len("/console.sock")

// mgrTmpBase is where a manager run makes its temp dir: TMPDIR unless a
// socket under it would pass the 107 bytes of sun_path, which a VMM's bind
// refuses with EINVAL (fakech and CH alike: "Error creating console
// device: Invalid argument" once a run's case numbers grew a digit); then
// /tmp.
func mgrTmpBase(tmp string) string {
	if len(tmp)+mgrSockTail > 107 {
		return "/tmp"
	}
	return tmp
}

func (mr *mgrRun) close() error {
	mr.release()
	err := os.RemoveAll(mr.tmp)
	if err == nil {
		mr.record.Close()
	}
	return err
}

// ManagerBin is the manager binary of a manager run ("" otherwise).
func (r *Runner) ManagerBin() string {
	if r.mgr == nil {
		return ""
	}
	return r.mgr.bin
}

// ManagerCases is the manager-verb cases of the run's manager: each verb it
// has is run once unarmed to discover the VMM phases it passes through,
// then scenarios.ExpandManager builds the cases.
func (r *Runner) ManagerCases(ctx context.Context) ([]scenarios.Case, error) {
	if r.mgr == nil {
		return nil, errors.New("not a manager run (no --manager)")
	}
	m, err := NewManager(r.mgr.name, manager.Options{Bin: r.mgr.bin, Dir: r.mgr.tmp, VMMDir: r.mgr.binDir})
	if err != nil {
		return nil, err
	}
	caps, err := manager.CapabilitiesOf(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("the capabilities of %s: %w", r.mgr.name, err)
	}
	table, err := json.Marshal(caps)
	if err != nil {
		return nil, fmt.Errorf("the capabilities of %s: %w", r.mgr.name, err)
	}
	r.mu.Lock()
	r.res.ManagerCapabilities = table
	r.mu.Unlock()
	phases := map[manager.Verb][]string{}
	failed := map[manager.Verb]string{}
	for _, op := range scenarios.MgrOps {
		if !scenarios.MgrSupports(m, op) {
			r.noteNotSupported(op, caps)
			continue
		}
		// One verb's failure leaves out only its own park cases: the
		// others still run, and its discover case fails with the error.
		if phases[op.Verb], err = r.discover(ctx, op); err != nil {
			failed[op.Verb] = err.Error()
		}
	}
	return scenarios.ExpandManager(m, phases, failed), nil
}

// noteNotSupported records in results.json the verb whose cases were not
// generated because the manager lacks a verb they need: "not supported by
// this manager", never a pass and never a skipped case (issue 32 item 4).
func (r *Runner) noteNotSupported(op scenarios.MgrOp, caps manager.Capabilities) {
	var verbs []string
	seen := map[manager.Verb]bool{}
	for _, c := range append(append([]manager.Call{op.Call}, op.Fixture...), op.Calibrate...) {
		if !seen[c.Verb] {
			seen[c.Verb] = true
			verbs = append(verbs, string(c.Verb))
		}
	}
	_, why := caps.Supports(verbs...)
	if why == "" {
		why = manager.NotSupportedPrefix + "its adapter refuses one of " + strings.Join(verbs, ", ")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.res.NotSupported = append(r.res.NotSupported, reports.NotRun{Case: "mgr-" + string(op.Verb) + "-*",
		Reason: why, Missing: string(op.Verb), Kind: reports.MissingManagerVerb})
}

// mgrRepro is the one-line command that runs a manager case again.
func (r *Runner) mgrRepro(c scenarios.Case, bugs []string) string {
	s := "vmchaos run --manager " + r.mgr.name
	if len(bugs) > 0 {
		s = regress.Env + "=" + strings.Join(bugs, ",") + " " + s
	}
	if r.mgr.name != "vmctl" {
		s += " --manager-bin " + r.mgr.bin
	}
	if r.mgr.config != "" {
		s += " --manager-config " + r.mgr.config
	}
	// the scenario's id: a repro's runs carry .runK in the case id, which
	// no case: label matches
	id := c.ID
	if c.Scenario != nil && c.Scenario.ID != "" {
		id = c.Scenario.ID
	}
	return s + fmt.Sprintf(" --time-scale %g --seed %d --label-filter 'case:%s'", r.opts.Scale, r.opts.Seed, scenarios.CaseLabel(id))
}

// nextMgrDir is a fresh store dir under the run's temp dir.
func (r *Runner) nextMgrDir(prefix string) string {
	r.mu.Lock()
	r.mgr.n++
	n := r.mgr.n
	r.mu.Unlock()
	return filepath.Join(r.mgr.tmp, fmt.Sprintf("%s%d", prefix, n))
}
