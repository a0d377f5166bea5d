"""parallel.keep_attention (lwm/parallel/kept.py): a checkpointed block keeps its attention's output and
logsumexp, and its recompute runs no attention forward. The reference is the same step with full
recompute: loss and every gradient bitwise equal (the same kernels on the same tensors), packed documents
on, one process (the ring at one rank and Ulysses at one rank; tests/integration/test_keep_attention_ranks.py
runs cp 2 over gloo)."""

from __future__ import annotations

import pytest
import torch
from cuda_standins import installed
from keep_runs import keep_step


def assert_same_step(full, kept):
    assert torch.equal(full[0], kept[0])
    assert all(torch.equal(full[1][name], grad) for name, grad in kept[1].items())


@pytest.mark.parametrize("mode", ["ring", "ulysses"])
@pytest.mark.parametrize("options", [{}, {"offload": True}, {"nograd_first": True}], ids=["plain", "offload", "eval"])
def test_kept_attention_equals_recompute_bitwise_and_runs_half_the_forwards(mode, options):
    full, kept = keep_step(False, mode, **options), keep_step(True, mode, **options)
    assert_same_step(full, kept)
    assert (full[2], kept[2]) == (4, 2)  # 2 layers: forward and recompute, against forward alone


def test_under_offload_the_kept_outputs_wait_in_host_memory():
    """With activation offload the kept output and logsumexp of each block go to host buffers with its
    input: (B, S, dim) fp32 and (B, heads, S) fp32 more for each of the 2 blocks, in the offload's pool."""
    full, kept = keep_step(False, offload=True), keep_step(True, offload=True)
    assert kept[3] - full[3] == 2 * (2 * 64 * 64 * 4 + 2 * 4 * 64 * 4), (full[3], kept[3])


@pytest.mark.parametrize("mode", ["ring", "ulysses"])
def test_on_the_cuda_flash_path_kept_attention_is_exact_too(mode):
    """bf16 through the flash kernels' CPU stand-ins (varlen with the packed documents): the kept output and
    logsumexp are the kernels' own, and the gradients equal full recompute's bitwise."""
    with installed():
        full, kept = keep_step(False, mode, flash=True), keep_step(True, mode, flash=True)
    assert_same_step(full, kept)
    assert (full[2], kept[2]) == (4, 2)


@pytest.mark.parametrize("mode", ["ring", "ulysses"])
@pytest.mark.parametrize("offload", [False, True], ids=["device", "offload"])
def test_head_groups_replay_their_attention_too_and_stay_exact(mode, offload):
    """Under model.attn_head_groups each group is a checkpoint inside the block's: without keeping, its
    attention runs in the block's forward, the block's recompute and the group's own recompute (2 layers x 2
    groups x 3); kept, in the forward alone, and the step is bitwise the same."""
    full, kept = keep_step(False, mode, groups=2, offload=offload), keep_step(True, mode, groups=2, offload=offload)
    assert_same_step(full, kept)
    assert (full[2], kept[2]) == (12, 4)


@pytest.mark.parametrize("groups", [1, 2])
def test_keeping_the_first_blocks_only_spares_their_recompute_alone(groups):
    """parallel.keep_attention_blocks: 1 of the 2 blocks keeps (its forwards as above), the other recomputes;
    under offload only the first block's output and logsumexp go to host memory."""
    full, one = keep_step(False, groups=groups, offload=True), keep_step(1, groups=groups, offload=True)
    assert_same_step(full, one)
    assert (full[2], one[2]) == ((4, 3) if groups == 1 else (12, 8))
    assert one[3] - full[3] == 2 * 64 * 64 * 4 + 2 * 4 * 64 * 4


def test_keep_attention_blocks_is_checked_against_the_model():
    from lwm.core.config import ParallelConfig

    parallel = ParallelConfig(activation_checkpointing=True, keep_attention=True, keep_attention_blocks=3)
    assert parallel.kept_blocks(4) == 3 and ParallelConfig(activation_checkpointing=True).kept_blocks(4) == 0
    with pytest.raises(ValueError, match="parallel.keep_attention_blocks=3: the model has 2 blocks"):
        parallel.kept_blocks(2)
    for bad in ({"keep_attention_blocks": 2}, {"keep_attention": True, "keep_attention_blocks": 0}):
        with pytest.raises(ValueError, match="needs parallel.keep_attention=true and a number of blocks of at least 1"):
            ParallelConfig(activation_checkpointing=True, **bad)


def test_keep_attention_needs_checkpointing():
    from lwm.core.config import ParallelConfig

    with pytest.raises(ValueError, match="parallel.keep_attention=true needs parallel.activation_checkpointing=true"):
        ParallelConfig(keep_attention=True)


def test_a_recompute_that_calls_its_attention_more_often_is_refused():
    from lwm.parallel.kept import Kept

    kept, first = Kept(), torch.ones(2)
    kept.put((first,))
    assert kept.take()[0] is first
    with pytest.raises(RuntimeError, match="recompute called its attention 2 times, its forward 1"):
        kept.take()
