#!/bin/sh
# Container entry (ENTRYPOINT, behind tini): run rocmft, `rocmft "$@"` (default: train), replacing this shell so
# that signals from `docker compose stop` reach rocmft directly.
# The architecture's runtime profile (RUNTIME_<NAME>=<value> lines of /etc/rocmft/arch.env, docker/arch/<ARCH>.env)
# is applied by rocmft's launch itself (rocmft.launch.spec.runtime_environment), not here: `apptainer exec ...
# rocmft train` (deploy/slurm/train.sbatch) and a bare-metal install never run this script.
set -eu
if [ "${ROCMFT_HOLD_ON_CONFIG_ERROR:-0}" != 1 ]; then
  exec rocmft "$@"
fi
# Under compose's restart policy (the train service: restart on-failure, ROCMFT_HOLD_ON_CONFIG_ERROR=1): a crash
# restarts the container and `rocmft train` resumes from the last checkpoint, but a configuration error (2) or a
# failed health check (3) would fail the same way again. Docker cannot restart on some exit codes only, so for
# those the container stays up, idle, with the error in its log, instead of looping.
rocmft "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' TERM
trap 'kill -INT "$pid" 2>/dev/null' INT
code=0
wait "$pid" || code=$?
while kill -0 "$pid" 2>/dev/null; do  # a trapped signal ends `wait` early: wait for rocmft itself
  code=0
  wait "$pid" || code=$?
done
case "$code" in
  2|3)
    echo "[rocmft] exit $code: not restarting (the same settings would fail again). Fix what the message above" \
      "says, then: docker compose up -d --force-recreate train" >&2
    trap - TERM INT
    exec sleep infinity
    ;;
esac
exit "$code"
