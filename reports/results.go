// Package reports holds the results schema of a vmchaos run and everything
// that renders or judges it: results.json, junit.xml, report.md, report.html,
// the release gate and shard merging.
package reports

import (
	"encoding/json"
	"time"
)

// Verdicts of a case.
const (
	Pass         = "pass"
	Fail         = "fail"
	Inconclusive = "inconclusive" // the fault did not land as intended, or the infrastructure failed
	Error        = "error"        // the harness itself failed (gate exit 3)
	// Flaky: `run --repeat N` gave this case different verdicts across its
	// runs (Runs holds each); never a pass.
	Flaky = "flaky"
)

// Results is results.json: one run (or a merge of shards).
type Results struct {
	RunID      string    `json:"run_id"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Host       string    `json:"host"`
	Backend    string    `json:"backend"`    // fake | real
	Supervisor string    `json:"supervisor"` // the one actually used (auto resolved)
	TimeScale  float64   `json:"time_scale"`
	Seed       int64     `json:"seed"`
	Shard      string    `json:"shard,omitempty"` // "I/N"
	Filter     string    `json:"label_filter,omitempty"`
	Regress    []string  `json:"regress,omitempty"`  // bug switches on during this run (selftest)
	Build      string    `json:"build,omitempty"`    // the vmchaos build that ran it (VCS revision); WriteAll fills it in
	Repeat     int       `json:"repeat,omitempty"`   // --repeat N: runs of every case
	Load       string    `json:"load,omitempty"`     // --load: the CPU hog the run ran under ("cpu=1")
	StackFS    string    `json:"stack_fs,omitempty"` // where the stacks lived: tmpfs or disk (--stack-fs)
	Cases      []Case    `json:"cases"`

	// NotRun lists the selected cases the host could not run for a missing
	// binary or host feature (notrun.go); absent when every case ran.
	NotRun []NotRun `json:"not_run,omitempty"`

	// NotSupported lists, for a run with --manager, the verbs whose cases
	// were not generated because the manager lacks what they need (reason
	// "not supported by this manager: ..."), and ManagerCapabilities is the
	// manager's capability table (manager.Capabilities as JSON) the run
	// planned from. A verb listed here is never counted as passed.
	NotSupported        []NotRun        `json:"not_supported,omitempty"`
	ManagerCapabilities json.RawMessage `json:"manager_capabilities,omitempty"`

	// Shards lists the "I/N" shards a merged result was joined from, and
	// MissingShards those of the same N that were not (the gate treats a
	// merge with holes as inconclusive: part of the catalogue never ran).
	Shards        []string `json:"shards,omitempty"`
	MissingShards []string `json:"missing_shards,omitempty"`

	// Coverage is the phase-coverage map (coverage.go, version
	// CoverageVersion); absent in runs written before it. Its key is new
	// with version 2, so an older vmchaos finds no map rather than
	// reading cells as the old (point × kind) pairs.
	Coverage *Coverage `json:"phase_coverage,omitempty"`
	// LegacyCoverage is a version-1 map (key `coverage`): kept only so that
	// readers can refuse it by name (LegacyCoverageError).
	LegacyCoverage json.RawMessage `json:"coverage,omitempty"`

	// Parallel is --parallel as resolved: "1", "4", "auto=3 (2 CPUs, load
	// 1.2)" (issue #37); absent in runs written before the scheduler.
	Parallel string `json:"parallel,omitempty"`

	// Schedule is the run's plan (schedule.go): what `run --replay` runs
	// again; ReplayOf names the results it replayed; Determinism is what
	// --check-determinism found (issue #36). Absent when not recorded.
	Schedule    *Schedule    `json:"schedule,omitempty"`
	ReplayOf    string       `json:"replay_of,omitempty"`
	Determinism *Determinism `json:"determinism,omitempty"`

	// Dir is the run dir this was loaded from or written to (not stored);
	// report paths printed by Summary are relative to it.
	Dir string `json:"-"`
}

// Case is one executed scenario case (a scenario at one offset).
type Case struct {
	ID          string             `json:"id"`       // unique in the run: scenario id + offset
	Scenario    string             `json:"scenario"` // catalogue id
	Title       string             `json:"title"`
	SeedRef     string             `json:"seed_ref,omitempty"` // field report: 000 | 001 | 002
	Labels      []string           `json:"labels"`
	Backend     string             `json:"backend"`
	Supervisor  string             `json:"supervisor"`
	TimeScale   float64            `json:"time_scale"`
	Seed        int64              `json:"seed"`
	Operation   string             `json:"operation"`
	Fault       string             `json:"fault"`
	Trigger     string             `json:"trigger"`
	OffsetMs    float64            `json:"offset_ms"`
	Injections  []Injection        `json:"injections"`
	LandedPhase string             `json:"landed_phase"`
	StartedAt   time.Time          `json:"started_at"`
	DurationMs  float64            `json:"duration_ms"`
	ConvergeMs  float64            `json:"converge_ms"` // fault → stable state; -1 if never
	Invariants  []Invariant        `json:"invariants"`
	Ledger      []LedgerVerdict    `json:"ledger,omitempty"`
	Workload    *Workload          `json:"workload,omitempty"` // the guest writer and its consistent cuts (workload.go)
	Metrics     map[string]float64 `json:"metric_deltas,omitempty"`
	Verdict     string             `json:"verdict"`
	Reason      string             `json:"reason,omitempty"`
	// Culprit is who a verdict other than pass blames: product (fail),
	// harness (error), landing or precondition (inconclusive); "" for a
	// pass and in results written before it.
	Culprit  string            `json:"culprit,omitempty"`
	Attempts int               `json:"attempts"` // >1: retried (flaky) — visible in junit
	Repro    string            `json:"repro"`
	Logs     map[string]string `json:"logs,omitempty"` // name → path relative to the run dir
	Timeline []TimelineEvent   `json:"timeline,omitempty"`
	// Window is the fault's operation window measured on the case's stack
	// and the fault's margin to its edges (absent for park, now and
	// window-less faults); Runs is every run's outcome under --repeat.
	Window *WindowMargin `json:"window,omitempty"`
	Runs   []RunOutcome  `json:"runs,omitempty"`
	// CoverageKind is the matrix fault kind the case exercises (the
	// coverage map's column for its landed phase); "" for none.
	CoverageKind string `json:"coverage_kind,omitempty"`
	// Class is the scheduler's class of the case ("alone": nothing else of
	// the run ran beside its timed part; "shared": it may share the
	// machine throughout), and Concurrency the most cases of the run in
	// flight at once while it ran, itself included (1: sequential).
	// ClockConcurrency is, for an alone case under the scheduler, the most
	// in flight while it held the machine for its timed part (calibration,
	// arming, act, injection): 1, or absent when it never got that far.
	// ClockMs is how long it held the machine so: serial time, the part of
	// the run no number of workers shortens; ClockWaitMs how long it
	// waited for that, the shared cases in flight draining. Absent in runs
	// written before the scheduler (issue #37).
	Class            string  `json:"class,omitempty"`
	Concurrency      int     `json:"concurrency,omitempty"`
	ClockConcurrency int     `json:"clock_concurrency,omitempty"`
	ClockMs          float64 `json:"clock_ms,omitempty"`
	ClockWaitMs      float64 `json:"clock_wait_ms,omitempty"`
	// CoverageAt is the point a failpoint-action fault acts at (its
	// VMCHAOS_FAILPOINTS rule): the cell it credits when it landed.
	CoverageAt string `json:"coverage_at,omitempty"`
	// ReproRate is how often the case's failure reproduced when `run
	// --repro-check N` ran it again (repro.go); absent when not measured.
	ReproRate *ReproRate `json:"repro_rate,omitempty"`
	// ConvergeAfterHealMs is how long the node took to a stable state after
	// the last of its faults healed (a registry fault, whose heal the
	// harness times: the storage given back, the SIGCONT, the registry
	// answering again); absent where no heal was timed or the case never
	// converged.
	ConvergeAfterHealMs *float64 `json:"converge_after_heal_ms,omitempty"`
	// MigrateMs is how long a migration took (op:migrate cases), from the
	// control plane's placement move to the VM live on its target alone;
	// absent where the case migrated nothing or the move never finished.
	MigrateMs *float64 `json:"migrate_ms,omitempty"`
}

