"""parallel.keep_attention over two gloo ranks: each rank's loss and gradients with kept attention equal
full recompute's bitwise (packed documents on), the ring in both layouts and Ulysses, and each rank runs
its ring forward once a layer instead of twice (under 2 head groups once a group instead of three times)."""

from __future__ import annotations

import torch
from keep_runs import keep_step

from lwm.parallel.launch import run_distributed

CASES = [("ring", "striped", 1), ("ring", "zigzag", 1), ("ulysses", "striped", 1), ("ring", "striped", 2)]
FORWARDS = {1: (4, 2), 2: (12, 4)}  # (full recompute, kept) over the 2 layers


def _worker(rank, world):
    out = {}
    for mode, layout, groups in CASES:
        group = torch.distributed.group.WORLD
        full, kept = (keep_step(keep, mode, group, layout, groups) for keep in (False, True))
        same = torch.equal(full[0], kept[0]) and all(torch.equal(full[1][n], g) for n, g in kept[1].items())
        out[mode, layout, groups] = (same, full[2], kept[2])
    return out


def test_kept_attention_equals_recompute_on_two_ranks():
    for rank, cases in enumerate(run_distributed(_worker, 2)):
        for case, (same, full, kept) in cases.items():
            assert same, f"rank {rank} {case}: kept attention differs from recompute"
            assert (full, kept) == FORWARDS[case[2]], (rank, case, full, kept)
