#!/usr/bin/env bash
# LLaMA-Factory and the rest of rocmft's runtime dependencies (pyproject.toml, less DeepSpeed, which the target
# stage builds for its accelerator), resolved against the lock; torch from the torch step satisfies their torch pin.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
if rehearsal; then
  skipped stack "needs torch (the torch step) and wheels for the real base's Python $PYTHON_VERSION"
  exit 0
fi
rocmft-pip install -c /opt/rocmft/build/lock.txt -r /opt/rocmft/build/requirements.txt
ran stack "$(python -c 'import importlib.metadata as m; print(", ".join(f"{d} {m.version(d)}" for d in ("llamafactory", "transformers", "peft", "accelerate")))')"
