#!/usr/bin/env bash
# System stage: the OS packages the stack needs, the virtual environment, the unprivileged user, the folders.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

# Install only what the base lacks: a ROCm development image or a debootstrapped Debian may already hold these,
# and a machine without a Debian/Ubuntu mirror can then build from a base that carries them.
# numactl: torchrun --numa-binding (ROCMFT_NUMA_BIND) starts each rank under it. No cmake: nothing here needs it
# (bitsandbytes comes as a wheel; its source fallback installs the cmake it needs from PyPI).
packages=(python3 python3-venv python3-dev g++ make git ca-certificates tini numactl)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  rm -rf /var/lib/apt/lists/*
fi
python3 -m venv /opt/venv
# at the lock's pins (pins.sh: this stage sees only them, so a re-pin elsewhere in the lock does not rebuild it)
rocmft-pip install -q -c /opt/rocmft/build/pins-system.txt "setuptools>=77" wheel

# The user: UID/GID 1000, because compose's default HOST_UID and the saves/ folder's owner are 1000 on most hosts.
# Ubuntu 24.04 (every rocm/* image's base) already has user `ubuntu` with UID/GID 1000, and `useradd --uid 1000`
# then fails with "UID 1000 is not unique" (jupyterhub/repo2docker#1346, kubeflow/kubeflow#7728): that user is
# removed first. The ROCm base also has group render (GID 109); --force keeps an existing group as it is.
groupadd --system --force render
groupadd --system --force video
for kind in passwd group; do
  holder=$(getent "$kind" 1000 | cut -d: -f1 || true)
  if [ -n "$holder" ] && [ "$holder" != rocmft ]; then
    if [ "$kind" = passwd ]; then userdel --remove "$holder" 2>/dev/null || userdel "$holder"; else groupdel "$holder"; fi
    echo "[build] removed the base image's $kind entry '$holder' (id 1000) for rocmft"
  fi
done
useradd --create-home --uid 1000 --user-group --groups video,render --shell /bin/bash rocmft
install -d -m 1777 /cache /saves /data
ran system "python $(python3 -c 'import platform; print(platform.python_version())'), user $(id rocmft)"
