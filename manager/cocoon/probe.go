package cocoon

import (
	"context"
	"fmt"
	"strings"

	"github.com/vmchaos/vmchaos/manager"
)

// HelpFunc returns the help page of one command path ("" for the root,
// "vm", "vm run"): the output of `cocoon PATH --help`.
type HelpFunc func(ctx context.Context, path string) (string, error)

// CLI is what the cocoon binary in front of the adapter has, read from its
// own help pages and `cocoon version` (issue 32 item 4): the capability
// table, and per command the flag that asks it for JSON.
type CLI struct {
	Caps manager.Capabilities
	// jsonFlag is, per command path, the argv that asks for JSON ("-o",
	// "--format"); a path without one is absent.
	jsonFlag map[string]string
	// rootErr: `cocoon --help` itself failed; the binary is not a cocoon
	// CLI the adapter can read, which is an error, not a missing verb.
	rootErr error
}

// Err is why the binary's CLI could not be read at all (nil when it could).
func (c *CLI) Err() error { return c.rootErr }

// JSONFlag is the flag that makes path print JSON, if it has one.
func (c *CLI) JSONFlag(path string) (string, bool) {
	f, ok := c.jsonFlag[path]
	return f, ok
}

// need is what one capability requires of the binary: commands, each with
// the flags the adapter passes to it, and whether it must print JSON.
type need struct {
	cap   string
	paths []string
	flags map[string][]string // per path, long flags the adapter passes
	json  bool                // every path needs a JSON output flag
}

// needs is the table the probe walks. The flags are exactly those Command,
// EventCommand and the Observer pass; a flag a build lacks would make the
// verb fail with cobra's "unknown flag", so it makes the capability missing
// instead (a v0.2.x `vm run` has no -o: issue 32).
var needs = []need{
	{cap: string(manager.VerbCreate), paths: []string{"vm run"}, flags: map[string][]string{"vm run": {"name", "nics", "cpu", "memory"}}},
	// --nics: the agent's clone sets the NIC count (manager.Call.NICs).
	{cap: string(manager.VerbClone), paths: []string{"vm clone"}, flags: map[string][]string{"vm clone": {"name", "nics"}}},
	{cap: string(manager.VerbSnapshotSave), paths: []string{"snapshot save"}, flags: map[string][]string{"snapshot save": {"name"}}},
	{cap: string(manager.VerbSnapshotRm), paths: []string{"snapshot rm"}},
	{cap: string(manager.VerbRestore), paths: []string{"vm restore"}},
	{cap: string(manager.VerbStart), paths: []string{"vm start"}},
	{cap: string(manager.VerbStop), paths: []string{"vm stop"}},
	{cap: string(manager.VerbRm), paths: []string{"vm rm"}, flags: map[string][]string{"vm rm": {"force"}}},
	{cap: string(manager.VerbGC), paths: []string{"gc"}},
	{cap: manager.FeatureVerbJSON, paths: []string{"vm run", "vm clone", "vm restore"}, json: true},
	{cap: manager.FeatureListJSON, paths: []string{"vm list", "snapshot list"}, json: true},
	{cap: manager.FeatureEvents, paths: []string{"vm status"}, flags: map[string][]string{"vm status": {"event", "interval"}}, json: true},
	{cap: manager.FeatureCNIDirs, paths: []string{""}, flags: map[string][]string{"": {"cni-conf-dir", "cni-bin-dir"}}},
	{cap: manager.FeatureNIC, paths: []string{"vm net"}},
	{cap: manager.FeatureGuestExec, paths: []string{"vm exec"}},
	{cap: manager.FeatureCheck, paths: []string{"check"}},
	// The embedder's verbs (the bundled agent): `vm inspect` prints JSON
	// without a flag (its help: "Show detailed VM info (JSON)").
	{cap: manager.FeatureInspect, paths: []string{"vm inspect"}},
	{cap: manager.FeatureExport, paths: []string{"snapshot export"}, flags: map[string][]string{"snapshot export": {"output"}}},
	{cap: manager.FeatureImport, paths: []string{"snapshot import"}, flags: map[string][]string{"snapshot import": {"name"}}},
}

