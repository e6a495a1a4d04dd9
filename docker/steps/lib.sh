# shellcheck shell=bash
# Sourced by every image build step (docker/steps/<step>.sh, run from the Dockerfile). Each step records
# what it did in /etc/rocmft/build-steps.jsonl (one JSON object a line: step, status ran|skipped, detail,
# seconds), which rocmft.image.buildinfo copies into the image's build record and `make rehearse` prints.
# A step may be skipped only in a rehearsal (REHEARSAL=1, `make rehearse`: the ROCm recipe built against a
# stand-in base, docker/rehearsal/), and then says by name what it needs that is not there.
set -euo pipefail
STEP_LOG=${STEP_LOG:-/etc/rocmft/build-steps.jsonl}
_started=$(date +%s)

_record() {  # name status detail
  mkdir -p "$(dirname "$STEP_LOG")"
  python3 -c 'import json, sys; print(json.dumps(dict(zip(("step", "status", "detail", "seconds"), [*sys.argv[1:4], int(sys.argv[4])]))))' \
    "$1" "$2" "$3" "$(($(date +%s) - _started))" >>"$STEP_LOG"
  _started=$(date +%s)
}

# ran NAME DETAIL: NAME ran; DETAIL says what it did (versions, targets).
ran() { _record "$1" ran "$2"; echo "[build] $1: ran: $2"; }

# skipped NAME WHY: NAME cannot run here (rehearsals only; a real build must never skip a step).
skipped() {
  if [ "${REHEARSAL:-0}" != 1 ]; then
    echo "[build] $1 cannot run: $2 (only a rehearsal, REHEARSAL=1, may skip a step)" >&2
    exit 1
  fi
  _record "$1" skipped "$2"
  echo "[build] $1: skipped: $2"
}

rehearsal() { [ "${REHEARSAL:-0}" = 1 ]; }

# The architecture profile's build settings (docker/arch/<ARCH>.env without its runtime settings; the Dockerfile's
# profile stage extracts them) as variables.
# shellcheck source=/dev/null
load_profile() { set -a; . /etc/rocmft/build-profile.env; set +a; }

# `pin NAME FILE`: the NAME==VERSION line of a requirements FILE, into $PIN (not printed for a $(...): a failure
# there would only end the substitution, and pip would then be given an empty requirement).
pin() {
  # shellcheck disable=SC2034  # read by the calling step
  PIN=$(grep -i -m1 -E "^$1==" "$2") || {
    echo "[build] $1 has no pinned version in $2: run make lock-rocm (ROCm) or make lock (cpu) after pyproject.toml changes" >&2
    exit 1
  }
}
# `locked NAME`: NAME's pin in the flavour's lock, into $PIN.
locked() { pin "$1" /opt/rocmft/build/lock.txt; }

# Builds and installs a source distribution for the image's target (DeepSpeed's ops, flash-attention, the
# rehearsal's arch probe): never from pip's wheel cache, which keys a wheel built from an sdist by the sdist
# alone and would hand a wheel built for one architecture (or accelerator) to the next (`make images`).
# BuildKit's layer cache, keyed by the build arguments, is what keeps a build from being repeated.
build_for_target() { rocmft-pip install --no-cache-dir --no-build-isolation "$@"; }
