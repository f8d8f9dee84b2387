// Package regress is the regression library's switchboard: VMCHAOS_REGRESS
// re-enables named historical bugs inside vmctl and nodeagent, one switch per
// bug, so `vmchaos selftest` can prove the catalogue catches each of them.
// With the variable unset every switch is off and the code paths are the fixed
// ones.
package regress

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
)

// Env names the environment variable holding a comma-separated bug list.
const Env = "VMCHAOS_REGRESS"

// Bug describes one historical bug that can be switched back on.
type Bug struct {
	Name      string // switch name
	Seed      string // field report it comes from ("000", "001 #1", ...)
	Component string // "vmctl", "nodeagent" or "controlplane"
	What      string // the buggy behaviour, one sentence
	Invariant string // the checker invariant that the bug breaks
}

// Bugs is the table of every switch. Invariant names are the convergence
// checker's (scenarios package); selftest requires a failure to name them.
var Bugs = []Bug{
	{"event-stream-pointer-snapshot", "000", "vmctl",
		"vm status --event keeps pointers to the previous pass, so a VMM killed with -9 never yields a MODIFIED event",
		"events-observed"},
	{"watch-busy-inspect-only", "001 #1", "nodeagent",
		"the busy-create watcher only inspects the record and never re-invokes reconcile-stale-create, so a dead clone's placeholder owns the name until the budget",
		"intent-goal"},
	{"net-refuses-paused", "001 #2", "vmctl",
		"vm net (and vm start/exec) refuse a VMM left Paused by a dead capture instead of resuming it",
		"intent-goal"},
	{"save-match-already-exists-only", "001 #3", "nodeagent",
		"save recovery matches only \"already exists\", not \"already in use by\"",
		"intent-goal"},
	{"save-rm-by-name", "001 #3", "nodeagent",
		"save recovery removes the holder by name, which cannot resolve a pending record",
		"intent-goal"},
	{"save-no-lease-wait", "001 #3", "nodeagent",
		"save recovery treats a lease-held refusal as terminal instead of waiting for the dead save's child",
		"no-failed-write"},
	{"save-preflight-ignores-pending", "001 #3", "vmctl",
		"snapshot save's name preflight ignores pending records, so the clash is found only after a full capture",
		"save-rejected-before-capture"},
	{"resume-start-gated-on-listed-state", "001 #4", "nodeagent",
		"a resumed hibernate runs vm start only if the startup listing said stopped, so a VM whose record still reads running is never booted",
		"intent-goal"},
	{"failed-sticky", "001 #5", "nodeagent",
		"lifecycle failed parks the intent forever within its generation",
		"intent-goal"},
	{"stale-create-blocking-lock", "002", "vmctl",
		"reconcile-stale-create takes the ops lock blocking, so it queues behind a live clone and deletes the freshly created VM",
		"one-vm-per-name"},
	{"died-in-flight-dropped", "matrix", "nodeagent",
		"the event watcher ignores a VM death while an operation owns the VM, so a wake whose VMM dies after its readiness check ends ready over a dead VMM",
		"intent-goal"},
	{"metrics-process-local", "001 obs", "nodeagent",
		"agent metrics live only in process memory and reset on the restart they describe",
		"metrics-monotonic"},
	// seed 001 "what held up": the post-clone states (issue 34 item 5)
	{"post-clone-done-ignored", "001 held", "nodeagent",
		"a resumed create or wake whose post_clone is done is derived as the whole operation again, never as ready_wait",
		"metric-expectations"},
	{"post-clone-failed-dispatched", "001 held", "nodeagent",
		"startup dispatches a post_clone=failed record as resumed post_clone work, past the failed path and its backoff",
		"metric-expectations"},
	{"empty-lifecycle-not-dispatched", "001 held", "nodeagent",
		"startup drives only records that carry a lifecycle, so an empty lifecycle with a post_clone marker is never dispatched",
		"intent-goal"},
	{"post-clone-marker-outlives-incarnation", "001 held", "nodeagent",
		"the post_clone marker survives the VM it describes (kept by the hibernate's vm rm, never dropped at startup)",
		"post-clone-marker-bound"},
	// seed 001 observability (issue 34 item 6)
	{"wedge-log-only", "001 obs", "nodeagent",
		"an intent stuck past its operation's budget is only logged: no metric, no event on the agent's API",
		"wedge-visible"},
	{"wake-failed-per-retry", "001 obs", "nodeagent",
		"wake_total{result=\"failed\"} counts every failed retry pass of a wake, so a retry storm inflates it",
		"metric-expectations"},
	{"evidence-lookup-uncounted", "001 obs", "nodeagent",
		"the hibernate-evidence lookup of a create resumed at startup bypasses nodeagent_hibernate_evidence_total",
		"evidence-lookups-counted"},
	{"image-guard-off", "001 image guard", "nodeagent",
		"a wake restores a :hibernate snapshot into whatever image the intent names now, so a changed image silently brings back the old one",
		"image-guard"},
	{"evidence-error-boots-fresh", "001 held up", "nodeagent",
		"a hibernate-evidence lookup that fails (registry unreachable) is read as no snapshot, so the create boots fresh over the :hibernate snapshot",
		"fail-closed"},
	{"push-done-before-commit", "issue 34 registry", "nodeagent",
		"an OCI push is reported done once its blobs are uploaded, before the manifest is committed under the :hibernate tag",
		"intent-goal"},
	{"push-server-error-done", "issue 34 registry", "nodeagent",
		"an OCI push the registry answers with a 5xx (its storage full: ENOSPC) is taken as done, so the hibernate reports hibernated with no artifact committed under :hibernate",
		"intent-goal"},
	{"push-timeout-done", "issue 34 network", "nodeagent",
		"an OCI push whose request got no answer in time (the node's path to the registry cut or slow: a dial or read timeout, no error the registry sent) is taken as done, so the hibernate reports hibernated with no artifact committed under :hibernate",
		"intent-goal"},
	{"net-skips-eject-wait", "issue 31 fidelity", "vmctl",
		"vm net returns once it asked the VMM to unplug a NIC, without waiting for the guest to ack the eject, so the hibernate's save captures the half-gone NIC and the wake restores it as a node no device stands behind",
		"device-tree-consistent"},
	{"killed-save-not-collected", "issue 31 workload", "nodeagent",
		"after its save child was killed mid-flight, the agent leaves the dead save's capture to the VM's next save, so a wake that cancels the hibernate leaves it in the running VM's dir for good (nothing else runs the manager's gc)",
		"no-leftover-staging"},
	{"store-commit-in-place", "issue 31 coverage", "vmctl",
		"a store commit writes the index's new generation over the current one in place instead of a temp file renamed over it, so a vmctl (or the daemon) killed mid-commit leaves a torn index every later verb refuses",
		"indexes-consistent"},
	{"agent-pidfile-lock", "issue 31 coverage", "nodeagent",
		"the agent locks its state dir with a pid file it creates exclusively and removes only when it returns, so an agent killed at any point (its startup included) leaves the file and every later start refuses the state dir: the unit crash-loops",
		"served-after-restart"},
	{"migrate-release-before-push", "issue 34 migrate", "nodeagent",
		"a migration's source releases the VM to its target as soon as the placement moved, deleting it without the hibernate, so no :hibernate snapshot is durable when the target starts",
		"migrate-source-durable"},
	{"migrate-failed-noop", "001 #5", "nodeagent",
		"the control plane sync compares only the intent, so a migration's hibernate that equals a leftover parked failed one is a no-op: the source never hibernates again and the migration never starts",
		"intent-goal"},
	{"migrate-target-skips-release", "issue 34 migrate", "nodeagent",
		"a migration's target starts the VM as soon as it is placed there, without waiting for its source to release it, so it boots fresh while the source still runs the VM",
		"cluster-one-live-vm"},
	{"migrate-target-skips-evidence", "issue 34 migrate", "nodeagent",
		"an agent syncing with a control plane creates a VM without the hibernate-evidence lookup, so a migration's target boots it fresh over the :hibernate snapshot its source pushed",
		"no-fresh-boot-over-hibernate"},
	{"migrate-wake-resumed-as-create", "issue 34 migrate", "nodeagent",
		"a migration's target restarted mid-wake (the create became a wake, the VM not restored yet) resumes the create the control plane asked for, skipping the evidence lookup it already made, so it boots fresh over the :hibernate snapshot its source pushed",
		"no-fresh-boot-over-hibernate"},
	{"controlplane-state-in-memory", "issue 34 control plane", "controlplane",
		"the control plane keeps its objects in memory only, so a control plane killed mid-migration restarts empty: the placement and the migration in flight are gone and no node ever wakes the VM",
		"intent-goal"},
}

