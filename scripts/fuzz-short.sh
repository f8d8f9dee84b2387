#!/usr/bin/env bash
# A short pass of every fuzz target (the seed corpora also run in `go test`).
#
# The budget is a count of executions, not a duration: with a duration
# -fuzztime, Go's fuzz coordinator (go1.26) can fail a target with a bare
# "context deadline exceeded" when the deadline fires (golang/go#75804, fixed
# in go1.27) — a harness race, not a finding, and it turned CI red once. A
# count limit creates no deadline, so only a real crasher fails this pass.
# CI's budget is a smoke pass (most of a target's time is its start and the
# baseline over its corpus, not the executions); `make fuzz` runs each target
# 200,000 times. FUZZTIME overrides either (e.g. FUZZTIME=30s locally).
set -euo pipefail
budget=${FUZZTIME:-3000x}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
    start=$(date +%s.%N)
    if ! go test -run '^$' -fuzz "^$f\$" -fuzztime "$budget" "$pkg" >"$log" 2>&1; then
      cat "$log"
      exit 1
    fi
    printf 'fuzz %s %s (%s) ok in %.1fs\n' "$pkg" "$f" "$budget" "$(echo "$(date +%s.%N) - $start" | bc)"
  done
done
