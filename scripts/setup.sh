#!/usr/bin/env bash
# Prepares a fresh machine: Debian packages the sandbox supervisor, the
# realch netns tests and the registry cases need, and the Go modules.
# Idempotent and quiet when done.
#   scripts/setup.sh              what make test and make chaos need
#   scripts/setup.sh image-check  also QEMU and e2fsprogs (make image-check),
#                                 kept out of make test: a large install
set -euo pipefail
need=()
# qemu-utils: qemu-img makes the qcow2 overlays the fake guest is tested against.
# docker-registry: the CNCF distribution server, the real OCI registry of the
# registry:oci cases (started per case by the harness, never as a service).
# nftables: net-partition's drop rules inside the case's node namespace.
# containernetworking-plugins: the CNI plugins (/usr/lib/cni) that give a
# cocoon VM its NIC in a netns the run creates (docs/manager.md "Networking").
pkgs=(systemd dbus dbus-daemon util-linux mount iproute2 qemu-utils docker-registry nftables containernetworking-plugins)
for extra in "$@"; do
  case "$extra" in
  # qemu-system-x86, e2fsprogs: `vmchaos image check` boots the real guest under TCG, reads its disk.
  image-check) pkgs+=(qemu-system-x86 e2fsprogs) ;;
  *) echo "setup: unknown extra $extra (known: image-check)" >&2; exit 2 ;;
  esac
done
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    case " ${need[*]} " in *" docker-registry "*)
      # the package enables a registry service on :5000 of every address;
      # the harness starts its own per case on loopback, so this one stays off
      if [ -d /run/systemd/system ]; then systemctl disable --now docker-registry.service >/dev/null 2>&1 || true; fi ;;
    esac
  else
    echo "setup: missing packages ${need[*]} (not root: the sandbox supervisor will be skipped with its reason)" >&2
  fi
fi
go mod download
