package injector

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// TestFaultKindsRegistry walks the one list of fault kinds: each has a
// unique name, a one-line description and landing rule, answers Available
// on this host, is found by name, and lives in its own file.
func TestFaultKindsRegistry(t *testing.T) {
	sup, err := newBuiltin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sup.Close() })
	files := kindFiles(t)
	seen := map[string]bool{}
	for _, k := range FaultKinds {
		t.Run(k.Name(), func(t *testing.T) {
			name := k.Name()
			if name == "" || seen[name] {
				t.Fatalf("kind %T: name %q empty or listed twice", k, name)
			}
			seen[name] = true
			for what, line := range map[string]string{"Describe": k.Describe(), "Landed": k.Landed()} {
				if strings.TrimSpace(line) == "" || strings.Contains(line, "\n") {
					t.Errorf("%s: %s is not one line: %q", name, what, line)
				}
			}
			// With nothing on the host no kind can run, and it says why.
			if err := k.Available(Host{}); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s: Available(no supervisor, no node) = %v, want an error naming the kind", name, err)
			}
			// A supervisor is all every kind but the node's and the
			// disk's needs here (pidfds: this host runs the injector's
			// other tests).
			err := k.Available(Host{Sup: sup})
			if more := k.traits().node || k.traits().disk || k.traits().link; more != (err != nil) {
				t.Errorf("%s: Available(builtin supervisor) = %v (node, disk or link kind: %v)", name, err, more)
			}
			if k.traits().disk {
				if err := k.Available(Host{Sup: sup, Disk: &fakeDisk{}}); err != nil {
					t.Errorf("%s: Available(supervisor, disk) = %v", name, err)
				}
			}
			if OnLink(name) != k.traits().link {
				t.Errorf("%s: OnLink = %v, link trait %v", name, OnLink(name), k.traits().link)
			}
			if k.traits().link {
				if err := k.Available(Host{Sup: sup, Link: &fakeLink{}}); err != nil {
					t.Errorf("%s: Available(supervisor, link) = %v", name, err)
				}
			}
			if got, err := LookupFaultKind(name); err != nil || got != k {
				t.Errorf("LookupFaultKind(%q) = %v, %v", name, got, err)
			}
			typ := reflect.TypeOf(k).Name()
			if want := "kind_" + strings.ReplaceAll(name, "-", "_") + ".go"; files[typ] != want {
				t.Errorf("%s: type %s is declared in %q, want its own file %s", name, typ, files[typ], want)
			}
		})
	}
	if len(seen) != len(FaultKindNames()) {
		t.Errorf("FaultKindNames lists %d kinds, FaultKinds %d", len(FaultKindNames()), len(seen))
	}
}

// kindFiles maps each type declared in this package to its file.
func kindFiles(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	fs := token.NewFileSet()
	for _, path := range paths {
		f, err := parser.ParseFile(fs, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				out[ts.Name.Name] = path
			}
			return true
		})
	}
	return out
}

// TestUnknownFaultKindNamesTheKnownOnes: a fault of an unknown kind is
// rejected by validation and by the injector, naming every known kind.
func TestUnknownFaultKindNamesTheKnownOnes(t *testing.T) {
	sup, err := newBuiltin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sup.Close() })
	f := Fault{Kind: "sigkill-everything", Unit: "u"}
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s accepted kind %q", what, f.Kind)
		}
		for _, k := range FaultKindNames() {
			if !strings.Contains(err.Error(), k) {
				t.Errorf("%s: %q does not name known kind %s", what, err, k)
			}
		}
	}
	check("Validate", f.Validate())
	_, err = LookupFaultKind(f.Kind)
	check("LookupFaultKind", err)
	_, err = New(sup, nil, Options{}).Arm(context.Background(), f, MustParseTrigger("at p + 1ms"))
	check("Arm", err)
	if inj := New(sup, nil, Options{}).Inject(context.Background(), f); inj.Landed {
		t.Errorf("Inject of an unknown kind landed: %+v", inj)
	} else {
		check("Inject", errors.New(inj.Err))
	}
}

// fakeNode records the cut it was asked for.
type fakeNode struct {
	procs []Proc
	err   error
}

func (n *fakeNode) Cut(_ context.Context, procs []Proc) error {
	n.procs = procs
	return n.err
}

