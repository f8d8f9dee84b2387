package injector

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/failpoint"
)

// FaultKind is one fault kind (docs/architecture.md §7): what it does, where
// it can run, how it is injected and what its landing means. Each kind is one
// type in its own file (kind_*.go) and is listed once, in FaultKinds; the
// validation here, the scenario catalogue's kinds and the listings walk that
// list, and the scheduling (inject.go: triggers, timing, arming) knows no
// kind by name: it asks the kind. The unexported methods keep the kinds the
// injector's: what the scheduling asks of a kind is part of it.
type FaultKind interface {
	// Name is the kind as a fault, a scenario and a report name it.
	Name() string
	// Describe says in one line what the fault does.
	Describe() string
	// Available is nil where the kind can run on h, else why not.
	Available(h Host) error
	// Landed says in one line when an injection of the kind counts as
	// landed (Injection.Landed; a fault that did not land makes its case
	// inconclusive).
	Landed() string
	// Inject delivers the fault to a resolved target now and returns the
	// CLOCK_MONOTONIC ns the record stamps as its actual time
	// (Injection.ActualNs).
	Inject(ctx context.Context, t Target) (actualNs int64, err error)

	// traits are what the scheduler needs to know of the kind.
	traits() traits
	// afterSignal runs once the fault was delivered at actualNs, to p (the
	// zero Proc for a kind that signals no process) (sigstop: the SIGCONT
	// after StopFor; registry-storage-full: the heal after StopFor).
	afterSignal(in *Injector, f Fault, p Proc, actualNs int64)
	// afterSettle runs once a delivered fault's landing was read (stop: the
	// start after StopFor) and returns when it resumed what the fault
	// stopped (0: nothing to resume). It takes no record: one that escaped
	// into an interface call would be a heap allocation per injection.
	afterSettle(ctx context.Context, in *Injector, f Fault) (resumedNs int64, err error)
}

// traits are what the scheduling needs to know of a kind, as data.
type traits struct {
	// signal is the one signal the kind sends to one process (0: it is not
	// one signal): such a fault fires on the trace reader thread, with no
	// goroutine hand-off between hit and signal, and can be armed in the
	// victim itself (InVictim).
	signal syscall.Signal
	unit   bool // it needs Fault.Unit
	// rule is how its victim is found (victim.go; in the victim too): a
	// rule, not a method, so that the resolution on the trace reader
	// thread stays statically dispatched and the hit on the stack.
	rule  victimRule
	kills bool // its victim dies: the landing is read once it exited
	// supervisor: a call to the unit's supervisor; the unit's main process
	// is read at Arm and kept current for the record.
	supervisor bool
	node       bool // the whole node: fired by the runner, not armed by an Injector (ErrNodeFault)
	disk       bool // a file system the harness fills: Options.Disk
	link       bool // a network path the harness cuts or impairs: Options.Link
}

// victimRule is how a kind finds the process it is delivered to.
type victimRule int

const (
	victimNone   victimRule = iota // no process: a supervisor call, the node
	victimMain                     // the unit's main process, resolved at Arm
	victimChild                    // the agent's in-flight vmctl child
	victimVMM                      // the VM's VMM
	victimHitter                   // the process whose hit fired the trigger
)

// Host is where a fault would run: what a kind's Available asks about.
type Host struct {
	Sup  Supervisor // the stack's supervisor (nil: none)
	Node Node       // the stack's node on lazy filesystems (nil: its dirs are plain ones)
	Disk Disk       // the registry's storage the harness can fill (nil: none)
	Link Link       // the node's network path to the registry (nil: none)
}

// Target is what a kind's Inject is delivered to, resolved before.
type Target struct {
	Sup    Supervisor // the unit's supervisor (supervisor kinds)
	Unit   string     // the unit (supervisor kinds)
	Victim *PidFD     // the verified victim (signal kinds)
	Node   Node       // the node (power-cut)
	Procs  []Proc     // every process of the node (power-cut)
	Disk   Disk       // the disk to fill (registry-storage-full)
	Link   Link       // the path to cut or impair (net-partition, net-delay, net-loss)
	// Between runs between a registry-restart's stop and its start when
	// set (see Between).
	Between func(context.Context)
}

// FaultKinds is every fault kind, the one list everything else walks.
var FaultKinds = []FaultKind{
	sigkillMain{}, stopKind{}, restartKind{}, killAll{}, sigkillChild{},
	sigkillVMM{}, sigstopKind{}, sigcontKind{}, sigkillHitter{}, FaultKindPowerCut,
	registrySigkill{}, registrySigstop{}, registryRestart{}, registryStorageFull{},
	netPartition{}, netDelay{}, netLoss{},
}

// FaultKindNames are the names of FaultKinds, in their order.
func FaultKindNames() []string {
	out := make([]string, len(FaultKinds))
	for i, k := range FaultKinds {
		out[i] = k.Name()
	}
	return out
}

// LookupFaultKind is the kind named name; an unknown name is an error that
// lists the known ones.
func LookupFaultKind(name string) (FaultKind, error) {
	for _, k := range FaultKinds {
		if k.Name() == name {
			return k, nil
		}
	}
	return nil, fmt.Errorf("fault %q: unknown kind (want one of %s)", name, strings.Join(FaultKindNames(), ", "))
}

// kindBase gives a kind the hooks it does not need.
type kindBase struct{}

func (kindBase) afterSignal(*Injector, Fault, Proc, int64)                    {}
func (kindBase) afterSettle(context.Context, *Injector, Fault) (int64, error) { return 0, nil }

// pidfdAvailable is whether this kernel has pidfds (Linux 5.3): every
// signal the injector sends goes through a verified one. Asked once.
var pidfdAvailable = sync.OnceValue(func() error {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return fmt.Errorf("pidfd_open unavailable (Linux 5.3 or later needed): %w", err)
	}
	_ = unix.Close(fd)
	return nil
})

// signalAvailable is where a kind that signals one supervised process can
// run: a supervisor that vouches for its processes, and pidfds.
func signalAvailable(name string, h Host) error {
	if h.Sup == nil {
		return fmt.Errorf("%s: needs a supervisor (it signals only the processes a supervisor owns)", name)
	}
	if err := pidfdAvailable(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// supervisorAvailable is where a supervisor call can run: a supervisor.
func supervisorAvailable(name string, h Host) error {
	if h.Sup == nil {
		return fmt.Errorf("%s: needs a supervisor of the unit (systemd, sandbox or builtin)", name)
	}
	return nil
}

// signalTarget sends sig to the target's victim and stamps the moment the
// syscall returned.
func signalTarget(name string, t Target, sig syscall.Signal) (int64, error) {
	if t.Victim == nil {
		return 0, errNoVictim(name)
	}
	err := t.Victim.Signal(sig)
	return failpoint.Now(), err
}

func errNoVictim(name string) error { return fmt.Errorf("%s: no victim resolved", name) }

func errNoSupervisor(name string) error { return fmt.Errorf("%s: no supervisor in the target", name) }
