#!/usr/bin/env bash
# Everything a lent GPU host (no network, Python 3.12, torch 2.11 preinstalled) needs for the GPU tests and the
# benchmarks, in one folder under the device tool's 64 MiB carry limit:
#   DIR/            the training stack (../shared/device/fetch-wheels.sh) + pydantic-settings, liger-kernel, torchao
#                   and bitsandbytes with only its CUDA 13.0 and CPU libraries (docs/gpu-testing.md)
#   DIR/peer/       Unsloth for bench/throughput.py's run (e) (bench/peer_unsloth.py names the versions and why)
# Usage: bash bench/gpu_wheels.sh DIR      (then carry DIR; install as docs/gpu-testing.md says)
set -euo pipefail
dir=${1:?usage: gpu_wheels.sh DIR}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
shared=${SHARED_DIR:-$here/../shared}
plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform any)
get() { python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d "$@"; }

bash "$shared/device/fetch-wheels.sh" "$dir" pydantic-settings==2.16.3 python-dotenv liger-kernel==0.8.5 \
  torchao==0.17.0
# bitsandbytes: keep the two libraries a CUDA 13.0 host loads; the wheel's other builds exceed the carry limit
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
get "$tmp" bitsandbytes==0.50.2
wheel=$(basename "$(ls "$tmp"/bitsandbytes-*.whl)")
mkdir "$tmp/x"
python3 -m zipfile -e "$tmp/$wheel" "$tmp/x"
find "$tmp/x/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name libbitsandbytes_cuda130.so \
  ! -name libbitsandbytes_cpu.so -delete
sed -i '/libbitsandbytes_/{/cuda130\|_cpu/!d}' "$tmp"/x/bitsandbytes-*.dist-info/RECORD
( cd "$tmp/x" && python3 -m zipfile -c "$tmp/$wheel.new" bitsandbytes bitsandbytes-*.dist-info )
mv "$tmp/$wheel.new" "$dir/$wheel"
mkdir -p "$dir/peer"
get "$dir/peer" unsloth==2026.10.9 unsloth_zoo==2026.10.9 datasets==4.3.0 cut_cross_entropy==25.1.1 tyro==1.0.17 \
  msgspec docstring-parser typeguard shtab
du -sh "$dir"
