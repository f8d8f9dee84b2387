# vmchaos — see README.md. Every target that needs set-up runs `setup` first.
GO        ?= go
BIN       := $(CURDIR)/bin
SCALE     ?= 0.05
REPORTDIR ?= $(CURDIR)/vmchaos-results
PKGS      := ./...
VERSION   := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
LDFLAGS   := -X github.com/vmchaos/vmchaos/reports.Version=$(VERSION)

.PHONY: all setup build test unit fast-suite lint fuzz-short fuzz bench bench-accuracy kvm-preflight conformance chaos selftest selftest-fast selftest-rates systemd-fast manager stability clean

all: build

setup:
	@scripts/setup.sh

build:
	@mkdir -p $(BIN)
	@# static (no cgo: nothing here needs it): the stack execs vmctl dozens
	@# of times a case, and a static binary skips the dynamic loader; the
	@# real guest's workload writer must run on any guest image
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...
	@# fakech is the drop-in cloud-hypervisor of the fake backend
	@cp -f $(BIN)/fakech $(BIN)/cloud-hypervisor

# test: what CI runs — lint, unit tests with -race, a short fuzz pass, the
# fast scenario subset (time scale <= 0.1) with the sandbox and the systemd
# supervisors, and the fast regression selftest
# (each historical bug switched back on must be caught by its scenario).
# lint, unit and fuzz-short run side by side (the unit tests mostly wait on the
# processes they start, so two cores have room); the scenario runs after them
# are timing-sensitive and run one after the other, alone.
test: setup build
	@$(MAKE) --no-print-directory -j3 --output-sync=target lint unit fuzz-short
	@$(MAKE) --no-print-directory fast-suite systemd-fast selftest-fast

# unit: go test -json through internal/testsummary, which prints each
# package's result, every skipped test with its reason, every failure in full
# and "N passed, N failed, N skipped"; pipefail keeps go test's own status.
unit:
	@bash -o pipefail -c 'VMCHAOS_BIN=$(BIN) $(GO) test -json -race -count=1 -timeout 15m $(PKGS) | $(GO) run ./internal/testsummary'

# conformance: the fakech ⇄ cloud-hypervisor suite (docs/fakech.md "Conformance
# with cloud-hypervisor"): every row against fakech, and against the binary
# VMCHAOS_CH names when it is set (VMCHAOS_CH=/path/to/cloud-hypervisor make
# conformance). A row the host cannot run there skips with the preflight's reason.
conformance: build
	@bash -o pipefail -c 'VMCHAOS_BIN=$(BIN) $(GO) test -json -count=1 -timeout 10m ./fakech/conformance/ | $(GO) run ./internal/testsummary'

fast-suite:
	VMCHAOS_BIN=$(BIN) $(BIN)/vmchaos run --label-filter 'speed:fast' --time-scale $(SCALE) --report-dir $(REPORTDIR)/fast

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

fuzz-short:
	@scripts/fuzz-short.sh

# fuzz: a longer pass of every target than CI's (nightly, or before a release).
fuzz:
	@FUZZTIME=$${FUZZTIME:-200000x} scripts/fuzz-short.sh

bench:
	VMCHAOS_BIN=$(BIN) $(GO) test -run '^$$' -bench . -benchtime 2s $(PKGS)

# The injector's at-trigger accuracy distribution: 1,000 injections per supervisor
# (VMCHAOS_BENCH_INJECTIONS), idle and with one core loaded; uptime shows the load it ran under.
bench-accuracy:
	@uptime
	$(GO) test ./injector -run '^$$' -bench BenchmarkAtAccuracy -benchtime 1x -timeout 120m -v
	$(GO) test ./failpoint -run '^$$' -bench BenchmarkSignalTimer -benchtime 1x -timeout 10m -v
	@uptime

# image-check: the real guest image (built, or copied from the cache, by
# `vmchaos image real`) booted twice under QEMU's TCG, no KVM needed: seed,
# SSH host key pin, DHCP lease, dhclient RELEASE hook, writer markers across a
# kill -9 and a clean shutdown (docs/realch.md). Root; 3-6 min on two cores,
# so nightly, not in test.
.PHONY: image-check
image-check: build
	@scripts/setup.sh image-check
	$(BIN)/vmchaos image real -q
	@mkdir -p $(REPORTDIR)
	$(BIN)/vmchaos image check --json $(REPORTDIR)/image-check.json

