package main

import (
	"fmt"
	"os"
	"strings"
)

// acceptIDs joins --accept ids and the ids of --accept-file (one per line,
// blank lines and # comments ignored) into the gate's accept set.
func acceptIDs(ids []string, file string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, id := range ids {
		if id = strings.TrimSpace(id); id != "" {
			out[id] = true
		}
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--accept-file: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if i := strings.IndexByte(line, '#'); i >= 0 {
				line = line[:i]
			}
			if id := strings.TrimSpace(line); id != "" {
				out[id] = true
			}
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}
