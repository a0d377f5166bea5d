"""Every parallelism from one place (lwm.parallel.dims / mesh / parallelize): tensor parallelism
composed with context and data parallelism trains exactly as one process does (fp32, gloo).

Each case runs 5 optimizer steps of the debug model on 64-token sequences of 4 masked documents,
each rank fed its cut as the datamodule cuts it; the reference is one process on the same weights
and sequences, whose loss is the mean over the data-parallel sequences. The optimizer is plain SGD:
AdamW divides each gradient by its own size, which turns the last-bit differences of a nearly zero
gradient (a sum over ranks instead of one matmul) into differences of a good part of the learning
rate in single weights, while SGD moves every weight by exactly its gradient."""

from __future__ import annotations

import pytest
import torch
from hf_models import family_config, family_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from lwm.core.config import OptimConfig
from lwm.core.step import batch_loss, clip_grad_norm, train_step
from lwm.data.batches import Sharding, shard_batch, with_documents
from lwm.model import ModelConfig, Transformer
from lwm.parallel import ParallelDims, build_meshes, build_parallel_model, compute_settings
from lwm.parallel.launch import run_distributed

CFG = ModelConfig.from_preset("debug")
SEQ, STEPS, DOCS = 64, 5, 4
LR = 1.0  # with the clipping below, every step moves the weights by a gradient of norm 0.5
OPTIM = OptimConfig(grad_clip=0.5)  # small enough to clip: the norm over 2-D and 1-D meshes is used


