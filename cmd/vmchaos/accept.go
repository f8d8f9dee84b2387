package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/vmchaos/vmchaos/reports"
)

// acceptSet joins the --accept entries and those of --accept-file (one per
// line, blank lines and # comments ignored) into the gate's accept set:
// CASE:INVARIANT pairs, or bare case ids, each of which gets a warning on
// warn (a bare id would hide a new invariant failing in that case).
func acceptSet(entries []string, file string, warn io.Writer) (reports.AcceptSet, error) {
	all := append([]string(nil), entries...)
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return reports.AcceptSet{}, fmt.Errorf("--accept-file: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if i := strings.IndexByte(line, '#'); i >= 0 {
				line = line[:i]
			}
			all = append(all, line)
		}
	}
	set, warnings, err := reports.ParseAccept(all)
	if err != nil {
		return reports.AcceptSet{}, err
	}
	for _, w := range warnings {
		fmt.Fprintln(warn, w)
	}
	return set, nil
}
