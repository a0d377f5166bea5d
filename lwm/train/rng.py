"""Random-number state in checkpoints: every rank's torch (CPU and CUDA), numpy and Python state.

A sharded checkpoint keeps one copy of each non-tensor entry, so the ranks' states are gathered
and stored under their rank; on resume each rank takes its own back.
"""

from __future__ import annotations

import pickle
import random

import numpy as np
import torch
import torch.distributed as dist


def collect() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_states() -> dict[str, bytes]:
    """{rank: pickled state} of all ranks (every rank must call this when distributed)."""
    mine = pickle.dumps(collect())
    if not dist.is_initialized():
        return {"0": mine}
    states: list[bytes | None] = [None] * dist.get_world_size()
    dist.all_gather_object(states, mine)
    return {str(rank): s for rank, s in enumerate(states)}


def restore_own(states: dict[str, bytes]) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    if str(rank) not in states:
        raise KeyError(
            f"the checkpoint has random states for ranks {sorted(states)}, not for rank {rank} "
            "(resumed with a different world size?)"
        )
    restore(pickle.loads(states[str(rank)]))
