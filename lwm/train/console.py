"""What a training run prints: one helper that prints on rank zero, and Lightning's start-up
chatter (accelerator lines, tips, deprecation notes from its internals) turned down to warnings."""

from __future__ import annotations

import logging
import warnings

from lightning.pytorch.utilities.rank_zero import rank_zero_only


@rank_zero_only
def say(*args) -> None:
    print(*args, flush=True)


def quiet_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    # a resumed stage writes into its own folders on purpose
    warnings.filterwarnings("ignore", message=r".*(Checkpoint|Experiment logs) directory .* exists and is not empty.*")
