package injector

import (
	"encoding/json"
	"fmt"
	"time"
)

// Fault is what to do when a trigger fires.
type Fault struct {
	Kind    string        `json:"kind"`
	Unit    string        `json:"unit,omitempty"`     // the supervised unit (kinds whose traits say unit: all but sigkill-vmm, sigkill-hitter, power-cut)
	StopFor time.Duration `json:"stop_for,omitempty"` // stop / sigstop / registry-storage-full: how long before start / SIGCONT / the heal
	VM      string        `json:"vm,omitempty"`       // sigkill-vmm: VM id (default: the trigger hit's vm); sigkill-child: only a child run for this VM (agent events carry the intent name)
	Child   string        `json:"child,omitempty"`    // sigkill-child: only a child of this kind ("snapshot-save")
}

// String is the fault as a report shows it.
func (f Fault) String() string {
	s := f.Kind
	if f.StopFor > 0 {
		s += " for " + FormatOffset(f.StopFor)
	}
	if f.Child != "" {
		s += " child=" + f.Child
	}
	if f.VM != "" {
		s += " vm=" + f.VM
	}
	return s
}

// Validate checks the fault's fields: a kind of FaultKinds, the unit the
// kind needs, no negative StopFor.
func (f Fault) Validate() error {
	_, err := f.kind()
	return err
}

// kind is the fault's kind once its fields are checked.
func (f Fault) kind() (FaultKind, error) {
	k, err := LookupFaultKind(f.Kind)
	if err != nil {
		return nil, err
	}
	if f.Unit == "" && k.traits().unit {
		return nil, fmt.Errorf("fault %s: needs a unit", f.Kind)
	}
	if f.StopFor < 0 {
		return nil, fmt.Errorf("fault %s: negative StopFor", f.Kind)
	}
	return k, nil
}

// Injection is the record of one fault: what was asked and where it landed.
// Times are CLOCK_MONOTONIC ns (failpoint.Now), comparable with trace events.
type Injection struct {
	Fault         `json:"-"` // MarshalJSON writes the text forms
	Trigger       `json:"-"`
	RequestedNs   int64  // trigger hit + offset (park: when the point was seen parked)
	ActualNs      int64  // right after the signal syscall (or the supervisor call) returned
	Err           string // why it did not land ("" = it did)
	VictimPID     int    // host pid signalled (main, child or VMM); 0 for supervisor faults without one
	LastPhase     string // last phase the operation's process had reached at ActualNs
	IntendedPhase string // the trigger point (or the Intend list)
	Landed        bool   // intended phase reached and the fault delivered; false → the case is inconclusive
	TriggerPID    int    // pid (as emitted) of the process whose hit fired the trigger
	TriggerNs     int64  // ts of that hit
	HitRecvNs     int64  // when the harness read that hit (delivery = HitRecvNs − TriggerNs)
	ResumedNs     int64  // stop / sigstop with StopFor: when start / SIGCONT was issued
	InVictim      bool   // the victim fired it on itself (InVictim): ActualNs is its own stamp
}

// MarshalJSON flattens the embedded Fault and Trigger (whose Kind, VM and
// Child would otherwise collide and vanish) into their text forms.
func (in Injection) MarshalJSON() ([]byte, error) {
	type flat struct {
		Fault         string `json:"fault"`
		Unit          string `json:"unit,omitempty"`
		Trigger       string `json:"trigger"`
		RequestedNs   int64  `json:"requested_ns"`
		ActualNs      int64  `json:"actual_ns"`
		Err           string `json:"error,omitempty"`
		VictimPID     int    `json:"victim_pid,omitempty"`
		LastPhase     string `json:"last_phase"`
		IntendedPhase string `json:"intended_phase"`
		Landed        bool   `json:"landed"`
		TriggerPID    int    `json:"trigger_pid,omitempty"`
		TriggerNs     int64  `json:"trigger_ns,omitempty"`
		HitRecvNs     int64  `json:"hit_recv_ns,omitempty"`
		ResumedNs     int64  `json:"resumed_ns,omitempty"`
		InVictim      bool   `json:"in_victim,omitempty"`
	}
	return json.Marshal(flat{in.Fault.String(), in.Unit, in.Trigger.String(), in.RequestedNs, in.ActualNs, in.Err,
		in.VictimPID, in.LastPhase, in.IntendedPhase, in.Landed, in.TriggerPID, in.TriggerNs, in.HitRecvNs, in.ResumedNs, in.InVictim})
}
