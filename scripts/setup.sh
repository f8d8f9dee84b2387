#!/usr/bin/env bash
# Prepares a fresh machine: Debian packages the sandbox supervisor and the
# realch netns tests need, and the Go modules. Idempotent and quiet when done.
set -euo pipefail
need=()
# qemu-utils: qemu-img makes the qcow2 overlays the fake guest is tested against.
# qemu-system-x86, e2fsprogs: `vmchaos image check` boots the real guest under TCG, reads its disk.
for p in systemd dbus dbus-daemon util-linux mount iproute2 qemu-utils qemu-system-x86 e2fsprogs; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "setup: missing packages ${need[*]} (not root: the sandbox supervisor will be skipped with its reason)" >&2
  fi
fi
go mod download
