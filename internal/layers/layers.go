// Package layers holds the import rules of the module and the checker that
// enforces them over `go list -deps -json` (docs/architecture.md §1: the
// product under test knows no harness, the judge reads only wire types). The
// Kubernetes tree keeps the same kind of rules in .import-restrictions files;
// here they are one table, Rules, and layers_test.go runs it on every test
// run.
package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
)

// Module is the module path; every pattern below is relative to it.
const Module = "github.com/vmchaos/vmchaos"

// Patterns are module-relative package paths; "x/..." is x and everything
// under it.

// Product is the system under test and the neutral leaf packages it may use:
// the manager and the agent, their binaries, their wire types, and the
// product-side packages the harness uses in turn (never the other way).
var Product = []string{
	"vmctl/...", "nodeagent/...", "cmd/vmctl", "cmd/nodeagent", "cmd/controlplane",
	"chapi", "durable", "failpoint", "timescale", "internal/rt",
	"regress", // the product's planted-bug switches
	// JSON over a unix socket: the agent's control plane client and the
	// harness's agent client (NeutralLeaves)
	"internal/unixhttp",
	// Launch-side pieces moved out of realch (TAP, DHCP, netns, the cidata
	// seed, the qcow2 writer); absent until that move lands.
	"vmnet/...", "cidata/...", "qcow2/...",
	// The manager adapter contract and its adapters: the bundled agent
	// drives its manager only through them (issue 33 item 1,
	// docs/architecture.md §14), and the harness drives them too. Being
	// product, they may import no harness package.
	"manager/...",
	// The cluster's control plane (docs/controlplane.md): the agents
	// reconcile against it as the field's agent does against its API
	// server, so it is product; the harness serves it.
	"controlplane/...",
}

// NeutralLeaves are the product-side packages the harness uses for the
// same job the product does (one copy of the code, never a harness copy):
// they import nothing of the module.
var NeutralLeaves = []string{"internal/unixhttp"}

// Harness is what drives and judges the product.
var Harness = []string{
	"fakech/...", "realch/...", "ledger/...", "injector/...", "scenarios/...",
	"reports/...", "powercut/...", "lazyfs/...",
}

// Wire is the wire-type packages: the JSON shapes of vmctl's verbs and of
// the agent's HTTP API.
var Wire = []string{"vmctl/api", "nodeagent/api"}

// productInternals is the product minus its wire types, for the rules that
// allow the latter.
var productInternals = []string{"vmctl/...", "nodeagent/...", "cmd/vmctl", "cmd/nodeagent"}

// Rule is one import restriction. A package matching From must not reach,
// through any chain of imports, a module package that is denied: one that
// matches Deny (and not Except), or, when Allow is set, one outside Allow.
// StdOnly also denies every package outside the module that is not in the
// standard library.
type Rule struct {
	Name    string
	Why     string
	From    []string
	Allow   []string // nil: no allow list
	Deny    []string
	Except  []string
	StdOnly bool
}

// Rules is the module's import policy.
var Rules = []Rule{
	{
		Name: "product → harness",
		Why:  "a manager under test must behave the same with any harness; it may use only product packages",
		From: Product, Allow: Product, Deny: Harness,
	},
	{
		Name: "neutral leaves → anything",
		Why:  "a leaf both the product and the harness link must bring neither along: standard library only",
		From: NeutralLeaves, Allow: []string{}, StdOnly: true,
	},
	{
		Name: "wire types → beyond std",
		Why:  "the wire types are the contract; readers link them without linking the product",
		From: Wire, Allow: Wire, StdOnly: true,
	},
	{
		Name: "checker → product internals",
		Why:  "the judge, the stack and the manager adapters read the product only through its wire types",
		From: []string{"scenarios/checker", "scenarios/stack", "manager/..."},
		Deny: productInternals, Except: Wire,
	},
	{
		Name: "agent → vmctl internals",
		Why:  "the agent drives vmctl as child processes; it reads vmctl's output, not its library",
		From: []string{"nodeagent/...", "cmd/nodeagent"},
		Deny: []string{"vmctl/...", "cmd/vmctl"}, Except: []string{"vmctl/api"},
	},
	{
		Name: "fakech → product",
		Why:  "the fake VMM stands in for cloud-hypervisor and knows nothing of the manager that drives it",
		From: []string{"fakech/..."}, Deny: productInternals,
	},
	{
		Name: "ledger → product",
		Why:  "the ledger records what the harness saw; it must not share code with what it judges",
		From: []string{"ledger/..."}, Deny: productInternals,
	},
}

