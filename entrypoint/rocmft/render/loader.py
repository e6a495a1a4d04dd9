"""Data-loader workers against /dev/shm: what the ``shm`` check asks of /dev/shm, and the loader workers the run
plans when the user did not choose their number and /dev/shm cannot hold the template's default.

/dev/shm holds RCCL/NCCL's shared-memory transport between the local processes that communicate and the batches
torch's DataLoader workers hand to their process (torch.multiprocessing shares tensors through it). Docker gives a
container 64 MiB unless told otherwise, and a worker that runs out dies with "DataLoader worker (pid N) is killed by
signal: Bus error" (pytorch/pytorch#5040; in a training container: open-mmlab/mmdetection#1997,
fastai/docker-containers#21). NCCL's docs ask for --shm-size=1g or --ipc=host per container: rocmft asks
:data:`SHM_PER_RANK` per local process that communicates plus :data:`SHM_PER_WORKER` per loader worker (a judgement
for prefetch_factor 2 of padded batches, not a measurement).

A single-GPU run starts one process, which communicates with no one: it needs /dev/shm only for its loader workers.
With Docker's 64 MiB the template's ``dataloader_num_workers: 2`` (512 MiB) was refused, a false alarm on the most
common setup (issue 30, item 7). So when the user did not set the number, the run plans as many workers as fit, down
to 0 (the main process then loads the data itself: slower to feed the GPU only when the collation is heavy, which a
tokenized LLaMA-Factory data set's is not), says so, and keeps the choice in the manifest's ``plan``. A number the
user set is never changed: the ``shm`` check refuses it, naming the number that fits.
"""

from __future__ import annotations

from typing import Any

from rocmft.config.provenance import Source
from rocmft.container import GiB, shm_gib, shm_size
from rocmft.render.planner import Choice, PerfPlan

SHM_PER_RANK = 1 << 30
SHM_PER_WORKER = 256 << 20
WORKERS = "dataloader_num_workers"


def shm_need(ranks: int, workers_per_process: int) -> int:
    """Bytes of /dev/shm a node needs: :data:`SHM_PER_RANK` per communicating local process (``ranks``: 0 for a
    single process) and :data:`SHM_PER_WORKER` per loader worker (``workers_per_process`` in each process, at least
    one process)."""
    return ranks * SHM_PER_RANK + workers_per_process * max(ranks, 1) * SHM_PER_WORKER


def workers_that_fit(shm_bytes: int, ranks: int) -> int | None:
    """The most loader workers per process whose need (:func:`shm_need`) fits in ``shm_bytes``; None when the
    communicating processes alone do not fit (no number of workers helps then)."""
    left = shm_bytes - ranks * SHM_PER_RANK
    if left < 0:
        return None
    return left // (SHM_PER_WORKER * max(ranks, 1))


def shown(size: int) -> str:
    """A size in MiB below 1 GiB (Docker's default reads ``64 MiB``), else in GiB."""
    return f"{size / GiB:.2f} GiB" if size >= GiB else f"{size / (1 << 20):.0f} MiB"


def plan_workers(perf: PerfPlan, arguments: dict[str, Any], source: Source | None, shm_bytes: int | None,
                 ranks: int) -> bool:  # fmt: skip
    """Add the loader workers' :class:`~rocmft.render.planner.Choice` to ``perf`` when /dev/shm (``shm_bytes``;
    None: no /dev/shm, nothing to plan) cannot hold the rendered ``dataloader_num_workers`` and the user did not
    choose it (``source``: its source; :attr:`Source.user_chosen`): the most workers that fit, down to 0. Nothing
    is planned when the communicating processes (``ranks``: the job's ``communicating``, rocmft.facts.job.JobShape;
    0 for a single process) do not fit on their own: fewer workers would not let the run pass, and the ``shm`` check
    refuses it with the flags. Returns whether a choice was added; an inactive plan's note then says that this is all
    it planned."""
    rendered = arguments.get(WORKERS)
    if shm_bytes is None or not isinstance(rendered, int) or isinstance(rendered, bool) or rendered <= 0:
        return False
    if source is not None and source.user_chosen:
        return False
    fit = workers_that_fit(shm_bytes, ranks)
    if fit is None or fit >= rendered:
        return False
    flags = shm_size(shm_gib(shm_need(ranks, rendered)), short=True)
    reason = (
        f"/dev/shm holds {shown(shm_bytes)}, too little for the default {rendered} loader workers at "
        f"{shown(SHM_PER_WORKER)} each; to keep {rendered}, give the container more: {flags}; "
        "or set DATALOADER_NUM_WORKERS yourself"
    )
    perf.choices.append(Choice(WORKERS, fit, reason, planned=True))
    if not perf.active:
        perf.note += f"; only {WORKERS} is planned, for /dev/shm"
    return True


__all__ = [
    "SHM_PER_RANK",
    "SHM_PER_WORKER",
    "plan_workers",
    "shm_need",
    "shown",
    "workers_that_fit",
]
