package runner

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// The agent cases over cocoon (issue 33 item 3): the case's nodeagent runs
// as `--manager cocoon --manager-bin P` (stack.Options.Cocoon) and the
// checker reads cocoon's store through its adapter. A case that needs what
// that stack lacks is not generated: it is listed under not_supported with
// the reason, never run, never counted as a pass.

// cocoonSteps are the steps an agent case over cocoon can take: intents
// through the agent API, and the ledger's markers written into a guest over
// its CNI NIC (scenarios/stack cocoonnet.go); the other steps run vmctl
// verbs or signal vmctl's children.
var cocoonSteps = map[string]bool{scenarios.StepCreate: true, scenarios.StepHibernate: true,
	scenarios.StepWake: true, scenarios.StepDelete: true, scenarios.StepLedgerWrite: true}

// cocoonFaults are the fault kinds that touch only the agent's unit (its
// main process, or its in-flight manager child: a cocoon verb, which the
// agent traces as it traces any child, agent.child.exec with its argv).
var cocoonFaults = map[string]bool{"sigkill-main": true, "stop": true, "restart": true, "sigstop": true,
	"sigkill-child": true, "none": true}

// cocoonVMMPoints are the fakech points (the VMM cocoon launches, its CH
// phases) that the agent's operation reaches over cocoon 34c6c4a, from
// cocoon's source and seen in the trace: a create and a wake are `vm clone`
// (hypervisor/cloudhypervisor/clone.go, restore.go: restore, the NIC
// swapped for the clone's own, resume), a hibernate `snapshot save`
// (snapshot.go: pause, snapshot, resume; the matrix's op "save") then `vm
// rm` (stop.go: shutdown), a delete `vm rm`. A case parked at another fakech point would only miss
// its window.
var cocoonVMMPoints = map[string]map[string]bool{
	"create":    setOf("ch.restore.begin", "ch.restore.done", "ch.eject.requested", "ch.net.removed", "ch.net.added", "ch.eject.acked", "ch.resume"),
	"wake":      setOf("ch.restore.begin", "ch.restore.done", "ch.eject.requested", "ch.net.removed", "ch.net.added", "ch.eject.acked", "ch.resume"),
	"save":      setOf("ch.pause", "ch.snapshot.begin", "ch.snapshot.memory-writing", "ch.snapshot.memory-written", "ch.snapshot.done", "ch.resume"),
	"hibernate": setOf("ch.pause", "ch.snapshot.begin", "ch.snapshot.memory-writing", "ch.snapshot.memory-written", "ch.snapshot.done", "ch.resume", "ch.shutdown"),
	"delete":    setOf("ch.shutdown"),
}

func setOf(names ...string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

// cocoonPointUnsupported says why point p cannot be a trigger, window or
// release of a case of operation op over cocoon ("": it can).
func cocoonPointUnsupported(op, p string) string {
	switch {
	case strings.HasPrefix(p, "agent."):
		if row, ok := cocoonSkippedPoints[p]; ok {
			return "failpoint " + p + ": the agent's plan over cocoon never reaches it, cocoon lacks " + row
		}
		return ""
	case strings.HasPrefix(p, "ch."):
		if cocoonVMMPoints[op][p] {
			return ""
		}
		return "failpoint " + p + ": a VMM phase cocoon's " + op + " never reaches (no such CH call in its flow)"
	}
	return "failpoint " + p + ": vmctl's point, cocoon has no such point"
}

// cocoonChildren are the child kinds (injector.ChildKind of the argv) the
// agent runs over cocoon for its operations.
var cocoonChildren = setOf("vm-clone", "snapshot-save", "snapshot-rm", "vm-rm", "vm-start", "vm-stop", "snapshot-export", "snapshot-import")

// cocoonSkippedPoints are the agent's points its plan over cocoon never
// reaches, with the capability row whose absence skips them
// (docs/manager.md "Typed outcomes and the agent's plan"): a case parked
// there would only miss its window.
var cocoonSkippedPoints = map[string]string{
	"agent.hibernate.nic-dropped":   "nic-change (no `vm net`: a hibernate keeps the VM's NICs)",
	"agent.hibernate.dhcp-released": "guest-exec (no `vm exec`: no DHCP release before the save)",
}

// pointName is a failpoint name inside a trigger or window.
var pointName = regexp.MustCompile(`[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)+`)

// cocoonUnsupported says why the agent case c cannot run over cocoon ("":
// it can).
func (r *Runner) cocoonUnsupported(c scenarios.Case) string {
	s := c.Scenario
	for _, steps := range [][]scenarios.Step{s.Setup, s.Act, s.WhileStopped, s.After} {
		for _, st := range steps {
			if !cocoonSteps[st.Kind] {
				return fmt.Sprintf("step %s: runs vmctl's verbs or signals vmctl's children", st.Kind)
			}
		}
	}
	switch {
	case s.Env.Failpoints != "":
		return "failpoint actions " + s.Env.Failpoints + ": vmctl's or the agent's points armed by name, not checked against cocoon"
	case s.Env.Daemon:
		return "runs `vmctl daemon`"
	case s.Env.Registry != "":
		return "an OCI registry case: its checks read vmctl's snapshot layout"
	case s.Env.NetMode != "":
		return "net mode " + s.Env.NetMode + ": vmctl's NICs"
	case s.Expect.MACKept || s.Expect.Events || s.Expect.Adopted || len(s.Expect.DirectVMs) > 0:
		return "its expectations need vmctl's event stream or vmctl's list read by the harness"
	}
	for i, f := range s.Faults {
		if !cocoonFaults[f.Kind] || (f.Unit != "" && f.Unit != "agent") {
			return "fault " + f.Kind + ": not the agent unit's own (VMMs, power cuts, the daemon)"
		}
		if f.Kind == "sigkill-child" && f.Child != "" && !cocoonChildren[f.Child] {
			return "fault sigkill-child of a " + f.Child + " child: the agent over cocoon runs no such verb"
		}
		for _, t := range []string{r.triggerString(c, i), f.Window[0], f.Window[1], f.ReleaseAfter} {
			for _, p := range pointName.FindAllString(t, -1) {
				if why := cocoonPointUnsupported(s.Op, p); why != "" {
					return why
				}
			}
		}
		if f.ReleaseAfterChild != "" {
			return "release after the agent's " + f.ReleaseAfterChild + " child: a vmctl child"
		}
	}
	return ""
}

// CocoonAgentCases keeps the agent cases that can run over cocoon and lists
// the others under not_supported (results.json), one row each.
func (r *Runner) CocoonAgentCases(cases []scenarios.Case) []scenarios.Case {
	var out []scenarios.Case
	for _, c := range cases {
		why := r.cocoonUnsupported(c)
		if why == "" {
			out = append(out, c)
			continue
		}
		r.mu.Lock()
		r.res.NotSupported = append(r.res.NotSupported, reports.NotRun{Case: c.ID,
			Reason: "not supported by the agent over cocoon: " + why, Missing: "cocoon", Kind: reports.MissingManagerVerb})
		r.mu.Unlock()
	}
	return out
}
