#!/usr/bin/env bash
# Measure the cpu image: cold build time, rebuild time after touching one file in entrypoint/, image size,
# and the time from `docker compose up train` to the first training step. Not a test: prints numbers for
# BENCHMARKS.md. Run from the repository root after `make docker-ready`:  bash bench/docker_timings.sh
# "Cold" means no image and no BuildKit cache (pip downloads everything again); the base image is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
now() { date +%s.%N; }
since() { python3 -c "print(f'{$(now) - $1:.1f}')"; }

docker rmi -f rocmft:cpu "rocmft:$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)-cpu" >/dev/null 2>&1 || true
docker builder prune -af >/dev/null
t=$(now); make -s image ARCH=cpu >/tmp/rocmft-bench-cold.log 2>&1; cold=$(since "$t")

# a real content change (BuildKit keys its cache on content, so `touch` alone would rebuild nothing)
cp entrypoint/rocmft/__init__.py /tmp/rocmft-bench-init.py
trap 'cp /tmp/rocmft-bench-init.py entrypoint/rocmft/__init__.py' EXIT
echo "# rebuild benchmark $(date +%s)" >> entrypoint/rocmft/__init__.py
t=$(now); make -s image ARCH=cpu >/tmp/rocmft-bench-rebuild.log 2>&1; rebuild=$(since "$t")
cp /tmp/rocmft-bench-init.py entrypoint/rocmft/__init__.py

size=$(docker image inspect rocmft:cpu --format '{{.Size}}')
work=$(mktemp -d); mkdir -p "$work/saves" "$work/data"
compose=(docker compose --project-directory "$work" -p rocmft-bench -f compose.yaml -f compose.cpu.yaml)
t=$(now); first=""
while IFS= read -r line; do
  if [ -z "$first" ] && [[ "$line" == *"[rocmft] step "* ]]; then first=$(since "$t"); fi
done < <(ARCH=cpu HOST_UID=$(id -u) HOST_GID=$(id -g) "${compose[@]}" up --exit-code-from train train 2>&1)
total=$(since "$t")
ARCH=cpu "${compose[@]}" down -v >/dev/null 2>&1 || true
rm -rf "$work"

echo "cpu image size:                       $(python3 -c "print(f'{$size / 1e9:.2f} GB')")"
echo "cold build (make image ARCH=cpu):      ${cold} s"
echo "rebuild after editing entrypoint/:     ${rebuild} s"
echo "compose up train -> first step logged: ${first} s (cold cache volume: includes building the tiny model)"
echo "compose up train -> container exit:    ${total} s"
