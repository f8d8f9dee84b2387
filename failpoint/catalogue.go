package failpoint

import "sort"

// Point documents one named phase: who hits it, during which operation, and
// what has and has not happened when it fires. `vmchaos points` prints this
// table; the scenario catalogue may only name points listed here.
type Point struct {
	Name     string
	Proc     string // vmctl | nodeagent | fakech
	Op       string // create | clone | save | snapshot-rm | rm | net | hibernate | wake | delete | migrate | store | daemon | agent | vmm | registry (--registry only: no generated case parks there)
	Happened string
	NotYet   string
}

// Catalogue lists every point. Keep it sorted by process, then by phase order.
var Catalogue = []Point{
	// vmctl: create
	{"vm.create.reserved", "vmctl", "create", "creating placeholder committed; name claimed; ops lock held", "disk copied, VMM launched"},
	{"vm.create.created", "vmctl", "create", "record committed created (disk copied, no VMM); ops lock released", "run: vm start re-locks and boots; create: command returns"},
	{"vm.create.committed", "vmctl", "create", "the verb's final record committed: created (create) or running (run, after its start)", "command returned"},
	// vmctl: clone
	{"vm.clone.reserved", "vmctl", "clone", "creating placeholder committed under the ops lock; snapshot lease held shared", "files copied, VMM launched"},
	{"vm.clone.files-copied", "vmctl", "clone", "snapshot files copied into the VM's dirs", "VMM launched"},
	{"vm.clone.vmm-launched", "vmctl", "clone", "VMM process started with --api-socket only and answers ping", "vm.restore"},
	{"vm.clone.restored", "vmctl", "clone", "vm.restore done; VMM Paused", "NICs replaced, vm.resume"},
	{"vm.clone.resumed", "vmctl", "clone", "NICs replaced and vm.resume done; guest running", "record commit (still creating)"},
	{"vm.clone.committed", "vmctl", "clone", "record committed as running; ops lock about to be released", "command returned"},
	// vmctl: snapshot save
	{"snapshot.save.locked", "vmctl", "save", "name preflight passed; VM ops lock held", "vm.pause"},
	{"snapshot.save.paused", "vmctl", "save", "VMM Paused", "vm.snapshot capture"},
	{"snapshot.save.captured", "vmctl", "save", "memory and state written to the staging dir, disks copied", "vm.resume"},
	{"snapshot.save.resumed", "vmctl", "save", "vm.resume done; guest running again; capture in the VM's dir; ops lock still held", "ops lock released"},
	{"snapshot.save.unlocked", "vmctl", "save", "VM ops lock released (vm net/start/rm may run); capture in the VM's dir", "build lease, pending record"},
	{"snapshot.save.leased", "vmctl", "save", "build lease held exclusive, capture moved to staging; VM ops lock free", "pending record"},
	{"snapshot.save.pending", "vmctl", "save", "pending record holds the name under the exclusive build lease; VM ops lock free", "data moved in and finalized"},
	{"snapshot.save.finalized", "vmctl", "save", "record finalized, data fsynced; VM ops lock free", "build lease released"},
	// vmctl: snapshot rm
	{"snapshot.rm.tombstoned", "vmctl", "snapshot-rm", "tombstone committed, record and name removed from the index", "data dir removed"},
	{"snapshot.rm.done", "vmctl", "snapshot-rm", "data dir removed, tombstone cleared", "command returned"},
	// vmctl: rm
	{"vm.rm.tombstoned", "vmctl", "rm", "tombstone committed, record and name removed from the index", "VMM stopped, dirs removed"},
	{"vm.rm.vmm-stopped", "vmctl", "rm", "VMM process gone", "dirs removed, tombstone cleared"},
	{"vm.rm.done", "vmctl", "rm", "dirs removed, tombstone cleared", "command returned"},
	// vmctl: net
	{"vm.net.removed", "vmctl", "net", "NICs removed through the VMM (orphaned pause converged first)", "new NICs added, record updated"},
	{"vm.net.added", "vmctl", "net", "new NICs added through the VMM", "record updated"},
	// vmctl: start and stop
	{"vm.start.locked", "vmctl", "start", "VM ops lock held (run: taken again after create released it at created)", "VMM booted or adopted"},
	{"vm.start.booted", "vmctl", "start", "VMM booted from the VM's disk under the ops lock, guest running", "record committed running with the new pid"},
	{"vm.stop.vmm-stopped", "vmctl", "stop", "VMM shut down (or killed) under the ops lock", "record committed stopped"},
	// vmctl: store and daemon
	{"store.commit.before-rename", "vmctl", "store", "new index written and fsynced to a temp file", "rename over the index"},
	{"store.commit.after-rename", "vmctl", "store", "index renamed into place", "directory fsync"},
	{"daemon.pass", "vmctl", "daemon", "one supervision pass finished (collect, converge, roll forward)", "next pass"},

	// nodeagent
	{"agent.started", "nodeagent", "agent", "process started, state dir opened", "startup convergence"},
	{"agent.startup.reconciled", "nodeagent", "agent", "startup convergence finished: stale creates reconciled, VMs adopted, owed work dispatched", "API served"},
	{"agent.child.exec", "nodeagent", "agent", "vmctl child started (attrs: child pid, argv)", "child exit"},
	{"agent.child.exit", "nodeagent", "agent", "vmctl child exited (attrs: pid, code, argv)", "result handled"},
	{"agent.child.vm-died", "nodeagent", "agent", "the watcher child (vm status --event) reported the VM of an intent dead (attrs: vm, id, op in flight); bookkeeping like agent.child.exec/exit", "the owning worker verifies and restarts it (at once, or once its operation is over)"},
	{"agent.create.begin", "nodeagent", "create", "lifecycle creating written", "vm clone"},
	{"agent.create.cloned", "nodeagent", "create", "vm clone returned; VM id bound; post_clone running", "post-clone readiness"},
	{"agent.create.ready", "nodeagent", "create", "post-clone done; lifecycle ready written", "-"},
	{"agent.hibernate.begin", "nodeagent", "hibernate", "lifecycle hibernating written", "guest DHCP release"},
	// The DHCP release runs before the NIC drop: after vm net --nics 0 the guest is unreachable over SSH.
	{"agent.hibernate.dhcp-released", "nodeagent", "hibernate", "guest dhclient -r done (step durable)", "NIC drop"},
	{"agent.hibernate.nic-dropped", "nodeagent", "hibernate", "vm net --nics 0 done (step durable)", "snapshot save"},
	{"agent.hibernate.saved", "nodeagent", "hibernate", "snapshot save child exited 0", "push to the registry"},
	{"agent.push.blobs", "nodeagent", "registry", "--registry: every snapshot file and the config uploaded as blobs", "manifest committed under <name>:hibernate (the push is not done)"},
	{"agent.hibernate.pushed", "nodeagent", "hibernate", "snapshot pushed: registry dir (atomic) or --registry manifest committed", "VM id cleared, vm rm"},
	{"agent.hibernate.removed", "nodeagent", "hibernate", "vm rm --force done", "lifecycle hibernated"},
	{"agent.hibernate.done", "nodeagent", "hibernate", "lifecycle hibernated written", "-"},
	{"agent.wake.begin", "nodeagent", "wake", "lifecycle creating written for a wake", "pull"},
	{"agent.pull.manifest", "nodeagent", "registry", "--registry: <name>:hibernate's manifest read and its image checked", "blobs downloaded and verified, vmctl import"},
	{"agent.wake.pulled", "nodeagent", "wake", "verified snapshot available locally (pulled if needed)", "vm clone"},
	{"agent.wake.cloned", "nodeagent", "wake", "vm clone returned; VM id bound", "post-clone readiness"},
	{"agent.wake.ready", "nodeagent", "wake", "lifecycle ready written", "-"},
	{"agent.delete.begin", "nodeagent", "delete", "lifecycle deleting written", "vm rm"},
	{"agent.delete.removed", "nodeagent", "delete", "VM removed", "snapshot rm, forget"},
	{"agent.delete.done", "nodeagent", "delete", "intent forgotten", "-"},
	{"agent.migrate.applied", "nodeagent", "migrate", "--control-plane: the control plane's intent for a VM placed on this node (or hibernate for one moved away) applied as a new generation", "the create, wake or hibernate it kicks"},
	{"agent.migrate.released", "nodeagent", "migrate", "--control-plane: the source told the control plane it released the VM (hibernated: :hibernate committed, VM removed)", "the source's record deleted keeping the registry artifact; the target's wake"},
	{"agent.failed", "nodeagent", "agent", "lifecycle failed written with the reason", "retry"},
	{"agent.evidence.lookup", "nodeagent", "agent", "a create's hibernate-evidence lookup done and counted (attrs: vm, verdict)", "fresh clone, or the create becomes a wake"},
	{"agent.wedged", "nodeagent", "agent", "an intent found stuck past its operation's budget (attrs: vm, op, reason)", "metric and API event written"},

	// fakech
	{"ch.cli.start", "fakech", "vmm", "API socket bound and serving (vmm.ping answers)", "the command-line VM created/booted or restored"},
	{"ch.boot", "fakech", "vmm", "VM booted, guest running", "-"},
	{"ch.pause", "fakech", "vmm", "VM paused", "-"},
	{"ch.resume", "fakech", "vmm", "VM resumed", "-"},
	{"ch.snapshot.begin", "fakech", "vmm", "snapshot request accepted on a Paused VM", "files written"},
	{"ch.snapshot.memory-writing", "fakech", "vmm", "config.json and state.json complete, memory-ranges half written", "rest of memory-ranges"},
	{"ch.snapshot.memory-written", "fakech", "vmm", "config.json, state.json, memory-ranges written (CH's order)", "response sent"},
	{"ch.snapshot.done", "fakech", "vmm", "all snapshot files written", "response sent"},
	{"ch.restore.begin", "fakech", "vmm", "restore request accepted", "memory loaded"},
	{"ch.restore.done", "fakech", "vmm", "VM restored, Paused", "-"},
	{"ch.net.added", "fakech", "vmm", "NIC added, guest listener open", "-"},
	{"ch.net.removed", "fakech", "vmm", "NIC out of the config, guest asked to eject", "eject acked: node still in the device tree, guest listener open"},
	{"ch.eject.requested", "fakech", "vmm", "remove-device took the device out of the config, eject pending", "guest ack; node leaves the device tree"},
	{"ch.eject.acked", "fakech", "vmm", "guest acked the eject (eject_ack of running time)", "node removed from the device tree, NIC listener closed"},
	{"ch.shutdown", "fakech", "vmm", "VM shut down", "-"},

	// runner: ledger (proc "vmchaos", the process that writes the journal)
	{"ledger.marker.intent", "vmchaos", "ledger", "intent line journaled and fsynced", "guest write of the disk and RAM markers"},
	{"ledger.marker.written", "vmchaos", "ledger", "guest confirmed disk marker, sync and RAM marker", "acked line journaled"},
}

// Lookup returns the catalogue entry for name.
func Lookup(name string) (Point, bool) {
	for _, p := range Catalogue {
		if p.Name == name {
			return p, true
		}
	}
	return Point{}, false
}

// Names returns every point name, sorted.
func Names() []string {
	out := make([]string, 0, len(Catalogue))
	for _, p := range Catalogue {
		out = append(out, p.Name)
	}
	sort.Strings(out)
	return out
}
