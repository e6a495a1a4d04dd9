#!/bin/sh
# `rocmft-pip ARGS`: pip inside image builds. When the build got a CA bundle as the BuildKit secret
# `ca_bundle` (a TLS-intercepting proxy's CA, e.g. the host's /etc/ssl/certs/ca-certificates.crt), pip
# trusts it. The secret is mounted for the one RUN step only and never stored in a layer.
set -eu
if [ -s /run/secrets/ca_bundle ]; then
  PIP_CERT=/run/secrets/ca_bundle
  export PIP_CERT
fi
exec python3 -m pip "$@"