def sequences(n: int, step: int) -> list[dict]:
    """`n` whole sequences of step `step` (the same on every rank and in the reference)."""
    g = torch.Generator().manual_seed(100 + step)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, CFG.vocab_size, (1, SEQ + 1), generator=g)
        segment_ids = torch.arange(SEQ).div(SEQ // DOCS, rounding_mode="floor")[None]  # (1, S)
        out.append(
            {
                "tokens": tokens[:, :-1],
                "targets": tokens[:, 1:],
                "loss_weight": (torch.rand(1, SEQ, generator=g) > 0.2).float(),
                "vision_mask": torch.rand(1, SEQ, generator=g) > 0.5,
                "segment_ids": segment_ids,
            }
        )
    return out


def start_weights(family: str | None = None) -> dict:
    if family is not None:  # the debug model with a family's options, its biases and norms perturbed
        return family_model(family).state_dict()
    torch.manual_seed(0)
    return Transformer(CFG).state_dict()


def _worker(rank, world, dims: ParallelDims, layout: str, family: str | None = None):
    cfg = CFG if family is None else family_config(family)
    meshes = build_meshes(dims, "cpu", rank)
    settings = compute_settings(torch.device("cpu"), cfg.head_dim)
    init = start_weights(family) if rank == 0 else {}
    model = build_parallel_model(cfg, meshes, settings, "cpu", init, layout, activation_checkpointing=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    dp_rank, cp_rank, _ = dims.coords(rank)
    where = Sharding(dp_rank, dims.dp, cp_rank, dims.cp, layout, dims.data_ulysses)
    losses = []
    for step in range(STEPS):
        whole = sequences(dims.dp, step)[dp_rank]
        batch = with_documents(shard_batch(whole, where, "document"))
        loss = train_step(model, batch, optimizer, OPTIM, meshes.cp_group, document_mask=True).loss
        losses.append(loss.item())
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    local_heads = model.layers[0].attn.n_heads
    return {"losses": losses, "state": state if rank == 0 else None, "local_heads": local_heads, "dp": dp_rank}


def reference(dp: int, family: str | None = None) -> tuple[list[list[float]], dict]:
    """One process: per step, the losses of the dp sequences and the weights after the steps."""
    model = Transformer(CFG if family is None else family_config(family))
    model.load_state_dict(start_weights(family))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        parts = [
            batch_loss(model, with_documents(shard_batch(s, Sharding(), "document")), OPTIM, None, True)
            for s in sequences(dp, step)
        ]
        (sum(share for share, _ in parts) / dp).backward()
        clip_grad_norm(model.parameters(), OPTIM.grad_clip)
        optimizer.step()
        losses.append([loss.item() for _, loss in parts])
    return losses, model.state_dict()


# train.py runs tp 2 x cp 2 striped and hybrid cp 4 zigzag (tests/integration/test_train_parallel.py); here the rest.
CASES = {  # name: (dims, layout, family: None for the debug model)
    "tp2": (ParallelDims(tp=2), "striped", None),
    "tp2 x cp2 zigzag": (ParallelDims(cp=2, tp=2), "zigzag", None),
    "tp2 x dp2": (ParallelDims(dp=2, tp=2), "striped", None),
    # the families' options under tp: the q/k/v bias split with its rows, the QK norm's one weight
    # seen by each rank's heads (its gradient summed over tp), a tied head
    "tp2 x cp2 qwen2": (ParallelDims(cp=2, tp=2), "striped", "qwen2"),
    "tp2 x dp2 qwen3 tied": (ParallelDims(dp=2, tp=2), "striped", "qwen3_tied"),
}


@pytest.fixture(scope="module")
def references():
    return {(dp, family): reference(dp, family) for _, (dims, _, family) in CASES.items() for dp in {dims.dp}}


@pytest.mark.parametrize("name", list(CASES))
def test_parallel_training_equals_one_process(name, references):
    dims, layout, family = CASES[name]
    results = run_distributed(_worker, dims.world, dims, layout, family)
    ref_losses, ref_state = references[dims.dp, family]
    for rank, res in enumerate(results):
        assert res["local_heads"] == CFG.n_heads // dims.tp, rank  # every family's debug model has 4 heads
        want = [step[res["dp"]] for step in ref_losses]
        assert res["losses"] == pytest.approx(want, rel=1e-5), (name, rank)
    state = results[0]["state"]
    assert set(state) == set(ref_state)  # the keys of one process's model: no wrapper, no DTensor names
    for key, value in ref_state.items():
        # atol: torch.testing's own for fp32 (ring attention's fp32 rounding reaches 1.3e-6 in a few embedding rows)
        torch.testing.assert_close(state[key], value, rtol=1e-5, atol=1e-5, msg=lambda m, k=key: f"{name} {k}: {m}")


def test_impossible_meshes_are_refused_with_their_values():
    with pytest.raises(ValueError, match=r"tp 3 must divide the q heads \(4\) and the kv heads \(2\)"):
        ParallelDims(tp=3).check_model(CFG.n_heads, CFG.n_kv_heads)
    with pytest.raises(ValueError, match="ulysses 3 must divide cp 4"):
        ParallelDims(cp=4, mode="hybrid", ulysses=3)
    with pytest.raises(ValueError, match="ulysses 2 is hybrid mode's all-to-all size; mode is 'ring'"):
        ParallelDims(cp=4, ulysses=2)
    with pytest.raises(ValueError, match=r"4 q heads per tp rank .* Ulysses size 8"):
        ParallelDims(cp=8, mode="ulysses").check_model(4, 2)
    with pytest.raises(ValueError, match="world size 6 is not divisible by cp 4 x tp 1"):
        ParallelDims.from_world(6, 4)
    with pytest.raises(ValueError, match="parallel mode must be one of"):
        ParallelDims(mode="pipeline")


def test_ranks_place_tp_innermost_then_cp_then_dp():
    dims = ParallelDims(dp=2, cp=2, tp=2)
    assert [dims.coords(r) for r in range(8)] == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (0, 1, 1),
        (1, 0, 0),
        (1, 0, 1),
        (1, 1, 0),
        (1, 1, 1),
    ]
    assert ParallelDims(cp=4, mode="hybrid", ulysses=2).describe() == "cp 4 (hybrid: ulysses 2 x ring 2), dp 1"