# On a KVM runner: is real CH usable here? (see docs/realch.md)
kvm-preflight: build
	scripts/kvm-preflight.sh

# chaos: the main job — the whole catalogue on the fake backend but the
# speed:nightly part of the fault matrix (docs/scenarios.md), report written.
# CHAOS_PARALLEL=auto runs it through the scheduler (timed cases alone, park
# and steady-state cases N at a time, N from the CPUs and the load);
# CHAOS_PARALLEL=1 is the sequential run.
CHAOS_PARALLEL ?= auto
chaos: setup build
	VMCHAOS_BIN=$(BIN) $(BIN)/vmchaos run --parallel $(CHAOS_PARALLEL) --label-filter '!speed:nightly' --time-scale $(SCALE) --report-dir $(REPORTDIR)/chaos-$$(date +%Y%m%d-%H%M%S)

# bench-chaos: the same selection run sequentially and through the scheduler
# on this build, one after the other: wall time, cases per minute and verdict
# differences (exit 1 when a verdict differs). BENCH_FILTER=speed:fast for a
# quick run; BENCH_PARALLEL sets the scheduled run's --parallel, or a comma
# list (BENCH_PARALLEL=2,3: one scheduled run per value against the one
# sequential run, to choose N on this machine). BENCH_SHARD=1/8 runs only that
# hash shard of the selection in every run (a sample, to compare N quickly).
# The scheduled runs start their shared cases shortest first by the durations
# the sequential run recorded; BENCH_CASE_TIMES=off: catalogue order.
BENCH_FILTER     ?= !speed:nightly
BENCH_PARALLEL   ?= auto
BENCH_SHARD      ?=
BENCH_CASE_TIMES ?= auto
.PHONY: bench-chaos
bench-chaos: setup build
	@uptime
	VMCHAOS_BIN=$(BIN) $(BIN)/vmchaos bench-chaos --label-filter '$(BENCH_FILTER)' --parallel $(BENCH_PARALLEL) --case-times $(BENCH_CASE_TIMES) $(if $(BENCH_SHARD),--shard $(BENCH_SHARD)) --time-scale $(SCALE) --report-dir $(REPORTDIR)/bench-chaos-$$(date +%Y%m%d-%H%M%S)
	@uptime

# chaos-nightly: the whole catalogue, nightly matrix included, in SHARDS
# shards one after the other (CI runs them as parallel jobs), joined by
# `report merge` into $(REPORTDIR)/nightly/merged and gated there. Each
# failing case is run REPRO_CHECK more times (--repro-check): its
# reproduction rate goes into results.json, report.md and report.html.
SHARDS ?= 4
REPRO_CHECK ?= 5
# soak: the catalogue pass after pass until SOAK_CASES cases have run, with a leak
# census (vmchaos doctor --census: processes, mounts, cgroups, netns, TAPs, fds, temp
# bytes) after each pass and at the end; fails on any non-zero census (scripts/soak.sh).
SOAK_CASES ?= 1000
.PHONY: soak
soak: build
	SOAK_CASES=$(SOAK_CASES) SOAK_SCALE=$(SCALE) BIN=$(BIN) SOAK_DIR=$(REPORTDIR)/soak-$$(date +%Y%m%d-%H%M%S) scripts/soak.sh

.PHONY: chaos-nightly
chaos-nightly: setup build
	@rm -rf $(REPORTDIR)/nightly; for i in $$(seq 1 $(SHARDS)); do \
	  VMCHAOS_BIN=$(BIN) $(BIN)/vmchaos run --shard $$i/$(SHARDS) --repro-check $(REPRO_CHECK) --time-scale $(SCALE) --report-dir $(REPORTDIR)/nightly/shard-$$i >/dev/null; done; \
	$(BIN)/vmchaos report merge -o $(REPORTDIR)/nightly/merged $(REPORTDIR)/nightly/shard-*; \
	$(BIN)/vmchaos report gate $(REPORTDIR)/nightly/merged

