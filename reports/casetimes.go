package reports

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"time"

	"github.com/vmchaos/vmchaos/durable"
)

// CaseTimesFile is the file beside a results root's run dirs (the parent
// of each run dir: ./vmchaos-results by default) in which every run
// records how long each of its cases took, and from which the next
// scheduled run orders its shared cases (suite.ByTimes, issue #37).
const CaseTimesFile = "case-times.json"

// CaseTimes is how long each case took the last time it ran, per backend
// and time scale (a case at scale 1 takes twenty times what it takes at
// 0.05; a real backend is another stack).
type CaseTimes struct {
	Version int `json:"version"`
	// Runs is keyed by CaseTimesKey, then by case ID: milliseconds.
	Runs map[string]map[string]float64 `json:"runs"`
}

// CaseTimesKey is the key of a backend and time scale in CaseTimes.Runs.
func CaseTimesKey(backend string, scale float64) string {
	return backend + "@" + strconv.FormatFloat(scale, 'g', -1, 64)
}

// LoadCaseTimes reads a case-times file; a missing one is empty, not an
// error (the first run of a results root has none).
func LoadCaseTimes(path string) (*CaseTimes, error) {
	ct := &CaseTimes{Version: 1, Runs: map[string]map[string]float64{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return ct, nil
	}
	if err != nil {
		return nil, fmt.Errorf("case times: %w", err)
	}
	if err := json.Unmarshal(b, ct); err != nil {
		return nil, fmt.Errorf("case times %s: %w", path, err)
	}
	if ct.Runs == nil {
		ct.Runs = map[string]map[string]float64{}
	}
	return ct, nil
}

// Of is the recorded duration of every case run on backend at scale.
func (ct *CaseTimes) Of(backend string, scale float64) map[string]time.Duration {
	out := map[string]time.Duration{}
	for id, ms := range ct.Runs[CaseTimesKey(backend, scale)] {
		out[id] = time.Duration(ms * float64(time.Millisecond))
	}
	return out
}

// TimesOf is the duration of every case of res that ran (one of a
// results.json given to --times instead of a case-times file).
func TimesOf(res *Results) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, c := range res.Cases {
		if c.DurationMs > 0 {
			out[c.ID] = time.Duration(c.DurationMs * float64(time.Millisecond))
		}
	}
	return out
}

// RecordCaseTimes merges the durations of res's cases into the case-times
// file at path (durable.WriteFile: a reader never sees half of it; two
// runs finishing at once may lose one's update, which costs only an
// ordering hint).
func RecordCaseTimes(path string, res *Results) error {
	ct, err := LoadCaseTimes(path)
	if err != nil {
		// a corrupt file is replaced: it only ever held hints
		ct = &CaseTimes{Version: 1, Runs: map[string]map[string]float64{}}
	}
	key := CaseTimesKey(res.Backend, res.TimeScale)
	m := ct.Runs[key]
	if m == nil {
		m = map[string]float64{}
		ct.Runs[key] = m
	}
	times := TimesOf(res)
	if len(times) == 0 {
		return nil
	}
	for id, d := range times {
		m[id] = float64(d) / float64(time.Millisecond)
	}
	b, err := json.Marshal(ct)
	if err != nil {
		return fmt.Errorf("case times: %w", err)
	}
	if err := durable.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("case times: %w", err)
	}
	return nil
}