// Injection is one fault as it was requested and as it landed.
type Injection struct {
	Fault         string `json:"fault"`
	Trigger       string `json:"trigger"`
	RequestedNs   int64  `json:"requested_ns"` // CLOCK_MONOTONIC
	ActualNs      int64  `json:"actual_ns"`
	Err           string `json:"error,omitempty"`
	VictimPID     int    `json:"victim_pid,omitempty"`
	LastPhase     string `json:"last_phase"`
	IntendedPhase string `json:"intended_phase"`
	Landed        bool   `json:"landed"`
	// Injection error (see accuracy.go): actual − requested, and the trigger
	// hit's delivery (harness read − emitter stamp); absent = not measured.
	ErrorNs    *int64 `json:"error_ns,omitempty"`
	DeliveryNs *int64 `json:"delivery_ns,omitempty"`
	InVictim   bool   `json:"in_victim,omitempty"` // armed inside the victim (failpoint signal action): no delivery in the error
	// TriggerNs is the trigger hit's stamp for a fault fired off a hit
	// (RequestedNs − TriggerNs is the offset the harness chose); 0 = none.
	TriggerNs int64 `json:"trigger_ns,omitempty"`
}

// Invariant is one checked property with its evidence.
type Invariant struct {
	Name     string `json:"name"`
	OK       bool   `json:"ok"`
	Evidence string `json:"evidence,omitempty"`
	// HarnessError: not OK because the harness's own read of the evidence
	// failed (its journal, its files), not because the product broke it:
	// nothing proven either way, a harness error unless the product failed
	// elsewhere.
	HarnessError bool `json:"harness_error,omitempty"`
	// NotExercised: not OK because the failure this invariant judges the
	// recovery from never happened (the fault landed, and the product took
	// a path around it: a retried request that met the restarted server):
	// nothing proven either way, inconclusive unless the product failed
	// elsewhere.
	NotExercised bool `json:"not_exercised,omitempty"`
	// Layer is the layer a failed invariant is attributed to: manager,
	// agent, guest-data, stack or harness (reports/layers.go).
	Layer string `json:"layer,omitempty"`
}

// LedgerVerdict is the ledger outcome for one guest.
type LedgerVerdict struct {
	Guest        string   `json:"guest"`
	Stable       int      `json:"stable"`
	Lost         int      `json:"lost"`
	InFlight     int      `json:"in_flight"`
	Phantom      int      `json:"phantom"`
	LostNames    []string `json:"lost_names,omitempty"`
	PhantomNames []string `json:"phantom_names,omitempty"`
	OK           bool     `json:"ok"`
	Message      string   `json:"message,omitempty"`
}

// TimelineEvent is one point on a case's timeline (phase hit, fault, convergence).
type TimelineEvent struct {
	TsNs  int64  `json:"ts_ns"`
	Kind  string `json:"kind"` // phase | fault | healed | restart | converged
	Proc  string `json:"proc,omitempty"`
	Pid   int    `json:"pid,omitempty"` // the emitting process (phase events): whose phase it is
	Point string `json:"point,omitempty"`
	VM    string `json:"vm,omitempty"`
	Note  string `json:"note,omitempty"`
}
