#!/usr/bin/env bash
# A short pass of every fuzz target (the seed corpora also run in `go test`).
set -euo pipefail
secs=${FUZZTIME:-3s}
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
    echo "fuzz $pkg $f ($secs)"
    go test -run '^$' -fuzz "^$f\$" -fuzztime "$secs" "$pkg" >/tmp/fuzz-$$.log 2>&1 || { cat /tmp/fuzz-$$.log; exit 1; }
  done
done
rm -f /tmp/fuzz-$$.log
