"""The job's shape: nodes, this node's rank, processes per node (from the launcher's variables and the settings).

NNODES, NODE_RANK and NPROC_PER_NODE are LLaMA-Factory's launcher variables (torchrun's --nnodes, --node_rank,
--nproc_per_node); ROCMFT_NPROC_PER_NODE is rocmft's own. Read-only: nothing here changes the environment.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from rocmft.errors import ConfigError

if TYPE_CHECKING:
    from rocmft.config.settings import Settings
    from rocmft.facts.device import DeviceFacts


def node_rank() -> int:
    """This host's NODE_RANK in a multi-node run (LLaMA-Factory's launcher variable, torchrun's --node_rank); 0
    alone. Raises ConfigError when it is not a number."""
    text = os.environ.get("NODE_RANK", "0").strip() or "0"
    if not text.isdigit():
        raise ConfigError(f"NODE_RANK={text!r} is not a node number.", "Set NODE_RANK to 0 on the first node, "
                          "1, 2, ... on the others (below NNODES).")  # fmt: skip
    return int(text)


def nnodes() -> int:
    """NNODES (hosts in the run), 1 when unset. Raises ConfigError when it is not a positive number."""
    text = os.environ.get("NNODES", "1").strip() or "1"
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(
            f"NNODES={text!r} is not a number of nodes.", "Set NNODES to the number of hosts (1, 2, ...)."
        )
    return int(text)


def asked_processes(settings: Settings) -> int:
    """Processes per node the user asked for: ROCMFT_NPROC_PER_NODE, else NPROC_PER_NODE; 0 when neither."""
    return settings.rocmft.nproc_per_node or int(os.environ.get("NPROC_PER_NODE") or 0)


def local_processes(settings: Settings, device: DeviceFacts, launcher: str) -> int:
    """Processes per node: 1 without torchrun; with it ROCMFT_NPROC_PER_NODE, else NPROC_PER_NODE, else one
    per visible GPU (at least one)."""
    if launcher != "torchrun":
        return 1
    return asked_processes(settings) or max(device.count, 1)


__all__ = ["asked_processes", "local_processes", "nnodes", "node_rank"]
