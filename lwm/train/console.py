"""What a training run prints: Lightning's start-up chatter (accelerator lines, tips, deprecation notes
from its internals) turned down to warnings. (is_rank0 and say, print on rank 0, are lwm.ranks',
imported here for the run's modules.)"""

from __future__ import annotations

import logging
import warnings

from lwm.ranks import is_rank0, say

__all__ = ["is_rank0", "quiet_lightning", "say"]


def quiet_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    # on a machine with SLURM installed, every run not started by srun (torchrun, a local run) is told to use it
    warnings.filterwarnings("ignore", message=r".*The `srun` command is available on your system but is not used.*")
    # the step is one function under manual optimization (lwm.core.step): a checkpoint at a step's end holds
    # the state after that step's optimizer step, as resuming wants
    warnings.filterwarnings("ignore", message=r".*ModelCheckpoint with manual optimization and every_n_train_steps.*")
    # a resumed stage writes into its own folders on purpose
    warnings.filterwarnings("ignore", message=r".*(Checkpoint|Experiment logs) directory .* exists and is not empty.*")
