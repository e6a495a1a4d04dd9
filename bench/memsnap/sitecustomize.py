"""Record the CUDA caching allocator's history in one process of a benchmark run (not part of rocmft).

Put this folder first on PYTHONPATH and set ``BENCH_MEMSNAP=DIR`` and ``BENCH_MEMSNAP_MATCH=TEXT``: the Python
process whose command line (``sys.orig_argv``) contains TEXT (``rocmft.validate.child``:
on one GPU the process that validated the configuration goes on to train, rocmft.launch.run) records every
allocation and
free with its Python stack (``torch.cuda.memory._record_memory_history``, PyTorch's "Understanding CUDA Memory
Usage" page) and, at exit, writes ``DIR/snapshot-<pid>.pickle`` (``torch.cuda.memory._dump_snapshot``) and
``DIR/stats-<pid>.json`` (``torch.cuda.memory_stats()``: peak allocated and reserved, allocator retries).
bench/peak_breakdown.py reads the snapshot. Recording slows the process: never time a run that records.
"""

import os
import sys

_DIR, _MATCH = os.environ.get("BENCH_MEMSNAP"), os.environ.get("BENCH_MEMSNAP_MATCH")
if _DIR and _MATCH and _MATCH in " ".join(getattr(sys, "orig_argv", sys.argv)):
    import atexit
    import json

    import torch

    if torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")

        @atexit.register
        def _dump() -> None:
            os.makedirs(_DIR, exist_ok=True)
            torch.cuda.memory._dump_snapshot(os.path.join(_DIR, f"snapshot-{os.getpid()}.pickle"))
            stats = {k: v for k, v in torch.cuda.memory_stats().items() if k.endswith((".all.peak", ".all.current"))
                     or k.startswith("num_")}  # fmt: skip
            with open(os.path.join(_DIR, f"stats-{os.getpid()}.json"), "w") as handle:
                json.dump(stats, handle, indent=1)
