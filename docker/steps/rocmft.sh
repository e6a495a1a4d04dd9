#!/usr/bin/env bash
# rocmft itself, LLaMA-Factory's argument vocabulary baked beside the build record, then the build check
# (rocmft.image.buildinfo: fails the build listing every broken promise of the profile; writes /etc/rocmft/build.json).
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
if rehearsal; then
  # the build check's own two dependencies, which the (skipped) stack step installs in a real build
  locked pyelftools && elftools=$PIN
  locked zstandard
  rocmft-pip install --no-deps "$elftools" "$PIN"
fi
rocmft-pip install --no-deps --no-build-isolation /tmp/rocmft-src
rm -rf /tmp/rocmft-src
ran rocmft "$(python -c 'import importlib.metadata as m; print("rocmft", m.version("rocmft"))')"
if rehearsal; then
  skipped vocabulary "needs LLaMA-Factory (the stack step) to read its argument dataclasses"
else
  ROCMFT_CACHE_DIR=/etc/rocmft python -c "from rocmft.config.lfargs import vocabulary; vocabulary()"
  ran vocabulary "$(ls /etc/rocmft/lf-vocabulary-*.json)"
fi
python -m rocmft.image.buildinfo /etc/rocmft/arch.env /etc/rocmft/build.json
