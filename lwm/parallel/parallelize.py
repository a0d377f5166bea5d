"""Apply context parallelism to a plain Transformer from outside.

The model stays single-process: `parallelize` only swaps its attention function. The caller feeds
each rank its slice of the tokens (`shard`) with their global positions (`positions`); the loss
uses global text/vision counts (`global_group_counts`) so the ranks' losses add up to the loss of
the whole sequence.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from lwm.model import Transformer
from lwm.model.loss import GroupCounts, group_counts
from lwm.parallel.hybrid import hybrid_attention
from lwm.parallel.layout import check_layout
from lwm.parallel.ring import ring_attention
from lwm.parallel.ulysses import ulysses_attention

MODES = ("ring", "ulysses", "hybrid")


def parallelize(
    model: Transformer,
    group=None,
    layout: str = "striped",
    mode: str = "ring",
    ulysses_group=None,
    backend: str = "auto",
) -> Transformer:
    """Swap `model`'s attention for context-parallel attention over `group` (hybrid: `group` is the
    ring group and `ulysses_group` the Ulysses one). Returns the model."""
    check_layout(layout)
    if mode == "ring":
        fn = partial(ring_attention, group=group, layout=layout, backend=backend)
    elif mode == "ulysses":
        fn = partial(ulysses_attention, group=group, layout=layout, backend=backend)
    elif mode == "hybrid":
        if ulysses_group is None:
            raise ValueError("mode 'hybrid' needs ulysses_group (and group as the ring group)")
        fn = partial(hybrid_attention, ring_group=group, ulysses_group=ulysses_group, layout=layout, backend=backend)
    else:
        raise ValueError(f"unknown context-parallel mode {mode!r}; expected one of {MODES}")
    model.set_attention(fn)
    return model


def global_group_counts(loss_mask: torch.Tensor, vision_mask: torch.Tensor, group=None) -> GroupCounts:
    """Text/vision loss-mask totals over the whole sequence (summed over the group's ranks)."""
    counts = torch.stack(list(group_counts(loss_mask, vision_mask)))
    if dist.is_initialized():
        dist.all_reduce(counts, group=group)
    return GroupCounts(counts[0], counts[1])
