import itertools

import pytest
import torch

from lwm.parallel import block_part, block_work, check_divisible, positions, shard, unshard


@pytest.mark.parametrize("layout", ["contiguous", "striped", "zigzag"])
@pytest.mark.parametrize("world,ulysses", [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2), (8, 4), (6, 3)])
def test_shard_unshard_round_trip(layout, world, ulysses):
    S = 48
    x = torch.randn(2, 3, S, 5)
    pieces = [shard(x, 2, r, world, layout, ulysses) for r in range(world)]
    assert all(p.shape == (2, 3, S // world, 5) for p in pieces)
    assert torch.equal(unshard(pieces, 2, layout, ulysses), x)
    for r in range(world):
        pos = positions(S, r, world, layout, ulysses)
        assert torch.equal(shard(torch.arange(S), 0, r, world, layout, ulysses), pos)
        assert (pos.diff() > 0).all()  # a rank's tokens are in increasing global order
    covered = torch.cat([positions(S, r, world, layout, ulysses) for r in range(world)]).sort().values
    assert torch.equal(covered, torch.arange(S))


def test_layout_examples():
    assert positions(8, 1, 4, "striped").tolist() == [1, 5]
    assert positions(8, 1, 2, "contiguous").tolist() == [4, 5, 6, 7]
    assert positions(8, 0, 2, "zigzag").tolist() == [0, 1, 6, 7]
    assert positions(8, 1, 2, "zigzag").tolist() == [2, 3, 4, 5]
    # hybrid: ring of 2 (striped) x Ulysses of 2; rank 1 = ring 0, second half of ring piece [0, 2, 4, 6]
    assert positions(8, 1, 4, "striped", ulysses_size=2).tolist() == [4, 6]


def test_bad_splits_name_the_values():
    with pytest.raises(ValueError, match=r"seq_len 4100 is not divisible by 2 \* ring size = 8 \(zigzag\)"):
        check_divisible(4100, 4, "zigzag")
    with pytest.raises(ValueError, match=r"seq_len 10 is not divisible by ring size 4 \(striped\)"):
        shard(torch.zeros(10), 0, 0, 4, "striped")
    with pytest.raises(ValueError, match="unknown layout 'diagonal'"):
        positions(8, 0, 2, "diagonal")
    with pytest.raises(ValueError, match=r"rank 2 is outside \[0, 2\)"):
        positions(8, 2, 2, "striped")
    with pytest.raises(ValueError, match="not divisible by ulysses_size 3"):
        check_divisible(8, 6, "contiguous", ulysses_size=3)


@pytest.mark.parametrize("layout", ["contiguous", "striped", "zigzag"])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_block_plans_compute_exactly_the_causal_mask(layout, world):
    """For every (rank, step), the plan's rectangle is exactly the set of visible (q, k) pairs."""
    S = 16 * world
    L = S // world
    for rank, step in itertools.product(range(world), range(world)):
        src = (rank - step) % world
        qpos, kpos = positions(S, rank, world, layout), positions(S, src, world, layout)
        truth = qpos[:, None] >= kpos[None, :]
        plan = block_part(layout, rank, src, L, causal=True)
        got = torch.zeros(L, L, dtype=torch.bool)
        if plan is not None:
            rows, cols = torch.arange(L)[plan.q], torch.arange(L)[plan.k]
            block = torch.ones(len(rows), len(cols), dtype=torch.bool)
            if plan.causal:
                block = block.tril()
            got[rows[:, None], cols[None, :]] = block
        assert torch.equal(got, truth), (layout, world, rank, step)
        assert block_work(plan, L) == int(truth.sum())


@pytest.mark.parametrize("world", [2, 4, 8])
def test_striped_and_zigzag_are_balanced_contiguous_is_not(world):
    L = 1024
    for layout in ("striped", "zigzag", "contiguous"):
        for step in range(world):
            work = [block_work(block_part(layout, r, (r - step) % world, L, True), L) for r in range(world)]
            ratio = max(work) / (sum(work) / world)
            if layout == "zigzag":
                assert ratio == 1.0
            elif layout == "striped":
                assert ratio <= 1 + 2 / L  # the diagonal is in or out: L(L+1)/2 vs L(L-1)/2
            elif step > 0:
                # ranks below `step` skip their fully masked block; the others compute a full one
                assert min(work) == 0 and ratio == pytest.approx(world / (world - step))