# manager: the manager-verb cases (layer:manager) through the one runner and
# suite, against the bundled vmctl (must pass),
# and against your own cocoon binary when MANAGER_BIN=/path/to/cocoon is given
# (its failures are findings; vmchaos never builds or fetches cocoon).
manager: setup build
	VMCHAOS_BIN=$(BIN) $(BIN)/vmchaos run --manager vmctl --label-filter layer:manager --time-scale $(SCALE) --report-dir $(REPORTDIR)/manager-vmctl-$$(date +%Y%m%d-%H%M%S)
	if [ -n "$(MANAGER_BIN)" ]; then VMCHAOS_BIN=$(BIN) $(BIN)/vmchaos run --manager cocoon --manager-bin $(MANAGER_BIN) --label-filter layer:manager --time-scale $(SCALE) --report-dir $(REPORTDIR)/manager-cocoon-$$(date +%Y%m%d-%H%M%S); fi

# The fast subset with the systemd supervisor. Where PID 1 is not systemd (CI,
# containers) it runs inside `vmchaos sandbox`, whose PID 1 is a real systemd.
systemd-fast: setup build
	@if [ -d /run/systemd/system ] && grep -qa systemd /proc/1/comm; then wrap=; else wrap="$(BIN)/vmchaos sandbox --"; fi; \
	VMCHAOS_BIN=$(BIN) $$wrap $(BIN)/vmchaos run --supervisor systemd --label-filter 'speed:fast' --time-scale $(SCALE) --report-dir $(REPORTDIR)/systemd-fast

# stability: the verdicts-are-stable claim (issue #19), not part of CI — the
# fast subset, every case 5 times idle and 5 times next to a one-core CPU hog;
# prints cases, flips and the worst fault-to-window margin; exit 1 on a flip.
# Both runs go through the scheduler (issue #37: 0 flips with it on):
# STABILITY_PARALLEL is fixed at 5, what auto picks on an idle 2-CPU host,
# not auto itself, because auto reads the CPUs' load and picks fewer on a
# busy host, and the two runs must use the same scheduler.
# STABILITY_PARALLEL=1 is the sequential claim.
STABILITY_REPEAT ?= 5
STABILITY_PARALLEL ?= 5
stability: setup build
	-VMCHAOS_BIN=$(BIN) $(BIN)/vmchaos run --label-filter 'speed:fast' --time-scale $(SCALE) --repeat $(STABILITY_REPEAT) --parallel $(STABILITY_PARALLEL) --report-dir $(REPORTDIR)/stability-idle
	-VMCHAOS_BIN=$(BIN) $(BIN)/vmchaos run --label-filter 'speed:fast' --time-scale $(SCALE) --repeat $(STABILITY_REPEAT) --parallel $(STABILITY_PARALLEL) --load cpu=1 --report-dir $(REPORTDIR)/stability-load
	$(BIN)/vmchaos stability $(REPORTDIR)/stability-idle $(REPORTDIR)/stability-load

# selftest: every bug 5 times with its switch on and 5 times off (detection
# rates; about 5 min on 2 cores). selftest-fast (CI) runs each once.
selftest: setup build
	VMCHAOS_BIN=$(BIN) $(BIN)/vmchaos selftest --count 5 --parallel 12 --time-scale $(SCALE) --report-dir $(REPORTDIR)/selftest

selftest-fast: setup build
	VMCHAOS_BIN=$(BIN) $(BIN)/vmchaos selftest --fast --parallel 12 --time-scale $(SCALE) --report-dir $(REPORTDIR)/selftest-fast

# selftest-rates: every bug SELFTEST_COUNT times with its switch on and off:
# detection rate k/N, the first catching run, false positives (must be 0/N);
# park (exact-phase) rows must be N/N (docs/selftest.md).
SELFTEST_COUNT ?= 20
selftest-rates: setup build
	VMCHAOS_BIN=$(BIN) $(BIN)/vmchaos selftest --count $(SELFTEST_COUNT) --parallel 12 --time-scale $(SCALE) --report-dir $(REPORTDIR)/selftest-rates

clean:
	rm -rf $(BIN) $(REPORTDIR)
