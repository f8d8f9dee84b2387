// Command testsummary reads `go test -json` on stdin and makes skipped tests
// visible: it prints each package's result as it ends, then every skipped
// test with its reason, every failed test (and failed package) with its
// output in full, and a final "N passed, N failed, N skipped" line. It exits
// 1 when anything failed or nothing was read, so `make unit` fails with
// go test (issue 31, "Skips say so"; docs/architecture.md §12).
//
//	go test -json ./... | go run ./internal/testsummary
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func main() {
	s, err := summarize(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
	if !s.ok() {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	// ImportPath names the package of a build-output event, and a failed
	// package's FailedBuild the build whose output explains it.
	ImportPath  string
	FailedBuild string
}

// key names a test, or a package (Test "").
type key struct{ pkg, test string }

// summary is what the stream said.
type summary struct {
	events                 int
	passed, failed, skipd  int
	output                 map[key]*strings.Builder
	skips, fails, pkgFails []key
	builds                 map[string]string // failed package → the build that broke it
}

// ok: something ran and nothing failed.
func (s *summary) ok() bool {
	return s.events > 0 && s.failed == 0 && len(s.pkgFails) == 0
}

// summarize reads the stream from r and writes the report to w. Lines that
// are not JSON (go vet or build messages) are passed through as they come.
func summarize(r io.Reader, w io.Writer) (*summary, error) {
	s := &summary{output: map[key]*strings.Builder{}, builds: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(w, string(line))
			continue
		}
		s.events++
		s.add(w, e)
	}
	if err := sc.Err(); err != nil {
		return s, fmt.Errorf("read go test -json: %w", err)
	}
	s.report(w)
	return s, nil
}

// add takes one event: output is kept per test and package; a test's end
// is counted; a package's end prints its result line at once.
func (s *summary) add(w io.Writer, e event) {
	k := key{e.Package, e.Test}
	if e.Action == "build-output" {
		k = key{pkg: e.ImportPath}
	}
	switch e.Action {
	case "output", "build-output":
		b := s.output[k]
		if b == nil {
			b = &strings.Builder{}
			s.output[k] = b
		}
		b.WriteString(e.Output)
	case "pass":
		if e.Test != "" {
			s.passed++
		} else {
			fmt.Fprintf(w, "ok    %s\n", e.Package)
		}
	case "skip":
		if e.Test != "" {
			s.skipd++
			s.skips = append(s.skips, k)
		}
	case "fail":
		if e.Test != "" {
			s.failed++
			s.fails = append(s.fails, k)
			break
		}
		fmt.Fprintf(w, "FAIL  %s\n", e.Package)
		s.pkgFails = append(s.pkgFails, k)
		if e.FailedBuild != "" {
			s.builds[e.Package] = e.FailedBuild
		}
	}
}

// report prints the skips with their reasons, the failures in full, and
// the tally.
func (s *summary) report(w io.Writer) {
	if len(s.skips) > 0 {
		fmt.Fprintf(w, "\nSKIPPED (%d): a skipped test is not a passed one\n", len(s.skips))
		sort.Slice(s.skips, func(i, j int) bool { return less(s.skips[i], s.skips[j]) })
		for _, k := range s.skips {
			fmt.Fprintf(w, "  %s %s: %s\n", k.pkg, k.test, skipReason(s.text(k)))
		}
	}
	for _, k := range s.fails {
		fmt.Fprintf(w, "\n--- FAIL %s %s\n%s", k.pkg, k.test, s.text(k))
	}
	for _, k := range s.pkgFails {
		fmt.Fprintf(w, "\n--- FAIL package %s\n%s%s", k.pkg, s.text(key{pkg: s.builds[k.pkg]}), s.text(k))
	}
	fmt.Fprintf(w, "\n%d passed, %d failed, %d skipped", s.passed, s.failed, s.skipd)
	if n := len(s.pkgFails); n > 0 {
		fmt.Fprintf(w, " (%d package(s) failed)", n)
	}
	if s.events == 0 {
		fmt.Fprint(w, " (no go test -json events read: go test did not run)")
	}
	fmt.Fprintln(w)
}

func (s *summary) text(k key) string {
	if b := s.output[k]; b != nil {
		return b.String()
	}
	return ""
}

func less(a, b key) bool {
	if a.pkg != b.pkg {
		return a.pkg < b.pkg
	}
	return a.test < b.test
}

// skipReason is what a skipped test said: its output without go test's
// own "=== RUN"/"--- SKIP" framing, on one line; "no reason given" when it
// said nothing (t.SkipNow).
func skipReason(out string) string {
	var parts []string
	for _, l := range strings.Split(out, "\n") {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		parts = append(parts, t)
	}
	if len(parts) == 0 {
		return "no reason given"
	}
	return strings.Join(parts, " ")
}
