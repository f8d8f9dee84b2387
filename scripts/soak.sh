#!/usr/bin/env bash
# make soak: run the catalogue again and again until SOAK_CASES cases have
# run, with a leak census (vmchaos doctor --census) after each pass and at
# the end. Fails when any census is not zero. Verdicts are reported, not
# judged: the soak is about what the harness leaves behind.
#   SOAK_CASES (1000)  SOAK_FILTER ('!speed:nightly')  SOAK_SCALE (0.05)
#   SOAK_DIR (./vmchaos-results/soak-<date>)  BIN (./bin)
set -uo pipefail
cases=${SOAK_CASES:-1000}
filter=${SOAK_FILTER:-'!speed:nightly'}
scale=${SOAK_SCALE:-0.05}
bin=${BIN:-$PWD/bin}
out=${SOAK_DIR:-$PWD/vmchaos-results/soak-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
# A private, short TMPDIR (stack sockets live below it: sun_path is 108
# bytes): the census of it sees only this soak's runs.
tmp=$(mktemp -d /tmp/vsoak.XXXXXX)
trap 'rmdir "$tmp" 2>/dev/null' EXIT

census() { # $1: label
	echo "== census $1"
	"$bin/vmchaos" doctor --census --tmp-dir "$tmp" --results-dir "$out" || leaks=1
}

ran=0 pass=0 leaks=0 failed_passes=0
while (( ran < cases )); do
	pass=$((pass + 1))
	dir=$out/pass-$pass
	echo "== pass $pass ($ran of $cases cases run so far)"
	TMPDIR=$tmp VMCHAOS_BIN=$bin "$bin/vmchaos" run --label-filter "$filter" --time-scale "$scale" \
		--report-dir "$dir" || failed_passes=$((failed_passes + 1))
	n=$(jq '.cases | length' "$dir/results.json" 2>/dev/null || echo 0)
	if (( n == 0 )); then
		echo "soak: pass $pass ran no case (no $dir/results.json?)" >&2
		exit 1
	fi
	ran=$((ran + n))
	census "after pass $pass"
done
census "at the end"
"$bin/vmchaos" doctor --census --json --tmp-dir "$tmp" --results-dir "$out" > "$out/census.json"
echo "soak: $ran cases in $pass passes, $failed_passes pass(es) with failing verdicts; census: $( ((leaks)) && echo NOT ZERO || echo zero )"
exit $leaks
