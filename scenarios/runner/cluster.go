package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/controlplane"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
	"github.com/vmchaos/vmchaos/scenarios/stack"
	vmctlapi "github.com/vmchaos/vmchaos/vmctl/api"
)

// cluster is a case's cluster (Env.Nodes >= 2, docs/controlplane.md): the
// control plane, its own process (cmd/controlplane, a unit of the run's
// supervisor: a fault target) serving on a unix socket every node's agent
// syncs against, with its state in a file, and one node stack per node.
// The case's own stack (caseRun.st) is the first node and runs the
// registry; the others push and pull through it.
type cluster struct {
	sock   string
	dir    string
	client *controlplane.Client
	// cpUnit is the control plane's unit (Fault.Unit "controlplane")
	cpUnit  string
	caseDir string // where its log and state are copied at teardown
	// nodesClosed: closeNodes ran
	nodesClosed bool
	sup         injector.Supervisor
	// obs serves the control plane's observer socket: every change is
	// told to observe, a release before it takes effect
	obs     *http.Server
	observe func(controlplane.Event)
	names   []string // node names, the case's own stack first
	// moved is when each VM's last migration moved its placement (on
	// the wall clock and the trace's): its time to live on the target,
	// and where the target's trace is read from
	moved map[string]moveTime
	// watched are the VMs the migration watch samples (watchMigration)
	watched map[string]bool
	// migrated: VM name → the node it was migrated to and is live on
	// alone (its guest is there: the ledger and the workload cut read it)
	migrated map[string]string
	nodes    map[string]*stack.Stack // by node name
	mu       sync.Mutex
	// bad are the MigrateSourceDurable violations seen at releases, two
	// the ClusterOneLiveVM ones the migration's watch saw
	bad, two []string
	// marks are the other nodes' trace marks at the arming (a trigger on
	// their phases reads from there), by node name
	marks map[string]int
	// stopWatch ends the migration's watch (watchMigration)
	stopWatch context.CancelFunc
	watchDone chan struct{}
}

// moveTime is when a migration moved a VM's placement: on the wall clock
// and on the traces' clock.
type moveTime struct {
	wall  time.Time
	trace int64
}

// clusterNodeNames are the node names of an n-node cluster.
func clusterNodeNames(n int) []string {
	names := []string{scenarios.NodeA, scenarios.NodeB}
	for i := 2; i < n; i++ {
		names = append(names, fmt.Sprintf("node-%c", 'a'+i))
	}
	return names[:n]
}

