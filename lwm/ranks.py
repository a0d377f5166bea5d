"""Am I rank 0? The one answer every process asks for before it prints or writes what all ranks share
(a training run's lines and files, an evaluation's results); say() prints on rank 0 only.

Inside a process group it is the group's global rank. Before one exists (or in a process that never
starts one) it is read from what the launchers set: torchrun (RANK, LOCAL_RANK), Lightning's re-launch
of its workers (LOCAL_RANK, NODE_RANK), srun (SLURM_PROCID); a plain process is rank 0.
"""

from __future__ import annotations

import os

import torch.distributed as dist

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


def say(*args) -> None:
    """print, on rank 0 only (flushed: ranks' lines interleave in one log)."""
    if is_rank0():
        print(*args, flush=True)


def is_rank0() -> bool:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return all(os.environ.get(v, "0") == "0" for v in RANK_VARIABLES)