// Package is the part of `go list -json` the rules read.
type Package struct {
	ImportPath string
	Standard   bool
	Imports    []string
	Error      *struct{ Err string }
}

// Edge is one import: Importer imports Imported (module-relative for module
// packages, full paths otherwise).
type Edge struct{ Importer, Imported string }

// Finding is one import that breaks a rule: Edge is where the chain leaves
// what the rule allows, Chain one shortest path to it from a governed
// package.
type Finding struct {
	Rule  string
	Edge  Edge
	Chain []string
}

func (f Finding) String() string {
	return fmt.Sprintf("%s: %s imports %s (chain %s)", f.Rule, f.Edge.Importer, f.Edge.Imported, strings.Join(f.Chain, " → "))
}

// Match reports whether the module-relative path rel matches one of pats.
func Match(rel string, pats []string) bool {
	for _, p := range pats {
		if base, ok := strings.CutSuffix(p, "/..."); ok {
			if rel == base || strings.HasPrefix(rel, base+"/") {
				return true
			}
		} else if rel == p {
			return true
		}
	}
	return false
}

// Rel is path relative to Module, and whether it is in the module.
func Rel(path string) (string, bool) {
	if rest, ok := strings.CutPrefix(path, Module+"/"); ok {
		return rest, true
	}
	return path, path == Module
}

// denied tells whether the rule forbids reaching pkg.
func (r Rule) denied(pkg Package) bool {
	rel, inModule := Rel(pkg.ImportPath)
	if !inModule {
		return r.StdOnly && !pkg.Standard
	}
	if Match(rel, r.Deny) && !Match(rel, r.Except) {
		return true
	}
	return r.Allow != nil && !Match(rel, r.Allow)
}

// Check runs every rule over graph (one entry per package, as `go list
// -deps -json` gives them) and returns the findings, one per offending edge,
// sorted.
func Check(rules []Rule, graph []Package) []Finding {
	byPath := make(map[string]Package, len(graph))
	for _, p := range graph {
		byPath[p.ImportPath] = p
	}
	var out []Finding
	for _, r := range rules {
		seen := map[Edge]bool{}
		for _, src := range sortedSources(r, graph) {
			for _, f := range r.walk(src, byPath) {
				if !seen[f.Edge] {
					seen[f.Edge] = true
					out = append(out, f)
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

func sortedSources(r Rule, graph []Package) []string {
	var srcs []string
	for _, p := range graph {
		if rel, ok := Rel(p.ImportPath); ok && Match(rel, r.From) {
			srcs = append(srcs, p.ImportPath)
		}
	}
	sort.Strings(srcs)
	return srcs
}

// walk goes breadth first from src through the packages the rule allows and
// stops at each denied one: the edge into it is where the boundary is
// crossed, so a harness package imported through another harness package is
// reported once, at the first crossing, and every allowed package that
// imports a denied one is named.
func (r Rule) walk(src string, byPath map[string]Package) []Finding {
	parent := map[string]string{src: ""}
	queue := []string{src}
	var out []Finding
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, imp := range byPath[cur].Imports {
			pkg, ok := byPath[imp]
			if !ok {
				pkg = Package{ImportPath: imp, Standard: isStd(imp)}
			}
			if r.denied(pkg) {
				c := append(chain(parent, cur), rel(imp))
				out = append(out, Finding{Rule: r.Name, Edge: Edge{rel(cur), rel(imp)}, Chain: c})
				continue
			}
			if _, done := parent[imp]; done {
				continue
			}
			if _, inModule := Rel(imp); inModule { // outside packages never import the module
				parent[imp] = cur
				queue = append(queue, imp)
			}
		}
	}
	return out
}

// isStd is go list's rule for a path it did not list: the standard library
// has no dot in its first element.
func isStd(path string) bool { return !strings.Contains(strings.Split(path, "/")[0], ".") }

func rel(path string) string {
	r, _ := Rel(path)
	return r
}

func chain(parent map[string]string, last string) []string {
	var c []string
	for p := last; p != ""; p = parent[p] {
		c = append([]string{rel(p)}, c...)
	}
	return c
}

// List runs `go list -deps -json` in dir with the extra args (patterns,
// -overlay) and decodes its packages; a package go list could not load is an
// error, so a broken tree never reads as a clean one.
func List(dir string, args ...string) ([]Package, error) {
	argv := append([]string{"list", "-deps", "-json=ImportPath,Standard,Imports,Error"}, args...)
	cmd := exec.Command("go", argv...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w: %s", strings.Join(argv, " "), err, stderr.Bytes())
	}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p Package
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list: decode: %w", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("go list %s: no packages", strings.Join(args, " "))
	}
	return pkgs, nil
}