// newCluster starts the control plane of an n-node case under the run's
// short temp dir (a socket path must fit sun_path, and a sandboxed
// supervisor shares /tmp with the agents): its observer socket, served
// here, and its unit.
func newCluster(ctx context.Context, run *stack.Run, n int, bugs []string) (*cluster, error) {
	dir, err := os.MkdirTemp(run.TmpDir, "cp")
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	cl := &cluster{dir: dir, sock: filepath.Join(dir, "cp.sock"), sup: run.Sup,
		cpUnit: "vmchaos-" + filepath.Base(dir), names: clusterNodeNames(n), nodes: map[string]*stack.Stack{},
		moved: map[string]moveTime{}, watched: map[string]bool{}}
	if err := cl.serveObserver(filepath.Join(dir, "obs.sock")); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	spec := injector.UnitSpec{Name: cl.cpUnit, Dir: dir, LogPath: filepath.Join(dir, "controlplane.log"),
		Argv: []string{filepath.Join(run.BinDir, "controlplane"), "--socket", cl.sock,
			"--state", filepath.Join(dir, "state.json"), "--observer", filepath.Join(dir, "obs.sock")},
		RestartSec: time.Duration(float64(5*time.Second) * run.Scale), TimeoutStopSec: 10 * time.Second,
		// the case's planted bugs, as the agents get them (none: the
		// harness's own environment must not switch one on)
		Env: []string{regress.Env + "=" + strings.Join(bugs, ",")}}
	if err := run.Sup.Start(ctx, spec); err != nil {
		_ = cl.obs.Close()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("control plane: start: %w", err)
	}
	cl.client = controlplane.NewClient(cl.sock, 10*time.Second)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err := cl.client.List(wctx)
		if err == nil {
			return cl, nil
		}
		if wctx.Err() != nil {
			_ = cl.close(context.Background())
			return nil, fmt.Errorf("control plane not answering: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serveObserver serves the control plane's observer socket: POST
// /v1/events with one controlplane.Event, answered once observe returned
// (the control plane waits for it before a release takes effect).
func (cl *cluster) serveObserver(sock string) error {
	l, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("control plane observer: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/events", func(w http.ResponseWriter, r *http.Request) {
		var e controlplane.Event
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&e); err != nil {
			http.Error(w, `{"error":"decode"}`, http.StatusBadRequest)
			return
		}
		cl.mu.Lock()
		observe := cl.observe
		cl.mu.Unlock()
		if observe != nil {
			observe(e)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	cl.obs = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = cl.obs.Serve(l) }()
	return nil
}

// agentFlags are the flags that make node's agent sync against the
// control plane.
func (cl *cluster) agentFlags(node string) []string {
	// ticks at scale 1: the agent scales them itself
	return []string{"--control-plane", cl.sock, "--node", node, "--control-plane-tick", "1s"}
}

// addNodes builds the stacks of every node after the first (the case's
// own stack, st, already built with the registry).
func (cl *cluster) addNodes(ctx context.Context, r *Runner, st *stack.Stack, o stack.Options) error {
	cl.nodes[cl.names[0]] = st
	cl.caseDir = o.CaseDir
	for _, name := range cl.names[1:] {
		no := stack.Options{CaseDir: filepath.Join(o.CaseDir, name), RestartDelay: o.RestartDelay,
			AgentFlags: append(withoutCPFlags(o.AgentFlags), cl.agentFlags(name)...),
			Regress:    o.Regress, NetMode: o.NetMode, FakeCHTiming: o.FakeCHTiming, SharedRegistryURL: st.RegistryURL, SharedNet: st.Net}
		if err := os.MkdirAll(no.CaseDir, 0o755); err != nil {
			return err
		}
		ns, err := r.run.New(ctx, no)
		if err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
		cl.nodes[name] = ns
	}
	return nil
}

// withoutCPFlags drops the first node's control plane flags from its
// agent flags (the last six).
func withoutCPFlags(flags []string) []string {
	for i, f := range flags {
		if f == "--control-plane" {
			return append([]string(nil), flags[:i]...)
		}
	}
	return flags
}

// startAgents starts the agents of every node after the first.
func (cl *cluster) startAgents(ctx context.Context) error {
	for _, name := range cl.names[1:] {
		if err := cl.nodes[name].StartAgent(ctx); err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
	}
	return nil
}

// armNodes arms the agents of the other nodes whose phases a park trigger
// reads (Fault.Node) with their pauses, as arm does the case's own: the
// setup ran unarmed, so no setup step parks there. Every node's trace is
// marked after it: its triggers read from there.
func (cr *caseRun) armNodes(ctx context.Context) error {
	cl := cr.cl
	cl.marks = map[string]int{}
	for _, name := range cl.names[1:] {
		ns := cl.nodes[name]
		if specs := cr.parkSpecs(name); len(specs) > 0 {
			if err := ns.Arm(ctx, strings.Join(specs, ";")); err != nil {
				return fmt.Errorf("node %s: %w", name, err)
			}
		}
		cl.marks[name] = ns.Trace.Mark()
	}
	return nil
}

// triggerStack is the stack whose trace fault i's trigger reads and whose
// agent parks at it (Fault.Node: another node of the cluster), with the
// mark its trigger reads from (mark: the case's own stack's).
func (cr *caseRun) triggerStack(i, mark int) (*stack.Stack, int, error) {
	node := cr.s.Faults[i].Node
	if node == "" || cr.cl != nil && node == cr.cl.names[0] {
		return cr.st, mark, nil
	}
	if cr.cl == nil || cr.cl.nodes[node] == nil {
		return nil, 0, harnessErr(fmt.Errorf("fault %d: trigger on node %q, not a node of the case's cluster", i, node))
	}
	return cr.cl.nodes[node], cr.cl.marks[node], nil
}

// nodeUnit is the agent unit of a cluster node (Fault.Unit naming a node
// other than the case's own), or the control plane's unit (Fault.Unit
// "controlplane"); "" when unit names none.
func (cr *caseRun) nodeUnit(unit string) string {
	if cr.cl == nil || unit == "" || unit == cr.cl.names[0] {
		return ""
	}
	if unit == scenarios.UnitControlPlane {
		return cr.cl.cpUnit
	}
	if ns := cr.cl.nodes[unit]; ns != nil {
		return ns.AgentUnit
	}
	return ""
}

// watchControlPlaneHeal starts polling the control plane after a fault on
// its process (Fault.Unit "controlplane") that landed at faultNs: the
// first answer to GET /v1/vms after the fault is its heal, sent on
// cr.healSeen as watchHeal does for the registry (0: none within
// healWatchTimeout); converge_after_heal_ms is measured from it.
func (cr *caseRun) watchControlPlaneHeal(f scenarios.Fault, faultNs int64) {
	if f.Unit != scenarios.UnitControlPlane || cr.cl == nil || cr.healSeen != nil {
		return
	}
	ch := make(chan int64, 1)
	cr.healSeen = ch
	c := controlplane.NewClient(cr.cl.sock, 200*time.Millisecond)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), healWatchTimeout)
		defer cancel()
		for ctx.Err() == nil {
			if _, err := c.List(ctx); err == nil {
				if now := failpoint.Now(); now > faultNs {
					ch <- now
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		ch <- 0
	}()
}

// otherNodesFailed counts the failed writes (agent.failed) on the cluster's
// nodes other than the case's own.
func (cr *caseRun) otherNodesFailed() int {
	if cr.cl == nil {
		return 0
	}
	n := 0
	for _, name := range cr.cl.names[1:] {
		for _, e := range cr.cl.nodes[name].Trace.Sorted() {
			if e.Point == "agent.failed" {
				n++
			}
		}
	}
	return n
}

// closeNodes tears down the other nodes' stacks, once.
func (cl *cluster) closeNodes(ctx context.Context) error {
	cl.stopWatching()
	if cl.nodesClosed {
		return nil
	}
	cl.nodesClosed = true
	var errs []error
	for _, name := range cl.names[1:] {
		if s := cl.nodes[name]; s != nil {
			errs = append(errs, s.Close(ctx))
		}
	}
	return errors.Join(errs...)
}

// close tears down the other nodes' stacks (if closeNodes did not) and the
// control plane.
func (cl *cluster) close(ctx context.Context) error {
	errs := []error{cl.closeNodes(ctx)}
	if err := cl.sup.Remove(ctx, cl.cpUnit); err != nil {
		errs = append(errs, fmt.Errorf("control plane: %w", err))
	}
	errs = append(errs, cl.obs.Close())
	if cl.caseDir != "" {
		// its log and state go with the case's logs
		for _, f := range []string{"controlplane.log", "state.json"} {
			if b, err := os.ReadFile(filepath.Join(cl.dir, f)); err == nil {
				_ = os.WriteFile(filepath.Join(cl.caseDir, "controlplane-"+f), b, 0o644)
			}
		}
	}
	errs = append(errs, os.RemoveAll(cl.dir))
	return errors.Join(errs...)
}

// stopWatching ends the migration's watch and waits for its last listing
// (before any stack is torn down: a vmctl of the watch would outlive it).
func (cl *cluster) stopWatching() {
	if cl.stopWatch != nil {
		cl.stopWatch()
		<-cl.watchDone
		cl.stopWatch = nil
	}
}

// observeRelease judges MigrateSourceDurable at the moment a source
// releases a VM, before the release takes effect (no target acted on it
// yet): the registry must hold the VM's whole snapshot under :hibernate,
// and the source no VM of the name.
func (cr *caseRun) observeRelease(e controlplane.Event) {
	if e.Kind != controlplane.EventReleased {
		return
	}
	cl := cr.cl
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	name := e.VM.Name
	if e.From == cl.names[0] {
		// the case's own node gave the VM up, answered once this returns
		// (a power cut after it must not bring it back to life there)
		cr.noteRelease(name, failpoint.Now())
	}
	var ev []string
	if _, err := checker.ReadRegistrySnapshotOnce(ctx, cr.st.RegistryClient(5*time.Second), cr.st.RegistryURL, name); err != nil {
		ev = append(ev, fmt.Sprintf("%s released %s to %s with no snapshot durable under %s:hibernate: %v", e.From, name, e.VM.Node, name, err))
	}
	if src := cl.nodes[e.From]; src != nil {
		vm, ok, err := src.VMByName(ctx, name)
		switch {
		case err != nil:
			ev = append(ev, fmt.Sprintf("%s released %s: its VMs could not be listed: %v", e.From, name, err))
		case ok:
			ev = append(ev, fmt.Sprintf("%s released %s while still holding vm %s (%s)", e.From, name, vm.ID, vm.State))
		}
	}
	cl.mu.Lock()
	cl.bad = append(cl.bad, ev...)
	cl.mu.Unlock()
}

// clusterStep runs the harness steps of the cluster cases; ok is false for
// a step kind that is not one of them.
func (cr *caseRun) clusterStep(ctx context.Context, step scenarios.Step, budget time.Duration) (ok bool, err error) {
	switch step.Kind {
	case scenarios.StepPlace, scenarios.StepMigrate, scenarios.StepAwaitMigrated:
	case scenarios.StepExpectParked:
		return true, cr.expectParked(ctx, step.VM, step.Refused, budget)
	case scenarios.StepExpectImageRefusedOn:
		return true, cr.expectImageRefusedOn(ctx, step.VM, step.Node, budget)
	default:
		return false, nil
	}
	if cr.cl == nil {
		return true, harnessErr(fmt.Errorf("%s step in a case without a cluster (Env.Nodes < 2)", step.Kind))
	}
	node := cr.cl.nodes[step.Node]
	if node == nil {
		return true, harnessErr(fmt.Errorf("%s %s: no node %q in the cluster %v", step.Kind, step.VM, step.Node, cr.cl.names))
	}
	if step.Kind == scenarios.StepAwaitMigrated {
		return true, cr.awaitMigrated(ctx, step.VM, step.Node, budget)
	}
	if step.Kind == scenarios.StepMigrate {
		cr.cycles[step.VM] = true // the target must bring the guest's RAM back
		cr.cl.mu.Lock()
		cr.cl.moved[step.VM] = moveTime{time.Now(), failpoint.Now()}
		cr.cl.mu.Unlock()
	}
	image := baseSnapshot
	if step.Image != "" {
		// another image (a new release of it): imported on the node first
		image = step.Image
		if _, err := node.Vmctl(ctx, "snapshot", "inspect", image); err != nil {
			if _, err := node.Vmctl(ctx, "snapshot", "import", "--name", image, cr.r.run.BaseExport); err != nil {
				return true, harnessErr(fmt.Errorf("import image %s on %s: %w", image, step.Node, err))
			}
		}
	}
	if _, err := cr.cl.client.Place(ctx, step.VM, controlplane.Placement{Snapshot: image, Node: step.Node}); err != nil {
		return true, harnessErr(err)
	}
	// the case's own stack is the one the final checker reads: the VM's
	// goal there is ready where it is placed, gone where it moved away
	if node == cr.st {
		cr.goals[step.VM] = checker.GoalReady
	} else {
		cr.goals[step.VM] = checker.GoalDeleted
	}
	if step.Kind == scenarios.StepMigrate {
		cr.watchMigration(step.VM)
		if step.Wait {
			return true, cr.awaitMigrated(ctx, step.VM, step.Node, budget)
		}
		return true, nil
	}
	if !step.Wait {
		return true, nil
	}
	if err := cr.waitPlaced(ctx, step.VM, step.Node, budget); err != nil {
		return true, err
	}
	if node == cr.st {
		if v, err := cr.st.Agent.Get(ctx, step.VM); err == nil {
			cr.gens[step.VM] = v.Generation
			// ready at its generation: the placement is the agent's
			// acknowledged intent (a power cut must keep it)
			cr.noteAck(step.VM, v.Generation, false, failpoint.Now())
		}
	}
	return true, nil
}

// awaitMigrated waits until name is live on node alone, records how long
// the migration took, and verifies the guest's ledger there.
func (cr *caseRun) awaitMigrated(ctx context.Context, name, node string, budget time.Duration) error {
	if err := cr.waitPlaced(ctx, name, node, budget); err != nil {
		return err
	}
	cr.cl.mu.Lock()
	mt, ok := cr.cl.moved[name]
	cr.cl.mu.Unlock()
	if ok {
		ms := float64(time.Since(mt.wall)) / float64(time.Millisecond)
		cr.rc.MigrateMs = &ms
	}
	if cr.cl.migrated == nil {
		cr.cl.migrated = map[string]string{}
	}
	cr.cl.migrated[name] = node
	return cr.verifyMigrated(ctx, name, cr.cl.nodes[node], budget)
}

// releasedEarly: observeRelease recorded a MigrateSourceDurable violation.
func (cl *cluster) releasedEarly() bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return len(cl.bad) > 0
}

// watchMigration samples every node's VMs of name until teardown: two
// nodes with a live VM of it at once violate ClusterOneLiveVM, whenever
// it happens (a fault may make it brief).
func (cr *caseRun) watchMigration(name string) {
	cl := cr.cl
	cl.mu.Lock()
	cl.watched[name] = true
	cl.mu.Unlock()
	if cl.stopWatch != nil {
		return // the watch samples every VM moved so far
	}
	ctx, cancel := context.WithCancel(context.Background())
	cl.stopWatch, cl.watchDone = cancel, make(chan struct{})
	go func() {
		defer close(cl.watchDone)
		for ctx.Err() == nil {
			cl.mu.Lock()
			names := make([]string, 0, len(cl.watched))
			for n := range cl.watched {
				names = append(names, n)
			}
			cl.mu.Unlock()
			for _, name := range names {
				if live, _, err := cr.clusterHolders(ctx, name, ""); err == nil && len(live) > 1 {
					cl.mu.Lock()
					if len(cl.two) < 5 {
						cl.two = append(cl.two, fmt.Sprintf("%s live on %d nodes at once: %s", name, len(live), strings.Join(live, ", ")))
					}
					cl.mu.Unlock()
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

// waitPlaced waits until node's agent has name ready at its generation and
// no other node holds any record or VM of it, judging ClusterOneLiveVM and
// MigrateSourceDurable on every poll.
func (cr *caseRun) waitPlaced(ctx context.Context, name, node string, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	var last string
	for {
		cr.cl.mu.Lock()
		bad, two := append([]string(nil), cr.cl.bad...), append([]string(nil), cr.cl.two...)
		cr.cl.mu.Unlock()
		if len(bad) > 0 {
			return productErr(checker.MigrateSourceDurable, errors.New(strings.Join(bad, "; ")))
		}
		if len(two) > 0 {
			return productErr(checker.ClusterOneLiveVM, errors.New(strings.Join(two, "; ")))
		}
		live, elsewhere, err := cr.clusterHolders(ctx, name, node)
		switch {
		case err != nil:
			last = err.Error()
		case len(live) > 1 && cr.cl.releasedEarly():
			// The source released the VM too early and the target acted
			// on it while this poll listed the nodes: the release is the
			// cause, seen first (observeRelease runs before a release takes
			// effect), the two live VMs its consequence.
			continue
		case len(live) > 1:
			return productErr(checker.ClusterOneLiveVM, fmt.Errorf("%s is live on %d nodes at once: %s", name, len(live), strings.Join(live, ", ")))
		case len(elsewhere) > 0:
			last = "still held by " + strings.Join(elsewhere, ", ")
		default:
			v, gerr := cr.cl.nodes[node].Agent.Get(ctx, name)
			if gerr == nil && v.Status.Lifecycle == checker.GoalReady && v.Status.ObservedGeneration >= v.Generation {
				return nil
			}
			last = fmt.Sprintf("%s on %s: %s %q (%v)", name, node, v.Status.Lifecycle, v.Status.Message, gerr)
		}
		if time.Now().After(deadline) {
			return productErr(checker.IntentGoal, fmt.Errorf("%s not live on %s alone within %s (last: %s)", name, node, budget, last))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// clusterHolders lists the nodes with a live VM of name ("node:id state")
// and the nodes other than node that still hold a record or a VM of it.
func (cr *caseRun) clusterHolders(ctx context.Context, name, node string) (live, elsewhere []string, err error) {
	for _, n := range cr.cl.names {
		s := cr.cl.nodes[n]
		vms, lerr := s.ListVMs(ctx)
		if lerr != nil {
			return nil, nil, fmt.Errorf("node %s: list: %w", n, lerr)
		}
		held := false
		for _, v := range vms {
			if v.Name != name {
				continue
			}
			held = true
			if v.State != vmctlapi.StateStopped {
				live = append(live, fmt.Sprintf("%s:%s %s", n, v.ID, v.State))
			}
		}
		if n == node {
			continue
		}
		if _, gerr := s.Agent.Get(ctx, name); gerr == nil {
			held = true
		} else if !errors.Is(gerr, stack.ErrNotFound) {
			return nil, nil, fmt.Errorf("node %s: agent: %w", n, gerr)
		}
		if held {
			elsewhere = append(elsewhere, n)
		}
	}
	sort.Strings(live)
	return live, elsewhere, nil
}

// verifyMigrated lists the migrated guest's ledger on its new node: every
// marker acked on the source must be there, RAM ones under the same boot
// id (the wake restored the source's memory, not a fresh boot).
func (cr *caseRun) verifyMigrated(ctx context.Context, name string, node *stack.Stack, budget time.Duration) error {
	if err := cr.wokeFromHibernate(name, node); err != nil {
		return err
	}
	if cr.ledger[name] == 0 {
		return nil // no marker was written: nothing to hold
	}
	_, addr, ok, err := node.GuestOf(ctx, name)
	if err != nil || !ok || addr == "" {
		return productErr(checker.LedgerClean, fmt.Errorf("migrated %s has no guest address on its node (listed %v, %v)", name, ok, err))
	}
	vctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	opts := ledger.VerifyOpts{ExpectRAM: true}
	if why := cr.coldBootReason(); why != "" {
		// a power cut killed the source's VMM before its hibernate saved
		// the guest's RAM: the wake brings back a fresh boot, its disk
		// markers kept
		opts.ColdBootAllowed = why
	}
	v, err := cr.st.Ledger.Verify(vctx, ledger.Guest{Name: name, Addr: addr}, opts)
	if err != nil {
		return harnessErr(fmt.Errorf("verify the migrated guest: %w", err))
	}
	cr.rc.Ledger = append(cr.rc.Ledger, reports.LedgerVerdict{Guest: v.Guest, Stable: v.Stable, Lost: v.Lost,
		InFlight: v.InFlight, Phantom: v.Phantom, LostNames: v.LostNames, PhantomNames: v.PhantomNames, OK: v.OK, Message: v.Message})
	if !v.OK {
		return productErr(checker.LedgerClean, fmt.Errorf("migrated %s: %s", name, v.Message))
	}
	return nil
}

// expectParked waits until the case's own node reports name failed with
// its automatic retries exhausted (a leftover failed the next change must
// get past).
//
// With refused (Step.Refused) the parked failure is the product's refusal
// the case expects: its message must name it, and a VM that never parks so
// is the product's failure (it went on where it must refuse), not a
// precondition the harness missed.
func (cr *caseRun) expectParked(ctx context.Context, name, refused string, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	var last string
	for {
		v, err := cr.st.Agent.Get(ctx, name)
		switch {
		case err != nil:
			last = err.Error()
		case v.Status.Lifecycle == nodeagent.LifecycleFailed && strings.Contains(v.Status.Message, "retries exhausted") &&
			strings.Contains(v.Status.Message, refused):
			return nil
		default:
			last = fmt.Sprintf("%s %q", v.Status.Lifecycle, v.Status.Message)
		}
		if time.Now().After(deadline) && refused != "" {
			return productErr(GoalReached, fmt.Errorf("%s never refused %q within %s (last: %s)", name, refused, budget, last))
		}
		if time.Now().After(deadline) {
			return harnessErr(fmt.Errorf("%s never parked failed within %s (last: %s): the leftover failed the case needs did not happen", name, budget, last))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// guestNode is the stack whose guest of name the harness reads: the node a
// migration moved it to, else the case's own stack.
func (cr *caseRun) guestNode(name string) *stack.Stack {
	if cr.cl != nil {
		if n := cr.cl.migrated[name]; n != "" {
			return cr.cl.nodes[n]
		}
	}
	return cr.st
}

// wokeFromHibernate judges NoFreshBootOverHibernate on the target: its
// trace must show the VM's create become a wake (agent.wake.begin) since
// the move, and no fresh create reach its clone.
func (cr *caseRun) wokeFromHibernate(name string, node *stack.Stack) error {
	cr.cl.mu.Lock()
	since := cr.cl.moved[name].trace
	cr.cl.mu.Unlock()
	woke, fresh := false, false
	for _, e := range node.Trace.Sorted() {
		if e.VM != name || e.TsNs < since {
			continue
		}
		switch e.Point {
		case "agent.wake.begin":
			woke = true
		case "agent.create.cloned":
			fresh = true
		}
	}
	if fresh || !woke {
		return productErr(checker.NoFreshBootOverHibernate, fmt.Errorf("%s on its target: a fresh create reached its clone: %v, a wake began: %v (the source pushed %s:hibernate before its release)", name, fresh, woke, name))
	}
	return nil
}

// expectImageRefusedOn waits until node's agent refuses to restore name
// into another image than its :hibernate snapshot was taken from (failed,
// reason image_changed) while node holds no VM of it; a VM of the name on
// node, or a ready lifecycle there, violates ImageGuard.
func (cr *caseRun) expectImageRefusedOn(ctx context.Context, name, nodeName string, budget time.Duration) error {
	node := cr.cl.nodes[nodeName]
	if node == nil {
		return harnessErr(fmt.Errorf("expect-image-refused-on: no node %q", nodeName))
	}
	deadline := time.Now().Add(budget)
	var last string
	for {
		v, err := node.Agent.Get(ctx, name)
		vm, exists, lerr := node.VMByName(ctx, name)
		switch {
		case err != nil || lerr != nil:
			last = fmt.Sprint(errors.Join(err, lerr))
		case exists:
			return productErr(checker.ImageGuard, fmt.Errorf("%s restored %s into another image: vm %s (%s) exists (agent: %s %s %q)",
				nodeName, name, vm.ID, vm.State, v.Status.Lifecycle, v.Status.FailedReason, v.Status.Message))
		case v.Status.Lifecycle == nodeagent.LifecycleReady:
			return productErr(checker.ImageGuard, fmt.Errorf("%s: %s is ready on image %s", nodeName, name, v.Intent.Snapshot))
		case v.Status.Lifecycle == nodeagent.LifecycleFailed && v.Status.FailedReason == "image_changed":
			return nil
		default:
			last = fmt.Sprintf("%s %s %q", v.Status.Lifecycle, v.Status.FailedReason, v.Status.Message)
		}
		if time.Now().After(deadline) {
			return productErr(checker.ImageGuard, fmt.Errorf("%s: no image_changed refusal of %s within %s (last: %s)", nodeName, name, budget, last))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