var (
	once    sync.Once
	enabled map[string]bool
)

// Parse validates a VMCHAOS_REGRESS value and returns the bug names in it.
func Parse(s string) ([]string, error) {
	var out []string
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if Lookup(n) == nil {
			return nil, fmt.Errorf("%s: unknown bug %q (known: %s)", Env, n, strings.Join(Names(), ", "))
		}
		out = append(out, n)
	}
	return out, nil
}

// Lookup returns the bug with that name, or nil.
func Lookup(name string) *Bug {
	for i := range Bugs {
		if Bugs[i].Name == name {
			return &Bugs[i]
		}
	}
	return nil
}

// Names lists every switch, sorted.
func Names() []string {
	out := make([]string, 0, len(Bugs))
	for _, b := range Bugs {
		out = append(out, b.Name)
	}
	sort.Strings(out)
	return out
}

// On reports whether the named bug is switched on in this process. Asking for
// a name not in Bugs panics: a typo must not silently disable a regression.
func On(name string) bool {
	if Lookup(name) == nil {
		panic("regress: unknown bug switch " + name)
	}
	once.Do(func() {
		enabled = map[string]bool{}
		names, err := Parse(os.Getenv(Env))
		if err != nil {
			fmt.Fprintln(os.Stderr, "warning:", err)
		}
		for _, n := range names {
			enabled[n] = true
		}
	})
	return enabled[name]
}