// TestPowerCutIsTheNodes: the power-cut kind cuts the node it is handed
// (the runner's powercut.Node) over the node's processes, and an Injector,
// which arms faults on units, refuses it.
func TestPowerCutIsTheNodes(t *testing.T) {
	k, err := LookupFaultKind(FaultPowerCut)
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{err: errors.New("lazyfs gone")}
	if err := k.Available(Host{Node: n}); err != nil {
		t.Errorf("Available(node) = %v", err)
	}
	procs := []Proc{{PID: 1, Start: 2}, {PID: 3, Start: 4}}
	at, err := k.Inject(context.Background(), Target{Node: n, Procs: procs})
	if !errors.Is(err, n.err) || at == 0 || !reflect.DeepEqual(n.procs, procs) {
		t.Errorf("Inject = %d, %v; cut %v, want the node's error at a stamp over %v", at, err, n.procs, procs)
	}
	if _, err := k.Inject(context.Background(), Target{Procs: procs}); err == nil {
		t.Error("Inject without a node succeeded")
	}
	sup, err := newBuiltin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sup.Close() })
	if _, err := New(sup, nil, Options{}).Arm(context.Background(), Fault{Kind: FaultPowerCut}, MustParseTrigger("at p + 1ms")); !errors.Is(err, ErrNodeFault) {
		t.Errorf("Arm(power-cut) = %v, want ErrNodeFault", err)
	}
}

