"""lwm.plan.tracker.WorkCounter: the bytes each op writes, which the planner charges as HBM traffic."""

from __future__ import annotations

import pytest
import torch

from lwm.plan.tracker import WorkCounter


def _written(fn, *inputs) -> int:
    with WorkCounter() as counter:
        fn(*inputs)
    return counter.written


@pytest.mark.parametrize(
    "view",
    [
        lambda x: x.chunk(2, dim=-1),  # RoPE's halves
        lambda x: x.split(3, dim=0),
        lambda x: x.unbind(0),
        lambda x: x.transpose(0, 1),
        lambda x: x.view(-1),
    ],
)
def test_views_write_nothing_however_many_they_return(view):
    assert _written(view, torch.randn(6, 8)) == 0


def test_each_written_result_counts_once():
    x = torch.randn(6, 8)  # 192 bytes
    assert _written(lambda t: t * 2, x) == x.nbytes
    assert _written(lambda t: torch.cat(t.chunk(2)), x) == x.nbytes  # the halves are views, the cat is written
    half = x.to(torch.bfloat16)  # 96 bytes
    assert _written(lambda t: t.float().to(torch.bfloat16), half) == 2 * half.nbytes + half.nbytes
    assert _written(lambda t: torch.max(t, dim=0), x) == 8 * 4 + 8 * 8  # values (fp32) and indices (int64)
