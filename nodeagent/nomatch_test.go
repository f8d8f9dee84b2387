package nodeagent

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// matchFuncs are calls that match text.
var matchFuncs = map[string]bool{
	"Contains": true, "HasPrefix": true, "HasSuffix": true, "Index": true, "EqualFold": true, "Cut": true,
	"CutPrefix": true, "CutSuffix": true, "MatchString": true, "FindStringSubmatch": true, "FindString": true,
	"Match": true, "FindSubmatch": true,
}

// managerTextMatches lists the places in src where text a manager printed
// (a child's Stderr, an error's Error() or Message(), vmctl's Msg*/
// EjectPending strings) is matched by strings or regexp calls, and every
// declaration of the pre-issue-33 parse helpers.
func managerTextMatches(t *testing.T, name string, src any) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			switch n.Name.Name {
			case "ParseSnapshotHolder", "ParseVMNameHolder", "childMessage":
				out = append(out, fset.Position(n.Pos()).String()+": declares "+n.Name.Name)
			}
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || !matchFuncs[sel.Sel.Name] {
				return true
			}
			for _, arg := range n.Args {
				if what := managerText(arg); what != "" {
					out = append(out, fset.Position(n.Pos()).String()+": "+sel.Sel.Name+" on "+what)
				}
			}
		}
		return true
	})
	return out
}

// managerText names the manager output in e, or "".
func managerText(e ast.Expr) string {
	var what string
	ast.Inspect(e, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			s := n.Sel.Name
			if s == "Stderr" || s == "Error" || s == "Message" || s == "EjectPending" || strings.HasPrefix(s, "Msg") {
				what = s
			}
		case *ast.Ident:
			if n.Name == "stderr" {
				what = n.Name
			}
		}
		return what == ""
	})
	return what
}

// TestAgentMatchesNoManagerText: the agent branches on the adapter's typed
// refusals (manager.Refusal) and never matches what its manager printed
// (issue 33 item 1). It fails on any such match in the package's code.
func TestAgentMatchesNoManagerText(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, p := range files {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, m := range managerTextMatches(t, p, b) {
			t.Errorf("the agent matches its manager's text: %s", m)
		}
	}
	if checked < 10 {
		t.Fatalf("only %d source files found: the test is not looking at the package", checked)
	}
}

// TestManagerTextMatchesFindsThePlanted: the scan above finds each form the
// agent used before issue 33, so its silence on the package means something.
func TestManagerTextMatchesFindsThePlanted(t *testing.T) {
	const planted = `package p
func ParseSnapshotHolder(msg string, onlyExists bool) (string, bool) { return "", false }
func childMessage(err error) string { return "" }
func a(err error, ce *ChildError, stderr string) bool {
	return strings.Contains(childMessage(err), vmctl.EjectPending) ||
		strings.Contains(ce.Message(), vmctl.MsgVMNotFound) ||
		reSnapLeaseHeld.MatchString(ce.Stderr) ||
		strings.HasPrefix(err.Error(), "x") ||
		strings.Contains(stderr, "vm not found")
}
func ok(name string) bool { return strings.Contains(name, "..") }
`
	got := managerTextMatches(t, "planted.go", planted)
	if len(got) != 8 {
		t.Fatalf("found %d of 8 planted matches: %q", len(got), got)
	}
}