// TestSigstopContinuesAfterStopForAndSigcontResumes: a sigstop with StopFor
// freezes the unit's main process and its SIGCONT comes StopFor later (the
// kind's afterSignal); one without StopFor stays frozen until a sigcont.
func TestSigstopContinuesAfterStopForAndSigcontResumes(t *testing.T) {
	s := newStack(t, KindBuiltin)
	s.loopUnit(t, "svc", "vm-s", "s.tick", 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	main, _ := s.sup.MainPID(ctx, "svc")
	stopFor := 200 * time.Millisecond
	a, err := s.inj.Arm(ctx, Fault{Kind: FaultSigstop, Unit: "svc", StopFor: stopFor}, MustParseTrigger("at s.tick + 0"))
	if err != nil {
		t.Fatal(err)
	}
	inj, err := a.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !inj.Landed || inj.VictimPID != main {
		t.Fatalf("sigstop: %+v (main %d)", inj, main)
	}
	// The next tick of the main process after the stop comes once it was
	// continued, StopFor after the signal.
	next := nextTickAfter(ctx, t, s, main, inj.ActualNs)
	if next.TsNs < inj.ActualNs+int64(stopFor) {
		t.Fatalf("main ticked at %d, before the SIGCONT due at %d", next.TsNs, inj.ActualNs+int64(stopFor))
	}
	// Without StopFor it stays stopped until a sigcont.
	frozen := s.inj.Inject(ctx, Fault{Kind: FaultSigstop, Unit: "svc"})
	if !frozen.Landed {
		t.Fatalf("sigstop without StopFor: %+v", frozen)
	}
	waitState(ctx, t, main, 'T')
	cont := s.inj.Inject(ctx, Fault{Kind: FaultSigcont, Unit: "svc"})
	if !cont.Landed {
		t.Fatalf("sigcont: %+v", cont)
	}
	if next := nextTickAfter(ctx, t, s, main, cont.ActualNs); next.Pid != main {
		t.Fatalf("tick after sigcont from pid %d, want %d", next.Pid, main)
	}
}

// nextTickAfter is the first s.tick of pid stamped after ns.
func nextTickAfter(ctx context.Context, t *testing.T, s *stack, pid int, ns int64) failpoint.Event {
	t.Helper()
	h, err := s.tr.Wait(ctx, 0, 1, func(e *failpoint.Event) bool { return e.Point == "s.tick" && e.Pid == pid && e.TsNs > ns })
	if err != nil {
		t.Fatalf("no tick of pid %d after %d: %v", pid, ns, err)
	}
	return h.Event
}

// waitState waits until pid's /proc state is st.
func waitState(ctx context.Context, t *testing.T, pid int, st byte) {
	t.Helper()
	for {
		if s, err := readStat(pid); err == nil && s.state == st {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pid %d never reached state %c", pid, st)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// fakeDisk records fills and heals.
type fakeDisk struct {
	mu           sync.Mutex
	fills, heals int
	healedNs     int64
	err          error
}

func (d *fakeDisk) Fill(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fills++
	return d.err
}

func (d *fakeDisk) Heal(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.heals++
	d.healedNs = failpoint.Now()
	return nil
}

func (d *fakeDisk) counts() (fills, heals int, healedNs int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fills, d.heals, d.healedNs
}

// TestRegistryStorageFullFillsThenHeals: the kind fills the disk it is
// handed, stamps the moment it is full and heals it StopFor later; without
// StopFor it stays full; a fill that fails is the record's error; without a
// disk the injector refuses it.
func TestRegistryStorageFullFillsThenHeals(t *testing.T) {
	sup, err := newBuiltin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sup.Close() })
	f := Fault{Kind: FaultRegistryStorageFull, Unit: "registry", StopFor: 30 * time.Millisecond}
	d := &fakeDisk{}
	inj := New(sup, nil, Options{Disk: d}).Inject(context.Background(), f)
	if !inj.Landed || inj.Err != "" || inj.ActualNs == 0 || inj.VictimPID != 0 {
		t.Fatalf("inject: %+v", inj)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		fills, heals, healedNs := d.counts()
		if fills == 1 && heals == 1 {
			if healedNs < inj.ActualNs+int64(f.StopFor) {
				t.Errorf("healed at fault%+dns, before StopFor %s", healedNs-inj.ActualNs, f.StopFor)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fills %d heals %d: want one each", fills, heals)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stay := &fakeDisk{}
	f.StopFor = 0
	if inj := New(sup, nil, Options{Disk: stay}).Inject(context.Background(), f); !inj.Landed {
		t.Fatalf("inject without StopFor: %+v", inj)
	}
	time.Sleep(50 * time.Millisecond)
	if fills, heals, _ := stay.counts(); fills != 1 || heals != 0 {
		t.Errorf("without StopFor: fills %d heals %d, want 1 and 0", fills, heals)
	}
	broken := &fakeDisk{err: errors.New("remount refused")}
	if inj := New(sup, nil, Options{Disk: broken}).Inject(context.Background(), f); inj.Landed || !strings.Contains(inj.Err, "remount refused") {
		t.Errorf("a failed fill: %+v, want not landed with its error", inj)
	}
	if inj := New(sup, nil, Options{}).Inject(context.Background(), f); inj.Landed || !strings.Contains(inj.Err, FaultRegistryStorageFull) {
		t.Errorf("no disk: %+v, want refused naming the kind", inj)
	}
}

// fakeLink records what was done to the path.
type fakeLink struct {
	mu       sync.Mutex
	ops      []string
	healedNs int64
	noNetem  error // Supports' answer for an impairment
}

func (l *fakeLink) note(op string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, op)
}

func (l *fakeLink) Partition(context.Context) error { l.note("partition"); return nil }
func (l *fakeLink) Impair(_ context.Context, n Netem) error {
	l.note("impair " + n.String())
	return nil
}
func (l *fakeLink) Supports(Netem) error { return l.noNetem }
func (l *fakeLink) Heal(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, "heal")
	l.healedNs = failpoint.Now()
	return nil
}

func (l *fakeLink) state() ([]string, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ops...), l.healedNs
}

// TestNetKindsCutOrImpairThenHeal: each net kind does its one thing to the
// path it is handed (a partition, netem delay, netem loss), stamps the
// moment it is in and heals it StopFor later; a kernel without netem makes
// the impairments unavailable, naming the kind; without a link the
// injector refuses them.
func TestNetKindsCutOrImpairThenHeal(t *testing.T) {
	sup, err := newBuiltin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sup.Close() })
	for _, c := range []struct{ kind, op string }{
		{FaultNetPartition, "partition"},
		{FaultNetDelay, "impair delay 100ms"},
		{FaultNetLoss, "impair loss 30%"},
	} {
		t.Run(c.kind, func(t *testing.T) {
			f := Fault{Kind: c.kind, Unit: "registry", StopFor: 30 * time.Millisecond}
			l := &fakeLink{}
			inj := New(sup, nil, Options{Link: l}).Inject(context.Background(), f)
			if !inj.Landed || inj.Err != "" || inj.ActualNs == 0 || inj.VictimPID != 0 {
				t.Fatalf("inject: %+v", inj)
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				ops, healedNs := l.state()
				if len(ops) == 2 {
					if ops[0] != c.op || ops[1] != "heal" {
						t.Fatalf("ops %q, want %q then heal", ops, c.op)
					}
					if healedNs < inj.ActualNs+int64(f.StopFor) {
						t.Errorf("healed at fault%+dns, before StopFor %s", healedNs-inj.ActualNs, f.StopFor)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("ops %q: want %q then heal", ops, c.op)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if inj := New(sup, nil, Options{}).Inject(context.Background(), f); inj.Landed || !strings.Contains(inj.Err, c.kind) {
				t.Errorf("no link: %+v, want refused naming the kind", inj)
			}
			k, _ := LookupFaultKind(c.kind)
			err := k.Available(Host{Sup: sup, Link: &fakeLink{noNetem: errors.New("no sch_netem")}})
			if impair := c.kind != FaultNetPartition; impair != (err != nil) || (err != nil && !strings.Contains(err.Error(), c.kind)) {
				t.Errorf("Available(a kernel without netem) = %v (an impairment: %v)", err, impair)
			}
		})
	}
}
