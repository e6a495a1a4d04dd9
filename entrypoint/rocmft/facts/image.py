"""What the image promises: its architecture profile and the build record written when it was built.

Outside a rocmft image neither file exists; the checkout's (or the installed wheel's) docker/arch/<ARCH>.env
profiles stand in for the profile of a given gfx target.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rocmft.errors import ConfigError

# The image's copy of docker/arch/<ARCH>.env (the Dockerfile installs it; rocmft's launch reads it).
ARCH_PROFILE = Path("/etc/rocmft/arch.env")
# The variable naming another profile file (a site's own tuning, a bare-metal install's choice, a test's profile).
PROFILE_VARIABLE = "ARCH_PROFILE"
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


def launch_profile(environ: Mapping[str, str], arch: str, image_profile: Path = ARCH_PROFILE) -> Path | None:
    """The architecture profile whose ``RUNTIME_``/``FULL_NODE_`` lines the launch applies (rocmft.launch.spec),
    wherever rocmft runs: ``ARCH_PROFILE=<file>`` when set, else the image's own profile (``/etc/rocmft/arch.env``;
    also under ``apptainer exec``, which skips the image's entry script), else the shipped
    docker/arch/<arch>.env of the GPU target ``arch`` the device probe found (a bare-metal or site install);
    None when there is none (a CPU, an unknown target).

    Args:
        environ: the run's environment (ARCH_PROFILE is read from it).
        arch: the gfx target of the GPUs (``gfx942``), or ``""``.
        image_profile: the image's profile (tests pass another).

    Raises:
        ConfigError: ARCH_PROFILE names a file that cannot be read, or one without an ``ARCH=`` line.
    """
    chosen = environ.get(PROFILE_VARIABLE, "")
    if chosen:
        path = Path(chosen)
        try:
            values = read_profile(path)
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"{PROFILE_VARIABLE}={chosen} cannot be read: {getattr(err, 'strerror', None) or err}.",
                              f"Point {PROFILE_VARIABLE} at an architecture profile (docker/arch/<ARCH>.env), "
                              f"or unset it to use the image's.") from err  # fmt: skip
        if not values.get("ARCH"):
            raise ConfigError(f"{PROFILE_VARIABLE}={chosen} has no ARCH= line: not an architecture profile.",
                              f"Point {PROFILE_VARIABLE} at a docker/arch/<ARCH>.env, or unset it.")  # fmt: skip
        return path
    if image_profile.is_file():
        return image_profile
    shipped = shipped_profiles()
    if arch and shipped and (shipped / f"{arch}.env").is_file():
        return shipped / f"{arch}.env"
    return None


__all__ = ["ARCH_PROFILE", "BUILD_RECORD", "PROFILE_VARIABLE", "build_record", "launch_profile", "profile_for",
           "read_profile", "shipped_profiles"]  # fmt: skip
