"""Start vLLM's OpenAI-compatible server on a rocmft export: the compose service ``serve``'s entry point.

Runs inside vLLM's ROCm image (which has no rocmft), so it uses the standard library only. What to serve:

* ``ROCMFT_SERVE_MODEL``: an export folder; else the newest ``rocmft export``, which it recorded in
  ``$ROCMFT_SAVES_DIR/rocmft-latest-export.json`` (its path relative to the saves folder is tried first, so a
  mount at another place still works).
* the served name (``model`` in API requests): ``ROCMFT_SERVE_NAME``, else the export's ``served_model_name``
  (``rocmft-export.json``), else the folder's name.
* ``ROCMFT_SERVE_PORT`` (default 8000) on all interfaces; ``ROCMFT_SERVE_ARGS``: more ``vllm serve`` arguments,
  split like a shell line.

Then it replaces itself with ``vllm serve <folder> --served-model-name <name> --host 0.0.0.0 --port <port> ...``.
``--print`` prints that command as JSON instead (used by the tests; no vLLM needed). Exit 2 with a message
when there is nothing to serve.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

LATEST = "rocmft-latest-export.json"
MANIFEST = "rocmft-export.json"


def fail(message: str, fix: str) -> None:
    """Print a message and what to do, exit 2 (rocmft's configuration-error code)."""
    print(f"[rocmft serve] {message}\n  fix: {fix}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def read_json(path: Path) -> dict:
    """A JSON object from ``path``, or {} when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def model_folder(environ: dict) -> Path:
    """The folder to serve (see the module docstring); exits 2 when there is none."""
    given = environ.get("ROCMFT_SERVE_MODEL", "").strip()
    if given:
        folder = Path(given)
    else:
        saves = Path(environ.get("ROCMFT_SAVES_DIR") or "/saves")
        latest = read_json(saves / LATEST)
        if not latest:
            fail(
                f"Nothing to serve: no {saves / LATEST} (written by `rocmft export`) and no ROCMFT_SERVE_MODEL.",
                "Run `docker compose run --rm export` first, or set ROCMFT_SERVE_MODEL to an export folder.",
            )
        inside = saves / latest["model_path_in_saves"] if latest.get("model_path_in_saves") else None
        folder = inside if inside is not None and inside.is_dir() else Path(latest.get("model_path", ""))
    if not (folder / "config.json").is_file():
        fail(
            f"{folder} is not a model folder (no config.json) in this container.",
            "Point ROCMFT_SERVE_MODEL at an export under /saves (or /models), as the container sees it.",
        )
    return folder


def command(environ: dict) -> list[str]:
    """The ``vllm serve`` command line for ``environ``."""
    folder = model_folder(environ)
    name = (environ.get("ROCMFT_SERVE_NAME") or "").strip()
    name = name or read_json(folder / MANIFEST).get("served_model_name") or folder.name
    port = (environ.get("ROCMFT_SERVE_PORT") or "8000").strip()
    if not port.isdigit() or not 0 < int(port) < 65536:
        fail(f"ROCMFT_SERVE_PORT={port!r} is not a port number.", "Set ROCMFT_SERVE_PORT to a number 1-65535.")
    extra = shlex.split(environ.get("ROCMFT_SERVE_ARGS") or "")
    return ["vllm", "serve", str(folder), "--served-model-name", name, "--host", "0.0.0.0", "--port", port, *extra]


def main(argv: list[str]) -> None:
    """Print (``--print``) or exec the command."""
    argv_out = command(dict(os.environ))
    if "--print" in argv:
        print(json.dumps(argv_out))
        return
    print(f"[rocmft serve] {shlex.join(argv_out)}", flush=True)
    os.execvp(argv_out[0], argv_out)


if __name__ == "__main__":
    main(sys.argv[1:])
