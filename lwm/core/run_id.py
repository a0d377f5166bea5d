"""One output folder per launch, the same on every rank.

The default `trainer.out_dir` is `runs/${run_id:}`. Each process of a multi-process run composes
the config on its own, and seconds apart, so a name taken from each process's clock would differ:

- Lightning's own re-launch (devices > 1 on one machine): the first process names the run and
  puts the name in LWM_RUN_ID; the processes it starts inherit it.
- torchrun: rank 0 names the run and posts the name in the launcher's key-value store (the one
  every worker already uses to find the others); the other ranks wait for it there.
- SLURM (srun): the job and step ids name the run.

A process that composes several configs (a Hydra multirun) gives each its own name.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

ENV = "LWM_RUN_ID"
_made: list[str] = []  # names this process made, in order (one per composed config: a multirun makes several)


def _torchrun_agreed(name: str) -> str:
    """rank 0's name, through the torchrun agent's store (MASTER_ADDR:MASTER_PORT)."""
    from torch.distributed import TCPStore

    store = TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=300)
    )
    # every rank composes the same configs in the same order, so the count keys them alike
    key = f"lwm_run_id/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{len(_made)}"
    # torchrun's RANK, not lwm.ranks.is_rank0: exactly one worker must post the name, and is_rank0 also
    # asks NODE_RANK and SLURM_PROCID, which a job may set apart from torchrun's own numbering
    if int(os.environ["RANK"]) == 0:
        store.set(key, name)
    return store.get(key).decode()


def run_id() -> str:
    inherited = os.environ.get(ENV)
    if inherited and inherited not in _made:  # from the process that started this one
        return inherited
    name = time.strftime("%Y-%m-%d_%H-%M-%S")
    if os.environ.get("SLURM_JOB_ID") and os.environ.get("SLURM_STEP_ID"):
        name = f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1 and "TORCHELASTIC_RUN_ID" in os.environ:
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            raise RuntimeError(
                f"torchrun without its agent store: give every rank the same trainer.out_dir (or set {ENV})"
            )
        name = _torchrun_agreed(name)
    base, n = name, 1
    while name in _made:  # a second run of this process within the same second (or SLURM step)
        n += 1
        name = f"{base}-{n}"
    _made.append(name)
    os.environ[ENV] = name  # Lightning's re-launched processes inherit it
    return name


def register_resolver() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("run_id"):
        OmegaConf.register_new_resolver("run_id", run_id, use_cache=True)
