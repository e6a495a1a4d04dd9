#!/bin/sh
# Container entry (ENTRYPOINT, behind tini): apply the architecture's runtime profile, then run rocmft.
# Each RUNTIME_<NAME>=<value> line of /etc/rocmft/arch.env (docker/arch/<ARCH>.env) becomes NAME=<value>,
# unless NAME is already set: a user's own value always wins. Then `rocmft "$@"` (default: train) replaces
# this shell, so signals from `docker compose stop` reach rocmft directly.
set -eu
profile=${ARCH_PROFILE:-/etc/rocmft/arch.env}
if [ -r "$profile" ]; then
  while IFS='=' read -r key value; do
    case "$key" in
      RUNTIME_*)
        name=${key#RUNTIME_}
        if ! printenv "$name" >/dev/null 2>&1; then
          export "$name=$value"
        fi
        ;;
    esac
  done < "$profile"
fi
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
