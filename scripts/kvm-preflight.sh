#!/usr/bin/env bash
# Fails (exit 1) with the precise reason unless this machine can run the real
# cloud-hypervisor backend: /dev/kvm usable, a supported cloud-hypervisor,
# firmware or kernel, and a guest image. Used by the nightly workflow; see
# docs/realch.md for the set-up and the meaning of each reason.
set -euo pipefail
cd "$(dirname "$0")/.."
VMCHAOS_REQUIRE_REAL=1 exec go test -count=1 -run '^TestRealBackendPreflight$' -v ./realch/
