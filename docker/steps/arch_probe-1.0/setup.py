# The rehearsal's arch probe, built only when REHEARSAL=1 (docker/steps/target.sh): its build writes the
# PYTORCH_ROCM_ARCH it was built with into the package, the way DeepSpeed's ops and flash-attention compile for it.
import os
from pathlib import Path

from setuptools import setup

Path("arch_probe/__init__.py").write_text(f"BUILT_FOR = {os.environ.get('PYTORCH_ROCM_ARCH', '')!r}\n")
setup(name="arch-probe", version="1.0", packages=["arch_probe"])
