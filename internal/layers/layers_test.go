package layers

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("go env GOMOD: not inside a module")
	}
	return filepath.Dir(gomod)
}

// TestModuleKeepsItsLayers runs the rules over the whole module (one go
// list) and names every import that breaks one.
func TestModuleKeepsItsLayers(t *testing.T) {
	graph, err := List(moduleRoot(t), "./...")
	if err != nil {
		t.Fatal(err)
	}
	// A rule that governs no package would pass on nothing.
	for _, r := range Rules {
		if len(sortedSources(r, graph)) == 0 {
			t.Errorf("rule %q governs no package of the module: its From patterns are stale", r.Name)
		}
	}
	for _, f := range Check(Rules, graph) {
		t.Errorf("forbidden import: %s", f)
	}
}

// graphOf builds a synthetic module graph from "a imports b c" lines.
func graphOf(lines ...string) []Package {
	var g []Package
	for _, l := range lines {
		f := strings.Fields(l)
		p := Package{ImportPath: abs(f[0]), Standard: f[0] == "time"}
		for _, imp := range f[2:] {
			p.Imports = append(p.Imports, abs(imp))
		}
		g = append(g, p)
	}
	return g
}

// abs is the full path of a module-relative name; the standard library and
// third-party paths (time, example.com/x) stay as they are.
func abs(rel string) string {
	if rel == "time" || strings.Contains(rel, ".") {
		return rel
	}
	return Module + "/" + rel
}

// clean is a small module that keeps every rule.
var clean = []string{
	"cmd/vmctl imports vmctl vmctl/api",
	"cmd/nodeagent imports nodeagent",
	"vmctl imports vmctl/api durable example.com/cobra",
	"nodeagent imports vmctl/api nodeagent/api internal/unixhttp",
	"internal/unixhttp imports time",
	"vmctl/api imports time",
	"nodeagent/api imports time vmctl/api",
	"durable imports",
	"scenarios/checker imports scenarios/stack nodeagent/api manager",
	"scenarios/stack imports vmctl/api nodeagent/api realch fakech/guestimg",
	"manager imports",
	"manager/vmctl imports manager vmctl/api",
	"realch imports durable ledger/writerproto",
	"fakech/guestimg imports fakech/qcow2",
	"fakech/qcow2 imports",
	"ledger imports ledger/writerproto",
	"ledger/writerproto imports",
	"time imports",
	"example.com/cobra imports",
}

// TestCheckReportsExactlyThePlantedEdge plants one forbidden import per rule
// into a clean synthetic graph and asserts the checker names that edge, and
// only it.
func TestCheckReportsExactlyThePlantedEdge(t *testing.T) {
	if fs := Check(Rules, graphOf(clean...)); len(fs) != 0 {
		t.Fatalf("clean graph: findings %v", fs)
	}
	for _, tc := range []struct {
		plant string // replaces the clean line of the same package
		want  Finding
	}{
		{"durable imports ledger", Finding{"product → harness", Edge{"durable", "ledger"}, []string{"cmd/vmctl", "vmctl", "durable", "ledger"}}},
		{"vmctl/api imports time example.com/cobra", Finding{"wire types → beyond std", Edge{"vmctl/api", "example.com/cobra"}, []string{"nodeagent/api", "vmctl/api", "example.com/cobra"}}},
		{"scenarios/stack imports vmctl/api nodeagent/api realch fakech/guestimg vmctl", Finding{"checker → product internals", Edge{"scenarios/stack", "vmctl"}, []string{"scenarios/checker", "scenarios/stack", "vmctl"}}},
		{"nodeagent imports vmctl/api nodeagent/api vmctl", Finding{"agent → vmctl internals", Edge{"nodeagent", "vmctl"}, []string{"cmd/nodeagent", "nodeagent", "vmctl"}}},
		{"fakech/qcow2 imports nodeagent/api", Finding{"fakech → product", Edge{"fakech/qcow2", "nodeagent/api"}, []string{"fakech/guestimg", "fakech/qcow2", "nodeagent/api"}}},
		{"ledger imports ledger/writerproto vmctl", Finding{"ledger → product", Edge{"ledger", "vmctl"}, []string{"ledger", "vmctl"}}},
		{"internal/unixhttp imports time durable", Finding{"neutral leaves → anything", Edge{"internal/unixhttp", "durable"}, []string{"internal/unixhttp", "durable"}}},
	} {
		lines := slices.Clone(clean)
		name := strings.Fields(tc.plant)[0]
		i := slices.IndexFunc(lines, func(l string) bool { return strings.Fields(l)[0] == name })
		lines[i] = tc.plant
		got := Check(Rules, graphOf(lines...))
		if len(got) != 1 || got[0].String() != tc.want.String() {
			t.Errorf("planted %q: findings %v, want exactly [%v]", tc.plant, got, tc.want)
		}
	}
}

// TestCheckNamesAPlantedImportInTheRealTree gives the real tree two planted
// files through go list's -overlay (cmd/vmctl importing ledger, the checker
// importing vmctl) and asserts the checker names both imports and nothing
// else new.
func TestCheckNamesAPlantedImportInTheRealTree(t *testing.T) {
	root := moduleRoot(t)
	dir := t.TempDir()
	plants := map[string]string{
		"cmd/vmctl/zz_planted_layers.go":         "package main\n\nimport _ \"" + Module + "/ledger\"\n",
		"scenarios/checker/zz_planted_layers.go": "package checker\n\nimport _ \"" + Module + "/vmctl\"\n",
	}
	overlay := map[string]map[string]string{"Replace": {}}
	for rel, src := range plants {
		f := filepath.Join(dir, filepath.Base(filepath.Dir(rel))+".go")
		if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		overlay["Replace"][filepath.Join(root, rel)] = f
	}
	b, err := json.Marshal(overlay)
	if err != nil {
		t.Fatal(err)
	}
	ov := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ov, b, 0o644); err != nil {
		t.Fatal(err)
	}
	graph, err := List(root, "-overlay", ov, "./cmd/vmctl", "./scenarios/checker")
	if err != nil {
		t.Fatal(err)
	}
	rest := Check(Rules, graph)
	var got []string
	for _, f := range rest {
		got = append(got, f.Rule+": "+f.Edge.Importer+" imports "+f.Edge.Imported)
	}
	want := []string{
		"checker → product internals: scenarios/checker imports vmctl",
		"product → harness: cmd/vmctl imports ledger",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("planted imports: findings %q, want %q (all: %v)", got, want, rest)
	}
	t.Logf("the planted imports are named: %v", rest)
}

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		rel  string
		pats []string
		want bool
	}{
		{"vmctl", []string{"vmctl/..."}, true},
		{"vmctl/api", []string{"vmctl/..."}, true},
		{"vmctlx", []string{"vmctl/..."}, false},
		{"fakech/qcow2", []string{"qcow2/..."}, false},
		{"cmd/vmctl", []string{"cmd/vmctl"}, true},
		{"cmd/vmctl/x", []string{"cmd/vmctl"}, false},
	} {
		if got := Match(tc.rel, tc.pats); got != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tc.rel, tc.pats, got, tc.want)
		}
	}
}
