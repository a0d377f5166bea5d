"""Context-parallel attention and a training step on real gloo process groups (CPU)."""

from __future__ import annotations

import itertools
import os

import pytest
import torch
import torch.nn.functional as F
from document_refs import masked_sdpa, one_by_one_grads, packed_pair, packings
from hf_models import family_model

from lwm.parallel import hybrid_attention, hybrid_groups, positions, ring_attention, shard, ulysses_attention
from lwm.parallel.launch import run_distributed

LAYOUTS = ("contiguous", "striped", "zigzag")
SEQ = 24  # divisible by N and 2N for N = 1..4


def reference(q, k, v, causal):
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=causal)


def _case_errors(rank, world, attn, hq, hkv, d, causal, layout, ulysses_size=1, seed=0, documents=False):
    """Max |error| of this rank's output and q/k/v grads against full-sequence SDPA (with
    documents: a random packing per batch row and the block-diagonal mask)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, h, SEQ, d, generator=g) for h in (hq, hkv, hkv))
    dout = torch.randn(2, hq, SEQ, d, generator=g)
    seg = packings(2, SEQ, seed) if documents else None
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out = masked_sdpa(*full, seg, causal) if documents else reference(*full, causal)
    ref_grads = torch.autograd.grad(ref_out, full, dout)
    sh = lambda t: shard(t, 2, rank, world, layout, ulysses_size)  # noqa: E731
    local = [sh(t).requires_grad_() for t in (q, k, v)]
    extra = {"segment_ids": shard(seg, 1, rank, world, layout, ulysses_size)} if documents else {}
    out = attn(*local, causal=causal, layout=layout, **extra)
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
        results[("ulysses", layout, causal, hkv)] = _case_errors(
            rank, world, ulysses_attention, 12, hkv, 32, causal, layout
        )
    for layout, causal in itertools.product(LAYOUTS, (True, False)):  # packed documents, GQA, head dim 40
        results[("ring+documents", layout, causal, 40)] = _case_errors(
            rank, world, ring_attention, 4, 2, 40, causal, layout, seed=1, documents=True
        )
        if 4 % world == 0:
            results[("ulysses+documents", layout, causal, 2)] = _case_errors(
                rank, world, ulysses_attention, 4, 2, 40, causal, layout, seed=2, documents=True
            )
    if world == 4:
        ring_group, ulysses_group = hybrid_groups(2, 2)
        attn = lambda q, k, v, causal, layout, **kw: hybrid_attention(  # noqa: E731
            q, k, v, ring_group, ulysses_group, causal, layout, **kw
        )
        for layout, causal in itertools.product(LAYOUTS, (True, False)):
            results[("hybrid", layout, causal, 2)] = _case_errors(
                rank, world, attn, 4, 2, 32, causal, layout, ulysses_size=2
            )
            results[("hybrid+documents", layout, causal, 2)] = _case_errors(
                rank, world, attn, 4, 2, 40, causal, layout, ulysses_size=2, seed=3, documents=True
            )
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
        assert any(case[0] == "hybrid+documents" for case in per_rank[0])


# ------------------------------------------------------------------------------------ training step


def _train_step_errors(rank, world, mode, layout, hybrid, family=None):
    from lwm.model import ModelConfig, Transformer, token_coefficients
    from lwm.parallel import apply_context_parallel, global_group_counts

    if family is None:
        torch.manual_seed(0)
        ref_model = Transformer(ModelConfig.from_preset("debug"))
    else:
        ref_model = family_model(family)  # the debug model with the family's options, its vectors perturbed
    cfg = ref_model.config
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
        group, ulysses_group = hybrid
    apply_context_parallel(model, group, layout=layout, mode=mode, ulysses_group=ulysses_group)
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
    return {"loss": (total - ref).abs().item(), "rel_loss": ((total - ref) / ref).abs().item(), "grads": grads}


# ------------------------------------------------------------------------- packed = one by one


def _packed_errors(rank, world, cases):
    from lwm.data import Sharding, shard_batch
    from lwm.model import ModelConfig, Transformer, token_coefficients
    from lwm.parallel import apply_context_parallel, global_group_counts

    cfg = ModelConfig.from_preset("debug")
    torch.manual_seed(0)
    state = Transformer(cfg).state_dict()
    batch, examples = packed_pair(cfg, 32)
    ref_loss, ref_grads = one_by_one_grads(cfg, state, batch, examples)
    results = {}
    for mode, layout, *tiled in cases:  # tiled: head groups and sequence-tiled norms on
        model = Transformer(cfg.replace(attn_head_groups=2, norm_chunk_size=5) if tiled else cfg)
        model.load_state_dict(state)
        apply_context_parallel(model, None, layout=layout, mode=mode)
        local = shard_batch(batch, Sharding(cp_rank=rank, cp_size=world, layout=layout), "document")
        counts = global_group_counts(local["loss_weight"], local["vision_mask"])
        coeff = token_coefficients(local["loss_weight"], local["vision_mask"], counts=counts)
        loss = model(
            local["tokens"],
            local["positions"],
            targets=local["targets"],
            loss_coeff=coeff,
            segment_ids=local["segment_ids"],
        ).loss
        loss.backward()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        worst = 0.0
        for name, p in model.named_parameters():
            torch.distributed.all_reduce(p.grad)
            worst = max(worst, (p.grad - ref_grads[name]).abs().max().item())
        results[(mode, layout, *tiled)] = ((total - ref_loss).abs().item() / ref_loss.abs().item(), worst)
    return results


# The families' options (q/k/v bias, QK norm with wider heads, a tied head) on each kind of attention.
FAMILY_CASES = [
    (*case, f) for f in ("qwen2", "qwen3", "llama3_2_tied") for case in (("ring", "striped"), ("ring", "zigzag"))
]
STEP_CASES = {
    2: [("ring", "striped"), ("ring", "zigzag"), ("ulysses", "striped")]
    + FAMILY_CASES
    + [("ulysses", "striped", f) for f in ("qwen2", "qwen3", "llama3_2_tied")],
    4: [("ring", "striped"), ("ring", "contiguous"), ("ring", "zigzag"), ("hybrid", "zigzag")]
    + FAMILY_CASES
    + [("hybrid", "zigzag", f) for f in ("qwen2", "qwen3", "llama3_2_tied")],
}
PACKED = [("ring", "striped"), ("ring", "zigzag"), ("ulysses", "striped"), ("ring", "striped", "tiled")]
PACKED_CASES = {2: PACKED + [("ulysses", "striped", "tiled")], 4: PACKED}  # 2 q heads a group: Ulysses of 2


def _training_worker(rank, world):
    hybrid = hybrid_groups(world // 2, 2) if world == 4 else None  # every rank creates every group, once
    steps = {case: _train_step_errors(rank, world, *case[:2], hybrid, *case[2:]) for case in STEP_CASES[world]}
    return steps, _packed_errors(rank, world, PACKED_CASES[world])


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"cp{n}")
def training_errors(request):
    return request.param, run_distributed(_training_worker, request.param)


def test_training_step_matches_one_process(training_errors):
    world, per_rank = training_errors
    for steps, _ in per_rank:
        assert set(steps) == set(STEP_CASES[world])
        for case, result in steps.items():
            if len(case) == 2:  # the debug model: its loss within 1e-6
                assert result["loss"] < 1e-6, f"cp={world} {case}: loss differs by {result['loss']:.2e}"
            else:  # a family's perturbed norms and biases: within 1e-6 of the loss (about 9)
                assert result["rel_loss"] < 1e-6, f"cp={world} {case}: loss differs by {result['rel_loss']:.2e} of it"
            worst = max(result["grads"].items(), key=lambda kv: kv[1])
            assert worst[1] < 1e-6, f"cp={world} {case}: gradient of {worst[0]} differs by {worst[1]:.2e}"


def test_packed_batch_equals_its_examples_one_by_one(training_errors):
    """A packed batch of two examples, sharded over cp ranks with document masks and per-example
    positions, gives the loss and parameter gradients of the two examples run alone (fp32: loss
    rtol 1e-6, gradients atol 1e-6)."""
    world, per_rank = training_errors
    for _, packed in per_rank:
        assert set(packed) == set(PACKED_CASES[world])
        for case, (loss_err, grad_err) in packed.items():
            assert loss_err < 1e-6 and grad_err < 1e-6, f"cp={world} {case}: loss {loss_err:.2e}, grads {grad_err:.2e}"


def _environment_worker(rank, world):
    return os.environ.get("LWM_LAUNCH_MARK")


def test_workers_see_the_callers_environment_forked_or_fresh(monkeypatch):
    """Workers are forked from a server started at the first call, yet read the caller's environment
    as it is at each call (as spawned ones do); fresh=True spawns them."""
    monkeypatch.delenv("LWM_LAUNCH_MARK", raising=False)
    assert run_distributed(_environment_worker, 2) == [None, None]  # the server is up
    monkeypatch.setenv("LWM_LAUNCH_MARK", "now")
    assert run_distributed(_environment_worker, 2) == ["now", "now"]
    assert run_distributed(_environment_worker, 1, fresh=True) == ["now"]


def _rank_and_port(rank, world):
    import torch.distributed as dist

    return dist.get_rank(), int(os.environ["MASTER_PORT"])


def test_a_port_taken_after_it_was_found_free_does_not_stop_a_group(monkeypatch):
    """A port found free and then taken by another process (a gloo connection's ephemeral port, under -n 3) made
    rank 0's store fail to bind (EADDRINUSE); the store now binds a port the system picks as it binds, and the
    ranks share it through the call's folder. Here the port a check would find is held, listening."""
    import socket

    from lwm.parallel import launch

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(launch, "free_port", lambda: taken)
        ranks = run_distributed(_rank_and_port, 2)
    assert [r for r, _ in ranks] == [0, 1] and ranks[0][1] == ranks[1][1] != taken
