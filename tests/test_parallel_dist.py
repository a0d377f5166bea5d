"""Context-parallel attention and a training step on real gloo process groups (CPU)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from lwm.parallel.launch import run_distributed
from lwm.parallel import hybrid_attention, hybrid_groups, positions, ring_attention, shard, ulysses_attention

LAYOUTS = ("contiguous", "striped", "zigzag")
SEQ = 24  # divisible by N and 2N for N = 1..4


def reference(q, k, v, causal):
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=causal)


def _case_errors(rank, world, attn, hq, hkv, d, causal, layout, ulysses_size=1, seed=0):
    """Max |error| of this rank's output and q/k/v grads against full-sequence SDPA."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, h, SEQ, d, generator=g) for h in (hq, hkv, hkv))
    dout = torch.randn(2, hq, SEQ, d, generator=g)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out = reference(*full, causal)
    ref_grads = torch.autograd.grad(ref_out, full, dout)
    sh = lambda t: shard(t, 2, rank, world, layout, ulysses_size)  # noqa: E731
    local = [sh(t).requires_grad_() for t in (q, k, v)]
    out = attn(*local, causal=causal, layout=layout)
    grads = torch.autograd.grad(out, local, sh(dout))
    errs = [(out - sh(ref_out)).abs().max().item()]
    errs += [(a - sh(b)).abs().max().item() for a, b in zip(grads, ref_grads)]
    return max(errs)


RING_CASES = [(layout, causal, d) for layout, causal, d in itertools.product(LAYOUTS, (True, False), (64, 128, 40))]
ULYSSES_CASES = [(layout, causal, hkv) for layout, causal, hkv in itertools.product(LAYOUTS, (True, False), (12, 2, 1))]


def _attention_worker(rank, world):
    results = {}
    for layout, causal, d in RING_CASES:
        results[("ring", layout, causal, d)] = _case_errors(rank, world, ring_attention, 4, 2, d, causal, layout)
    for layout, causal, hkv in ULYSSES_CASES:
        if hkv % world and world % hkv:
            continue
        results[("ulysses", layout, causal, hkv)] = _case_errors(rank, world, ulysses_attention, 12, hkv, 32, causal, layout)
    if world == 4:
        ring_group, ulysses_group = hybrid_groups(2, 2)
        for layout, causal in itertools.product(LAYOUTS, (True, False)):
            attn = lambda q, k, v, causal, layout: hybrid_attention(q, k, v, ring_group, ulysses_group, causal, layout)  # noqa: E731
            results[("hybrid", layout, causal, 2)] = _case_errors(rank, world, attn, 4, 2, 32, causal, layout, ulysses_size=2)
    return results


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda n: f"N{n}")
def attention_errors(request):
    return request.param, run_distributed(_attention_worker, request.param)


def test_ring_ulysses_hybrid_match_full_sdpa(attention_errors):
    world, per_rank = attention_errors
    assert len(per_rank[0]) >= len(RING_CASES)
    for case in per_rank[0]:
        worst = max(r[case] for r in per_rank)
        assert worst < 1e-5, f"N={world} {case}: max error {worst:.2e} (fp32, atol 1e-5)"
    if world == 4:
        assert any(case[0] == "hybrid" for case in per_rank[0])


# ------------------------------------------------------------------------------------ training step


def _train_step_worker(rank, world, mode, layout):
    from lwm.model import ModelConfig, Transformer, token_coefficients
    from lwm.parallel import global_group_counts, parallelize

    cfg = ModelConfig.from_preset("debug")
    torch.manual_seed(0)
    ref_model = Transformer(cfg)
    model = Transformer(cfg)
    model.load_state_dict(ref_model.state_dict())
    S = 32
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (2, S + 1), generator=g)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    loss_mask = (torch.rand(2, S, generator=g) > 0.1).float()
    vision_mask = torch.rand(2, S, generator=g) > 0.5

    # one process, the whole sequence
    ref = ref_model(inputs, targets=targets, loss_coeff=token_coefficients(loss_mask, vision_mask)).loss
    ref.backward()

    # this rank's slice, global positions, global counts
    ulysses_size, group, ulysses_group = 1, None, None
    if mode == "hybrid":
        ulysses_size = 2
        group, ulysses_group = hybrid_groups(world // 2, 2)
    parallelize(model, group, layout=layout, mode=mode, ulysses_group=ulysses_group)
    sh = lambda t: shard(t, 1, rank, world, layout, ulysses_size)  # noqa: E731
    counts = global_group_counts(sh(loss_mask), sh(vision_mask))
    coeff = token_coefficients(sh(loss_mask), sh(vision_mask), counts=counts)
    pos = positions(S, rank, world, layout, ulysses_size)
    loss = model(sh(inputs), pos, targets=sh(targets), loss_coeff=coeff).loss
    loss.backward()
    total = loss.detach().clone()
    torch.distributed.all_reduce(total)
    grads = {}
    for (name, p), p_ref in zip(model.named_parameters(), ref_model.parameters()):
        torch.distributed.all_reduce(p.grad)  # ranks hold partial sums of the parameter gradients
        grads[name] = (p.grad - p_ref.grad).abs().max().item()
    return {"loss": (total - ref).abs().item(), "grads": grads}


@pytest.mark.parametrize(
    "world,mode,layout",
    [(2, "ring", "striped"), (2, "ring", "zigzag"), (2, "ulysses", "striped"), (4, "ring", "striped"),
     (4, "ring", "contiguous"), (4, "ring", "zigzag"), (4, "hybrid", "zigzag")],
)
def test_training_step_matches_one_process(world, mode, layout):
    for result in run_distributed(_train_step_worker, world, mode, layout):
        assert result["loss"] < 1e-6
        worst = max(result["grads"].items(), key=lambda kv: kv[1])
        assert worst[1] < 1e-6, f"gradient of {worst[0]} differs by {worst[1]:.2e}"
