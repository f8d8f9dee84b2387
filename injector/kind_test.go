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
	"testing"
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
			// A supervisor is all every kind but the node's needs here
			// (pidfds: this host runs the injector's other tests).
			err := k.Available(Host{Sup: sup})
			if node := k.traits().node; node != (err != nil) {
				t.Errorf("%s: Available(builtin supervisor) = %v (node kind: %v)", name, err, node)
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
