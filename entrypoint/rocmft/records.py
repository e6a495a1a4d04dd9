"""Records that cross a process boundary: the files and lines one rocmft process writes and another reads."""

from __future__ import annotations

RESULT_FILE = "worker-result.json"  # OUTPUT_DIR/rocmft/: written by the worker, read by the entrypoint

__all__ = ["RESULT_FILE"]
