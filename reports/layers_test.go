package reports

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// invariantName is the shape of an invariant's name: kebab-case.
var invariantName = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)+$`)

// namesIn collects, from the non-test Go files of dir, every kebab-case
// string constant and every string literal given as a composite literal's
// Name: that is where the checker and the runner name their invariants.
func namesIn(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			var lit *ast.BasicLit
			switch n := n.(type) {
			case *ast.ValueSpec:
				if len(n.Values) == 1 {
					lit, _ = n.Values[0].(*ast.BasicLit)
				}
			case *ast.KeyValueExpr:
				if k, ok := n.Key.(*ast.Ident); ok && k.Name == "Name" {
					lit, _ = n.Value.(*ast.BasicLit)
				}
			}
			if lit != nil && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil && invariantName.MatchString(s) {
					out[s] = true
				}
			}
			return true
		})
	}
	return out
}

// notInvariants are kebab-case names in the checker and runner that are
// not invariants: kebab-case constants of the runner that name something
// else (the scan cannot tell).
var notInvariants = map[string]bool{
	"tgt-cut": true, // runner/mgrworkload.go mgrCutClone: the VM the manager workload judgement clones
}

// TestEveryInvariantHasALayer: every invariant the checker and the runner
// can emit is attributed to a layer, so no failure is reported unattributed.
func TestEveryInvariantHasALayer(t *testing.T) {
	names := map[string]bool{}
	for _, d := range []string{"../scenarios/checker", "../scenarios/runner"} {
		for n := range namesIn(t, d) {
			names[n] = true
		}
	}
	if len(names) < 40 {
		t.Fatalf("found only %d invariant names: the scan is broken", len(names))
	}
	for n := range names {
		if LayerOf(n) == "" && !notInvariants[n] {
			t.Errorf("invariant %q has no layer (reports/layers.go invariantLayers), or add it to notInvariants if it is no invariant", n)
		}
	}
}

func TestAttributeLayers(t *testing.T) {
	invs := []Invariant{
		{Name: "intent-goal"}, {Name: "no-orphan-vmm"}, {Name: "ledger-clean", HarnessError: true},
		{Name: "one-vm-per-name", OK: true}, {Name: "brand-new"}, {Name: "no-paused-running"},
	}
	got := AttributeLayers(invs)
	want := "manager: no-orphan-vmm, no-paused-running; agent: intent-goal; harness: ledger-clean; unattributed: brand-new"
	if got != want {
		t.Errorf("AttributeLayers = %q, want %q", got, want)
	}
	for i, l := range []string{"agent", "manager", "harness", "", "unattributed", "manager"} {
		if invs[i].Layer != l {
			t.Errorf("%s: layer %q, want %q", invs[i].Name, invs[i].Layer, l)
		}
	}
}
