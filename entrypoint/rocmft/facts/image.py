"""What the image promises: its architecture profile and the build record written when it was built.

Outside a rocmft image neither file exists; the checkout's (or the installed wheel's) docker/arch/<ARCH>.env
profiles stand in for the profile of a given gfx target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The image's copy of docker/arch/<ARCH>.env (the Dockerfile installs it; container-entry.sh reads it).
ARCH_PROFILE = Path("/etc/rocmft/arch.env")
BUILD_RECORD = Path("/etc/rocmft/build.json")  # written by rocmft.image.buildinfo at image build time


def read_profile(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of an architecture profile (comments and blank lines skipped).

    Raises:
        OSError: the file cannot be read.
    """
    profile = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            profile[key.strip()] = value.strip()
    return profile


def build_record() -> dict[str, Any] | None:
    """The image's build record (written at image build time), or None outside a rocmft image."""
    try:
        return json.loads(BUILD_RECORD.read_text())
    except (OSError, ValueError):
        return None


def shipped_profiles() -> Path | None:
    """The folder of the architecture profiles shipped with rocmft: ``rocmft/profiles`` in an installed wheel,
    ``docker/arch`` at the top of the repository in a source checkout; None when neither is there."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "profiles", package.parents[1] / "docker" / "arch"):
        if (candidate / "cpu.env").is_file():
            return candidate
    return None


def profile_for(arch: str, image_profile: Path = ARCH_PROFILE) -> dict[str, str] | None:
    """The architecture profile of gfx target ``arch``: the image's own when it is that target's, else the
    shipped docker/arch/<arch>.env; None when neither exists (an unknown target)."""
    shipped = shipped_profiles()
    for path in (image_profile, shipped / f"{arch}.env" if shipped else None):
        if path is None:
            continue
        try:
            values = read_profile(path)
        except OSError:
            continue
        if values.get("ARCH") == arch:
            return values
    return None


__all__ = ["ARCH_PROFILE", "BUILD_RECORD", "build_record", "profile_for", "read_profile", "shipped_profiles"]
