package managerlayer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/manager"
)

// discover runs each op the manager supports once, unarmed, on a scratch
// store of its own, and records the VMM phases (fakech's ch.* points) the
// verb passed through, in the order of their first hit. The park cases are
// built from them: every phase this manager's verb really reaches, and no
// case for a phase it never does (vmctl's `rm --force` kills its VMM
// without a shutdown request, cocoon's asks for one).
func (r *Runner) discover(ctx context.Context, m manager.Manager) (map[manager.Verb][]string, error) {
	out := map[manager.Verb][]string{}
	for _, op := range Ops {
		if !supportsAll(m, op) {
			continue
		}
		r.mu.Lock()
		r.n++
		n := r.n
		r.mu.Unlock()
		dir := filepath.Join(r.tmp, fmt.Sprintf("d%d", n))
		cr := &caseRun{r: r, c: Case{ID: "discover-" + string(op.Verb), Op: op}, dir: dir, caseDir: dir + "-logs"}
		cr.tag = EnvCaseTag + "=" + dir
		phases, err := cr.discoverOne(ctx)
		if terr := cr.teardown(); err == nil && terr != nil {
			err = terr
		}
		_ = os.RemoveAll(cr.caseDir)
		if err != nil {
			return nil, fmt.Errorf("discover the phases of %s %s: %w", r.opts.Manager, op.Verb, err)
		}
		out[op.Verb] = phases
	}
	return out, nil
}

func (cr *caseRun) discoverOne(ctx context.Context) ([]string, error) {
	if verdict, why := cr.prepare(ctx); verdict != "" {
		return nil, fmt.Errorf("%s: %s", verdict, why)
	}
	mark := cr.trace.Mark()
	if res := cr.verb(ctx, cr.c.Op.Call); res.err != nil {
		return nil, fmt.Errorf("unarmed run failed: %s", res)
	}
	// The VMM's datagrams are sent before its reply; give the trace
	// reader a moment to take the last ones in.
	time.Sleep(50 * time.Millisecond)
	var phases []string
	seen := map[string]bool{}
	for _, e := range cr.trace.Since(mark) {
		if strings.HasPrefix(e.Point, "ch.") && !seen[e.Point] {
			seen[e.Point] = true
			phases = append(phases, e.Point)
		}
	}
	return phases, nil
}
