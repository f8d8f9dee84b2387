package fakech

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/timescale"
)

// Environment knobs (fakech takes its own settings only from the
// environment, so its command line stays exactly CH's).
const (
	EnvCompat     = "FAKECH_COMPAT"
	EnvTiming     = "FAKECH_TIMING"
	EnvJitterSeed = "FAKECH_JITTER_SEED"
)

// Duration is a time.Duration that reads from JSON as a Go duration string
// ("1.5s") or a number of milliseconds.
type Duration time.Duration

// UnmarshalJSON accepts "300ms" or 300.
func (d *Duration) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		if v < 0 {
			return fmt.Errorf("negative duration %q", s)
		}
		*d = Duration(v)
		return nil
	}
	ms, err := strconv.ParseFloat(string(b), 64)
	if err != nil || ms < 0 || ms > 1e9 {
		return fmt.Errorf("duration %s: want a Go duration string or non-negative milliseconds", b)
	}
	*d = Duration(ms * float64(time.Millisecond))
	return nil
}

// MarshalJSON writes the Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Timing is the timing model, at scale 1. Every value is multiplied by
// VMCHAOS_TIME_SCALE when applied.
type Timing struct {
	// Boot is how long the guest OS takes from vm.boot until its SSH server
	// answers (vm.boot itself returns at once, as CH's does; the time is spent
	// "in the guest" and stops while the VM is paused).
	Boot Duration `json:"boot"`
	// CLIStart is how long CH's main thread takes, after the API socket is
	// bound, to parse the command-line VM config and send create+boot (or
	// restore) to the VMM thread; a ping answers meanwhile with no VM.
	CLIStart Duration `json:"cli_start"`
	Pause    Duration `json:"pause"`
	Resume   Duration `json:"resume"`
	// Snapshot = SnapshotFixed + SnapshotPerGiB × guest RAM in GiB. The
	// per-GiB part is spent before ch.snapshot.memory-written, the fixed part
	// after it (device state and config).
	SnapshotFixed  Duration `json:"snapshot_fixed"`
	SnapshotPerGiB Duration `json:"snapshot_per_gib"`
	// Restore = RestoreFixed + RestorePerGiB × guest RAM in GiB.
	RestoreFixed  Duration `json:"restore_fixed"`
	RestorePerGiB Duration `json:"restore_per_gib"`
	AddDevice     Duration `json:"add_device"`
	RemoveDevice  Duration `json:"remove_device"`
	// EjectAck is how long the guest takes, in running time, to ack a
	// hot-unplug (the ACPI eject) after vm.remove-device returned; until then
	// the device stays in CH's device tree.
	EjectAck Duration `json:"eject_ack"`
	Shutdown Duration `json:"shutdown"`
	// Jitter is the relative spread applied when FAKECH_JITTER_SEED is set:
	// each duration is multiplied by a factor uniform in [1-j, 1+j].
	Jitter float64 `json:"jitter"`
}

// DefaultTiming is realistic for a small guest on a KVM host.
var DefaultTiming = Timing{
	Boot:           Duration(time.Second),
	CLIStart:       Duration(2 * time.Millisecond),
	Pause:          Duration(50 * time.Millisecond),
	Resume:         Duration(50 * time.Millisecond),
	SnapshotFixed:  Duration(300 * time.Millisecond),
	SnapshotPerGiB: Duration(time.Second),
	RestoreFixed:   Duration(300 * time.Millisecond),
	RestorePerGiB:  Duration(500 * time.Millisecond),
	AddDevice:      Duration(100 * time.Millisecond),
	RemoveDevice:   Duration(100 * time.Millisecond),
	EjectAck:       Duration(300 * time.Millisecond),
	Shutdown:       Duration(200 * time.Millisecond),
	Jitter:         0.2,
}

// ParseTiming overlays a FAKECH_TIMING JSON object on the defaults; keys it
// does not name keep their default. Unknown keys are an error (a typo must not
// silently run the default).
func ParseTiming(s string) (Timing, error) {
	t := DefaultTiming
	if s == "" {
		return t, nil
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return DefaultTiming, fmt.Errorf("%s: %w", EnvTiming, err)
	}
	if dec.More() {
		return DefaultTiming, fmt.Errorf("%s: trailing data after the JSON object", EnvTiming)
	}
	if t.Jitter < 0 || t.Jitter > 1 {
		return DefaultTiming, fmt.Errorf("%s: jitter %v: want 0..1", EnvTiming, t.Jitter)
	}
	return t, nil
}

// clock applies the scale and the optional seeded jitter.
type clock struct {
	t     Timing
	scale float64
	mu    sync.Mutex
	rng   *rand.Rand // nil: no jitter
}

func newClock(t Timing, scale float64, seed string) (*clock, error) {
	c := &clock{t: t, scale: scale}
	if seed != "" {
		n, err := strconv.ParseUint(seed, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: want an unsigned integer", EnvJitterSeed, seed)
		}
		c.rng = rand.New(rand.NewPCG(n, n^0x9e3779b97f4a7c15))
	}
	return c, nil
}

// d scales a model duration (and jitters it when seeded).
func (c *clock) d(model Duration) time.Duration {
	f := c.scale
	if c.rng != nil && c.t.Jitter > 0 {
		c.mu.Lock()
		f *= 1 + c.t.Jitter*(2*c.rng.Float64()-1)
		c.mu.Unlock()
	}
	return timescale.Scale(time.Duration(model), f)
}

// perGiB returns fixed-free per-GiB time for a RAM size in bytes.
func perGiB(per Duration, bytes int64) Duration {
	return Duration(float64(per) * float64(bytes) / float64(1<<30))
}