// Probe reads the binary's CLI. A page that cannot be read makes only the
// capabilities that need it missing, with the error as their reason; the
// others stand, so one verb's failure never hides the rest.
func Probe(ctx context.Context, bin string, help HelpFunc, version func(context.Context) (string, error)) *CLI {
	p := &prober{ctx: ctx, help: help, pages: map[string]page{}}
	cli := &CLI{jsonFlag: map[string]string{}, Caps: manager.Capabilities{Manager: "cocoon", Bin: bin}}
	if v, err := version(ctx); err != nil {
		cli.Caps.Version = "unknown (cocoon version: " + err.Error() + ")"
	} else {
		cli.Caps.Version = ParseVersion(v)
	}
	byName := map[string]manager.Capability{string(manager.VerbRecoverStale): p.recoverStale()}
	for _, n := range needs {
		byName[n.cap] = p.check(n)
	}
	for _, n := range manager.CapabilityNames {
		it, ok := byName[n]
		if !ok {
			it = manager.Capability{Name: n, Reason: n + ": the cocoon adapter does not probe it"}
		}
		cli.Caps.Items = append(cli.Caps.Items, it)
	}
	for path, pg := range p.pages {
		if jf, ok := pg.h.JSONFlag(); ok && pg.err == nil {
			cli.jsonFlag[path] = jf
		}
	}
	if root := p.page(""); root.err != nil {
		cli.rootErr = fmt.Errorf("%s: %w", helpCmd(""), root.err)
	}
	return cli
}

// recoverStale: cocoon has no verb for a stale `creating` record (its gc
// collects one after a grace period); the reason lists the verbs it has.
func (p *prober) recoverStale() manager.Capability {
	it := manager.Capability{Name: string(manager.VerbRecoverStale)}
	if vm := p.page("vm"); vm.err != nil {
		it.Reason = fmt.Sprintf("recover-stale: %s failed: %v", helpCmd("vm"), vm.err)
	} else {
		it.Reason = fmt.Sprintf("recover-stale: cocoon has no verb for a `creating` record whose owner died: none of `cocoon vm --help`'s [%s] is one",
			strings.Join(vm.h.Commands, " "))
	}
	return it
}

// page is one help page read, or why it could not be.
type page struct {
	h   Help
	err error
}

type prober struct {
	ctx   context.Context
	help  HelpFunc
	pages map[string]page
}

// page reads path's help once.
func (p *prober) page(path string) page {
	if pg, ok := p.pages[path]; ok {
		return pg
	}
	text, err := p.help(p.ctx, path)
	pg := page{h: ParseHelp(text), err: err}
	if err == nil && len(pg.h.Flags) == 0 {
		pg.err = fmt.Errorf("no Flags section in its output (%.120q)", text)
	}
	p.pages[path] = pg
	return pg
}

// helpCmd is the command line a reason names.
func helpCmd(path string) string {
	if path == "" {
		return "`cocoon --help`"
	}
	return "`cocoon " + path + " --help`"
}

// check decides one capability: every path listed by its parent's page,
// every flag on its own page, and a JSON flag where needed.
func (p *prober) check(n need) manager.Capability {
	it := manager.Capability{Name: n.cap}
	var how []string
	for _, path := range n.paths {
		if why := p.listed(path); why != "" {
			it.Reason = why
			return it
		}
		pg := p.page(path)
		if pg.err != nil {
			it.Reason = fmt.Sprintf("%s: %s failed: %v", orRoot(path), helpCmd(path), pg.err)
			return it
		}
		form := strings.TrimSpace("cocoon " + path)
		for _, f := range n.flags[path] {
			if _, ok := pg.h.Flags[f]; !ok {
				it.Reason = fmt.Sprintf("%s: no --%s in %s", orRoot(path), f, helpCmd(path))
				return it
			}
			form += " --" + f
		}
		if n.json {
			jf, ok := pg.h.JSONFlag()
			if !ok {
				it.Reason = fmt.Sprintf("%s: no JSON output flag (-o/--output/--format json) in %s", orRoot(path), helpCmd(path))
				return it
			}
			form += " " + jf + " json"
		}
		how = append(how, form)
	}
	it.Present, it.How = true, strings.Join(how, "; ")
	return it
}

// listed says why path is not a command of its parent's page ("" when it
// is).
func (p *prober) listed(path string) string {
	if path == "" {
		return ""
	}
	parent, name := "", path
	if i := strings.LastIndex(path, " "); i >= 0 {
		parent, name = path[:i], path[i+1:]
	}
	if why := p.listed(parent); why != "" {
		return why
	}
	pg := p.page(parent)
	if pg.err != nil {
		return fmt.Sprintf("%s: %s failed: %v", path, helpCmd(parent), pg.err)
	}
	if !pg.h.HasCommand(name) {
		return fmt.Sprintf("%s: not in %s", path, helpCmd(parent))
	}
	return ""
}

func orRoot(path string) string {
	if path == "" {
		return "cocoon"
	}
	return path
}

// ParseVersion turns `cocoon version`'s "Version: v0.3.8 / Git hash: 34c6…"
// into "v0.3.8 (git 34c6c4a8ebdd)"; output in another shape is kept as its
// first line.
func ParseVersion(out string) string {
	var ver, hash string
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "Version":
			ver = strings.TrimSpace(v)
		case "Git hash":
			hash = strings.TrimSpace(v)
		}
	}
	if ver == "" {
		first, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
		return first
	}
	if len(hash) > 12 {
		hash = hash[:12]
	}
	if hash != "" {
		ver += " (git " + hash + ")"
	}
	return ver
}
