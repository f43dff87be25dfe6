#!/usr/bin/env bash
# Host packages forkd needs: QEMU (microvm + TCG/KVM), qemu-img, and what the guest
# image builder uses (debootstrap, busybox-static for the initramfs, lz4 to unpack
# the kernel, e2fsprogs for mkfs.ext4 -d); sandbox networking (iproute2 for namespaces,
# veths and taps; nftables for each sandbox's NAT and egress rules; util-linux's nsenter);
# Node.js and npm for the TypeScript SDK and the browser test, which drives Debian's
# chromium (never a downloaded browser); etcd (etcd-server 3.4), which a fleet of hosts
# registers in and the fleet tests start; podman (with runc, which runs on hosts whose cgroups
# are in hybrid mode, where podman's default crun does not), which builds and runs the daemon's
# container image (deploy/Dockerfile) in the container test; skopeo and umoci, which pull
# OCI/Docker images and apply their layers (forkd image pull, FROM REF), and docker-registry, the
# registry their tests start (apache2-utils: its htpasswd writes the bcrypt file the registry's
# auth reads).
# Idempotent: does nothing when all are present.
set -euo pipefail
PKGS=(qemu-system-x86 qemu-system-common qemu-utils debootstrap busybox-static lz4 e2fsprogs
      python3-venv iproute2 nftables util-linux chromium etcd-server podman runc skopeo umoci
      docker-registry apache2-utils)
# A node from elsewhere (e.g. a newer one already on PATH) is kept; Debian's otherwise.
command -v node >/dev/null && command -v npm >/dev/null || PKGS+=(nodejs npm)
# --bench: also Debian's numpy, for the benchmarks' unsandboxed floor (the guest's own build).
# and wrk, which drives the control-plane benchmark's many clients.
[ "${1:-}" = "--bench" ] && PKGS+=(python3-numpy wrk)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "host packages: all present"
    exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing host packages: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "host packages: installed ${missing[*]}"
