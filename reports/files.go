package reports

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"

	"github.com/vmchaos/vmchaos/durable"
)

// File names inside a run dir.
const (
	ResultsFile  = "results.json"
	JUnitFile    = "junit.xml"
	MarkdownFile = "report.md"
	HTMLFile     = "report.html"
)

// WriteAll writes results.json and renders junit.xml, report.md and
// report.html into dir (created if missing). results.json is written first: it
// is the source of truth, so if rendering fails or the writer dies the reports
// can be rebuilt with `vmchaos report render`. Every file goes through
// durable.WriteFile, so a reader never sees a torn report. r.Dir is set to
// dir, and r.Build to this binary's BuildInfo when empty.
func WriteAll(dir string, r *Results) error {
	if r == nil {
		return errors.New("write results: nil results")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	if r.Build == "" {
		r.Build = BuildInfo()
	}
	FillInjectionErrors(r)
	data, err := Marshal(r)
	if err != nil {
		return fmt.Errorf("write results %s: %w", dir, err)
	}
	if err := durable.WriteFile(filepath.Join(dir, ResultsFile), data, 0o644); err != nil {
		return err
	}
	r.Dir = dir
	return Render(dir, r)
}

// Render (re)writes junit.xml, report.md and report.html from r into dir,
// leaving results.json alone. Every renderer runs even if another fails.
func Render(dir string, r *Results) error {
	if r == nil {
		return errors.New("render reports: nil results")
	}
	var errs []error
	// A selftest run dir also holds selftest.json; its table heads the
	// reports, since there a failing case with a bug switched on is the
	// expected outcome.
	rows, err := LoadSelftest(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, out := range []struct {
		name   string
		render func() ([]byte, error)
	}{
		{JUnitFile, func() ([]byte, error) { return JUnit(r) }},
		{MarkdownFile, func() ([]byte, error) { return renderMarkdown(r, rows) }},
		{HTMLFile, func() ([]byte, error) { return renderHTML(r, rows) }},
	} {
		data, err := out.render()
		if err != nil {
			errs = append(errs, fmt.Errorf("render %s: %w", out.name, err))
			continue
		}
		if err := durable.WriteFile(filepath.Join(dir, out.name), data, 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Marshal encodes results.json (indented, trailing newline). Non-finite
// numbers, which JSON cannot carry, are refused with the case that holds them.
func Marshal(r *Results) ([]byte, error) {
	if err := checkFinite(r); err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode results: %w", err)
	}
	return append(data, '\n'), nil
}

// Load reads a results.json, given either its path or the run dir holding it.
// The returned Results has Dir set to the run dir.
func Load(path string) (*Results, error) {
	file := path
	if fi, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("load results: %w", err)
	} else if fi.IsDir() {
		file = filepath.Join(path, ResultsFile)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("load results: %w", err)
	}
	r, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("load results %s: %w", file, err)
	}
	r.Dir = filepath.Dir(file)
	return r, nil
}

// Parse decodes and validates results.json bytes. Unknown fields are allowed
// (a newer vmchaos may add some); what the gate and the renderers rely on is
// checked: one JSON document, non-empty case ids, known verdicts.
func Parse(data []byte) (*Results, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var r Results
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode: trailing data after the results document")
	}
	if err := Validate(&r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate checks the properties every consumer of results relies on. A case
// id may repeat within one run: `vmchaos selftest` runs the same case with
// and without a bug switch (its repro command tells them apart). Across
// shards a repeated id is an overlap, which Merge refuses.
func Validate(r *Results) error {
	if r.Coverage != nil && r.Coverage.Version != CoverageVersion {
		return fmt.Errorf("phase_coverage version %d, this vmchaos reads version %d: recompute it with a matching vmchaos", r.Coverage.Version, CoverageVersion)
	}
	for i, c := range r.Cases {
		if c.ID == "" {
			return fmt.Errorf("case #%d: empty id", i)
		}
		switch c.Verdict {
		case Pass, Fail, Inconclusive, Error, Flaky:
		default:
			return fmt.Errorf("case %q: unknown verdict %q (want pass, fail, inconclusive, error or flaky)", c.ID, c.Verdict)
		}
	}
	return validateNotRun(r)
}

// validateNotRun: every not_run entry names a case of the run, and that
// case did not pass (a case the host could not run proves nothing).
func validateNotRun(r *Results) error {
	verdicts := make(map[string]string, len(r.Cases))
	for _, c := range r.Cases {
		verdicts[c.ID] = c.Verdict
	}
	for _, n := range r.NotRun {
		v, ok := verdicts[n.Case]
		switch {
		case !ok:
			return fmt.Errorf("not_run: case %q is not among the run's cases", n.Case)
		case v == Pass:
			return fmt.Errorf("not_run: case %q is listed as not run but its verdict is pass", n.Case)
		}
	}
	return nil
}

func checkFinite(r *Results) error {
	bad := func(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) }
	if bad(r.TimeScale) {
		return fmt.Errorf("time_scale is %v", r.TimeScale)
	}
	for _, c := range r.Cases {
		for name, f := range map[string]float64{"time_scale": c.TimeScale, "offset_ms": c.OffsetMs, "duration_ms": c.DurationMs, "converge_ms": c.ConvergeMs} {
			if bad(f) {
				return fmt.Errorf("case %q: %s is %v", c.ID, name, f)
			}
		}
		for k, f := range c.Metrics {
			if bad(f) {
				return fmt.Errorf("case %q: metric delta %s is %v", c.ID, k, f)
			}
		}
	}
	return nil
}

// Version is the vmchaos version stamped at link time, e.g.
// go build -ldflags "-X github.com/vmchaos/vmchaos/reports.Version=$(git describe --always --dirty)".
var Version string

// BuildInfo names the running binary's build so a report says which code
// produced it: Version when stamped, else the VCS revision Go recorded (12
// hex digits, "+dirty" for local changes), with the Go version. Empty when
// neither is known (go test binaries, GOFLAGS=-buildvcs=false).
func BuildInfo() string {
	bi, ok := debug.ReadBuildInfo()
	if Version != "" {
		if ok {
			return Version + " (" + bi.GoVersion + ")"
		}
		return Version
	}
	if !ok {
		return ""
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return ""
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "+dirty"
	}
	return rev + " (" + bi.GoVersion + ")"
}
