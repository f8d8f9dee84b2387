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
#
# Targets run FUZZJOBS at a time (default: the number of CPUs), each with one
# fuzz worker: a target's start (link, corpus baseline) is mostly one thread,
# so two side by side keep both cores busy.
set -euo pipefail
budget=${FUZZTIME:-3000x}
jobs=${FUZZJOBS:-$(nproc)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
targets=()
for pkg in $(go list ./...); do
  pdir=$(go list -f '{{.Dir}}' "$pkg")
  for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$pdir"/*_test.go 2>/dev/null | sed 's/^func //'); do
    targets+=("$pkg $f")
  done
done
run_one() {
  local pkg=$1 f=$2 log
  log="$dir/$(echo "$pkg.$f" | tr '/' '_').log"
  local start
  start=$(date +%s.%N)
  if ! go test -run '^$' -fuzz "^$f\$" -fuzztime "$budget" -parallel 1 "$pkg" >"$log" 2>&1; then
    echo "FAIL fuzz $pkg $f"
    cat "$log"
    return 1
  fi
  printf 'fuzz %s %s (%s) ok in %.1fs\n' "$pkg" "$f" "$budget" "$(echo "$(date +%s.%N) - $start" | bc)"
}
export -f run_one
export budget dir
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -L 1 bash -c 'run_one "$0" "$1"'
