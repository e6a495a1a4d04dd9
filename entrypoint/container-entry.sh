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
exec rocmft "$@"
