"""Random-number state in checkpoints: every rank's torch (CPU and CUDA), numpy and Python state.

A sharded checkpoint keeps one copy of each non-tensor entry, so the ranks' states are gathered
and stored under their rank; on resume each rank takes its own back. States are tensors and plain
numbers and lists only, so checkpoints load with `torch.load(weights_only=True)` and nothing in
them is ever unpickled.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.distributed as dist


def collect() -> dict:
    """This process's random state as tensors, ints, floats and lists."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_states() -> dict[str, dict]:
    """{rank: state} of all ranks (every rank must call this when distributed)."""
    mine = collect()
    if not dist.is_initialized():
        return {"0": mine}
    states: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(states, mine)  # between this run's own ranks
    return {str(rank): s for rank, s in enumerate(states)}


def restore_own(states: dict) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    if str(rank) not in states:
        raise KeyError(
            f"the checkpoint has random states for ranks {sorted(states)}, not for rank {rank} "
            "(resumed with a different world size?)"
        )
    state = states[str(rank)]
    if not isinstance(state, dict) or not {"torch", "numpy", "python"} <= state.keys():
        raise ValueError(
            f"the checkpoint's random state for rank {rank} is a {type(state).__name__}, not the tensors and "
            "lists this version writes (a checkpoint of an older version or a crafted file); it is not unpickled"
        )
    restore(state)
