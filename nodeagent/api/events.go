package api

import "time"

// EventsPath is the agent's event endpoint: GET answers an Events.
const EventsPath = "/v1/events"

// Event reasons a wedge carries besides a failed_reason: an operation that
// made no durable progress and did not fail either.
const ReasonNoProgress = "no_progress"

// Event is one thing the agent wants seen outside the node (seed 001,
// observability: "both wedges emit log lines only"). Today: an intent stuck
// past its operation's budget (Kind "wedged").
type Event struct {
	Kind      string    `json:"kind"`      // "wedged"
	Time      time.Time `json:"time"`      // wall clock, UTC
	MonoNs    int64     `json:"mono_ns"`   // CLOCK_MONOTONIC, the clock of the failpoint trace
	VM        string    `json:"vm"`        // intent name
	Op        string    `json:"op"`        // operation that is stuck (create|wake|hibernate|delete)
	Step      string    `json:"step"`      // its last durable step
	Lifecycle string    `json:"lifecycle"` // lifecycle when reported
	Reason    string    `json:"reason"`    // failed_reason, or ReasonNoProgress
	Message   string    `json:"message"`   // one human sentence: what, how long, which budget
	StuckSecs float64   `json:"stuck_seconds"`
}

// Events is the body of GET /v1/events: the agent's persisted events (oldest
// first, the newest EventsKept) and the budget per operation past which an
// intent without progress is reported wedged (seconds, after time scaling).
type Events struct {
	Budgets map[string]float64 `json:"budgets"`
	Events  []Event            `json:"events"`
}

// EventsKept is how many events the agent keeps (older ones are dropped).
const EventsKept = 256

// EventWedged is the Kind of a wedge report.
const EventWedged = "wedged"
