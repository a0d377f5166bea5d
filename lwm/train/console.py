"""What a training run prints: one helper that prints on rank zero, and Lightning's start-up
chatter (accelerator lines, tips, deprecation notes from its internals) turned down to warnings."""

from __future__ import annotations

import logging
import os
import warnings

# Set by the launchers before any process group exists: torchrun (RANK), Lightning's re-launch
# (LOCAL_RANK, NODE_RANK), srun (SLURM_PROCID).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


def is_rank0() -> bool:
    return all(os.environ.get(v, "0") == "0" for v in RANK_VARIABLES)


def say(*args) -> None:
    if is_rank0():
        print(*args, flush=True)


def quiet_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    # on a machine with SLURM installed, every run not started by srun (torchrun, a local run) is told to use it
    warnings.filterwarnings("ignore", message=r".*The `srun` command is available on your system but is not used.*")
    # a resumed stage writes into its own folders on purpose
    warnings.filterwarnings("ignore", message=r".*(Checkpoint|Experiment logs) directory .* exists and is not empty.*")
