"""The CUDA attention paths, run on CPU through stand-ins that keep the CUDA kernels' contracts
(tests/cuda_standins.py), and on the meta device with the CUDA kernels forced.

Tolerances: bf16 results are compared with fp32 references by the error of plain bf16 attention
on the same inputs (the CPU flash kernel in bf16): a path may be a few times worse than that,
never orders of magnitude (a misread logsumexp gives errors of 10-300, the baseline about 0.02).
"""

from __future__ import annotations

import itertools
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from cuda_standins import KernelContractError, installed
from document_refs import masked_sdpa, packings

from lwm.model import ModelConfig, Transformer
from lwm.model.documents import Documents
from lwm.parallel import (
    apply_context_parallel,
    block_backward,
    block_forward,
    hybrid_attention,
    hybrid_groups,
    kernels,
    ring_attention,
    shard,
    simulate_ring,
    ulysses_attention,
)
from lwm.parallel.launch import run_distributed

LAYOUTS = ("contiguous", "striped", "zigzag")
CUDA_BACKENDS = {"cuda_flash": torch.bfloat16, "cuda_efficient": torch.float32, "cuda_cudnn": torch.bfloat16}


@pytest.fixture(autouse=True)
def standins():
    with installed() as calls:
        calls.clear()
        yield calls


def _math(q, k, v, causal, bottom_right=False):
    rep = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(rep, 1).transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        lq, lk = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1 + (lk - lq if bottom_right else 0)), -torch.inf)
    return s.logsumexp(-1), s.softmax(-1) @ v.repeat_interleave(rep, 1)


def _reference(q, k, v, causal, seg):
    """fp32 output and the grads for dout, from full-sequence SDPA (block-diagonal with documents)."""
    full = [t.float().clone().requires_grad_() for t in (q, k, v)]
    if seg is None:
        rep = q.shape[1] // k.shape[1]
        out = F.scaled_dot_product_attention(
            full[0], full[1].repeat_interleave(rep, 1), full[2].repeat_interleave(rep, 1), is_causal=causal
        )
    else:
        out = masked_sdpa(*full, seg, causal)
    return out, full


def _errors(fn, q, k, v, dout, causal, seg, dtype):
    ref, full = _reference(q, k, v, causal, seg)
    ref_grads = torch.autograd.grad(ref, full, dout)
    local = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = fn(*local)
    grads = torch.autograd.grad(out, local, dout.to(dtype))
    return max((a.float() - b).abs().max().item() for a, b in zip((out, *grads), (ref, *ref_grads)))


def _inputs(seed=0, B=2, S=48, D=64, hq=4, hkv=2):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, S, D, generator=g) for h in (hq, hkv, hkv))
    return q, k, v, torch.randn(B, hq, S, D, generator=g)


def _baseline(dtype):
    """Plain attention's error in `dtype` on these inputs: the CPU flash kernel, no ring."""
    q, k, v, dout = _inputs()
    return _errors(lambda *t: simulate_ring(*t, 1, True, backend="cpu_flash"), q, k, v, dout, True, None, dtype)


# ----------------------------------------------------------------------------------------- the stand-ins


@pytest.mark.parametrize("causal", [True, False])
def test_standins_match_math_on_contiguous_inputs(causal):
    q, k, v, dout = (t.double() for t in _inputs(S=40, D=32))
    lse, ref = _math(q, k, v, causal, bottom_right=True)
    out, got_lse = torch.ops.aten._scaled_dot_product_flash_attention(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.0, causal
    )[:2]
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got_lse.double(), lse, atol=2e-2, rtol=1e-2)
    kx, vx = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    out, lse32 = torch.ops.aten._scaled_dot_product_efficient_attention(
        q.float(), kx.float(), vx.float(), None, True, 0.0, causal
    )[:2]
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert lse32.shape[-1] == 64 and lse32[..., 40:].isnan().all()  # padded to 32 rows, padding unusable
    # backward against autograd of the fp64 math
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, kx, vx))
    want = torch.autograd.grad(_math(qq, kk, vv, causal)[1], (qq, kk, vv), dout)
    got = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        dout.float(), q.float(), kx.float(), vx.float(), None, out, lse32, torch.zeros(()), torch.zeros(()), 0.0,
        [True, True, True, False], causal,
    )[:3]  # fmt: skip
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=1e-4)


def test_flash_standin_aligns_causal_bottom_right_and_reads_lse_densely():
    q, k, v, _ = _inputs(S=16, D=32)
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        q[:, :, :8].bfloat16(), k.bfloat16(), v.bfloat16(), 0.0, True
    )[0]
    want = _math(q[:, :, :8], k, v, True, bottom_right=True)[1]  # the 8 queries see 9..16 keys
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    # a row slice of a logsumexp: the kernel reads the block at its data pointer as dense rows
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention(qb, kb, vb, 0.0, False)[:2]
    args = lambda l: (o[:, :, 8:], qb[:, :, 8:], kb, vb, o[:, :, 8:], l, None, None, 8, 16, 0.0, False,  # noqa: E731
                      torch.zeros(2, dtype=torch.uint64), torch.zeros((), dtype=torch.uint64))  # fmt: skip
    dense = torch.ops.aten._scaled_dot_product_flash_attention_backward(*args(lse[:, :, 8:].contiguous()))
    strided = torch.ops.aten._scaled_dot_product_flash_attention_backward(*args(lse[:, :, 8:]))
    assert (dense[0].float() - strided[0].float()).abs().max() > 0.1


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v), "dtype torch.float32"),
        (
            lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention(
                q.bfloat16().transpose(2, 3), k.bfloat16(), v.bfloat16()
            ),
            "4-D|contiguous last dim|differ",
        ),
        (
            lambda q, k, v: torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True),
            "no grouped heads",
        ),
        (
            lambda q, k, v: torch.ops.aten._scaled_dot_product_efficient_attention(
                q[..., :30], k[..., :30].repeat_interleave(2, 1), v[..., :30].repeat_interleave(2, 1), None, True
            ),
            "multiple of 4",
        ),
    ],
)
def test_standins_refuse_what_the_kernels_refuse(call, message):
    q, k, v, _ = _inputs(S=16, D=32)
    with pytest.raises(KernelContractError, match=message):
        call(q, k, v)


def _cudnn(q, k, v):
    return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True)


def _bshd(t):
    return t.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            lambda q, k, v: [t.repeat_interleave(4 // t.shape[1], 1).bfloat16().contiguous() for t in (q, k, v)],
            "strides .* are not the \\(B, S, H, D\\)",
        ),
        (lambda q, k, v: (_bshd(q.bfloat16()), _bshd(k.bfloat16()), _bshd(v.bfloat16())), "no grouped heads"),
        (lambda q, k, v: [_bshd(t.repeat_interleave(4 // t.shape[1], 1).bfloat16()) for t in (q, k, v)], None),
        (lambda q, k, v: [_bshd(t.repeat_interleave(4 // t.shape[1], 1).float()) for t in (q, k, v)], "float32"),
        (
            lambda q, k, v: [_bshd(t.repeat_interleave(4 // t.shape[1], 1)[..., :1, :].bfloat16()) for t in (q, k, v)],
            "sequence length 1",
        ),
        (
            lambda q, k, v: [
                _bshd(t.repeat_interleave(4 // t.shape[1], 1).repeat(1, 1, 1, 5).bfloat16()) for t in (q, k, v)
            ],
            "at most 128",
        ),
    ],
    ids=["bhsd-memory", "grouped", "fine", "fp32", "one-key", "head-dim-160"],
)
def test_cudnn_standin_holds_to_torchs_rules(args, message):
    """torch's rules for cuDNN attention (sdp_utils.cpp: check_cudnn_tensor_shapes, check_cudnn_layout)."""
    q, k, v, _ = _inputs(S=16, D=32)
    if message is None:
        out, lse = _cudnn(*args(q, k, v))[:2]
        assert lse.shape == (2, 4, 16, 1) and lse.dtype == torch.float32 and out.stride() == _bshd(out).stride()
        return
    with pytest.raises(KernelContractError, match=message):
        _cudnn(*args(q, k, v))


def test_cudnn_blocks_outside_its_rules_run_on_flash(standins):
    """A block with one key (a document's first token under a ring step) goes to the flash kernel; the rest to
    cuDNN, with grouped heads expanded, every tensor copied into its layout, and the same results as flash's."""
    q, k, v, dout = (t.bfloat16() for t in _inputs(S=16, D=32))
    one = [block_forward(q[:, :, :3], t[:, :, :1], u[:, :, :1], False, backend="cuda_cudnn") for t, u in [(k, v)]][0]
    assert standins.get("cudnn forward", 0) == 0 and standins["flash forward"] == 1
    ref = block_forward(q[:, :, :3], k[:, :, :1], v[:, :, :1], False, backend="cuda_flash")
    assert torch.equal(one[0], ref[0]) and torch.equal(one[1], ref[1])
    for causal in (True, False):
        out, lse = block_forward(q, k, v, causal, backend="cuda_cudnn")
        want_out, want_lse = block_forward(q, k, v, causal, backend="cuda_flash")
        torch.testing.assert_close(out.float(), want_out.float(), atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-3)
        got = block_backward(dout, q, k, v, out, lse, causal, backend="cuda_cudnn")
        want = block_backward(dout, q, k, v, want_out, want_lse, causal, backend="cuda_flash")
        assert [g.shape for g in got] == [q.shape, k.shape, v.shape]
        for a, b in zip(got, want):
            torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)
    assert standins["cudnn forward"] == 2 and standins["cudnn backward"] == 2
    # Ulysses at one rank, packed documents: the same blocks, cuDNN's where they fit
    seg = Documents(packings(2, 16, seed=5), 16)
    outs = [
        ulysses_attention(q, k, v, None, True, "striped", segment_ids=seg, backend=b)
        for b in ("cuda_flash", "cuda_cudnn")
    ]
    torch.testing.assert_close(outs[1].float(), outs[0].float(), atol=1e-2, rtol=1e-2)
    assert standins["cudnn forward"] > 2


# ----------------------------------------------------------------------------------------- kernels and rings


def test_backends_are_chosen_for_cuda_dtypes():
    assert kernels.auto_backend("cuda", torch.bfloat16, 128) == "cuda_flash"
    assert kernels.auto_backend("cuda", torch.float32, 128) == "cuda_efficient"  # not math: it materializes (Lq, Lk)
    assert kernels.auto_backend("cuda", torch.float64, 128) == "math"
    assert kernels.auto_backend("cpu", torch.float32, 128) == "cpu_flash"


@pytest.mark.parametrize("backend", ["cpu_flash", "cuda_flash", "cuda_efficient", "cuda_cudnn", "math"])
def test_causal_blocks_must_be_square(backend):
    q, k, v, _ = _inputs(S=16, D=32)
    with pytest.raises(ValueError, match="Lq 8, Lk 16"):
        block_forward(q[:, :, :8].to(CUDA_BACKENDS.get(backend, torch.float32)), k, v, True, backend=backend)
    with pytest.raises(ValueError, match="Lq 8, Lk 16"):
        block_backward(q[:, :, :8], q[:, :, :8], k, v, q[:, :, :8], q[:, :, :8, 0], True, backend=backend)


@pytest.mark.parametrize("backend", list(CUDA_BACKENDS))
@pytest.mark.parametrize("layout, documents", list(itertools.product(LAYOUTS, (False, True))))
def test_simulated_ring_on_cuda_kernels(standins, backend, layout, documents):
    """Every layout, with and without packed documents: the ring's pieces take row slices of the
    logsumexp, which the CUDA flash backward must get dense."""
    dtype = CUDA_BACKENDS[backend]
    q, k, v, dout = _inputs()
    seg = packings(2, 48, seed=1) if documents else None
    err = _errors(
        lambda *t: simulate_ring(*t, 4, True, layout, segment_ids=seg, backend=backend), q, k, v, dout, True, seg, dtype
    )
    assert err <= 4 * _baseline(dtype) + 1e-4, f"{backend} {layout} documents={documents}: error {err}"
    kernel = "flash varlen" if documents and backend == "cuda_flash" else backend.removeprefix("cuda_")
    assert standins[kernel + " backward"] > 0  # packed documents on flash: one varlen call per step


@pytest.mark.parametrize("backend", ["cuda_flash", "cuda_cudnn"])
def test_ring_on_the_meta_device_with_cuda_kernels(backend):
    """Meta tensors, with the CUDA kernels forced: a tensor made without the inputs' device fails."""
    q, k, v = (torch.empty(1, h, 64, 128, dtype=torch.bfloat16, device="meta", requires_grad=True) for h in (8, 2, 2))
    for layout in LAYOUTS:
        out = simulate_ring(q, k, v, 4, True, layout, backend=backend)
        grads = torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
        assert [g.device.type for g in grads] == ["meta"] * 3 and [g.shape for g in grads] == [
            q.shape,
            k.shape,
            v.shape,
        ]


@pytest.mark.parametrize("backend", ["cuda_flash", "cuda_cudnn"])
@pytest.mark.parametrize("tiling", [{}, {"attn_head_groups": 2, "norm_chunk_size": 16}], ids=["plain", "tiled"])
def test_training_step_on_cuda_flash_matches_cpu_flash(tiling, backend):
    """A bf16 model's loss and gradients through the ring at cp 1 with packed documents (what every
    GPU training run computes): the CUDA flash path against the CPU flash kernel; tiled too (each head
    group's q/k/v, sliced from the projections, reach the kernel with their head dim contiguous)."""
    cfg = ModelConfig.from_preset("debug", **tiling)
    tokens = torch.randint(0, cfg.vocab_size, (2, 65))
    seg = packings(2, 64, seed=2)
    results = []
    for kernel in ("cpu_flash", backend):
        torch.manual_seed(0)
        model = apply_context_parallel(Transformer(cfg).to(torch.bfloat16), backend=kernel)
        out = model(tokens[:, :-1], targets=tokens[:, 1:], loss_coeff=torch.full((2, 64), 1 / 128), segment_ids=seg)
        out.loss.backward()
        results.append((out.loss.float(), [p.grad.float() for p in model.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a, atol=2e-2, rtol=1e-2)
    for a, b in zip(grads_a, grads_b):
        assert (a - b).abs().max() <= 0.05 * a.abs().max() + 1e-3


# ----------------------------------------------------------------------------------------- real gloo groups


DOCS, DENSE = ("ids", "documents"), ("dense",)


def _on_flash(attention, layout: str, **groups):
    return partial(attention, causal=True, layout=layout, backend="cuda_flash", **groups)


def _dist_worker(rank, world):
    from cuda_standins import installed as standins_installed

    q, k, v, dout = _inputs(seed=3, D=64)
    seg = packings(2, 48, seed=4)
    ring_g, uly_g = hybrid_groups(world // 2, 2) if world == 4 else (None, None)
    # name: (layout, attention, its forms). Without documents ("dense") the striped ring's steps from a
    # later rank hand the flash backward a row slice of the logsumexp.
    cases = {
        "ring": ("zigzag", _on_flash(ring_attention, "zigzag"), DOCS),
        "ring striped": ("striped", _on_flash(ring_attention, "striped"), DENSE),
        "ulysses": ("striped", _on_flash(ulysses_attention, "striped"), DOCS),
        "ring cudnn": (
            "zigzag",
            partial(ring_attention, causal=True, layout="zigzag", backend="cuda_cudnn"),
            DOCS + DENSE,
        ),
    }
    if world == 4:
        hybrid = _on_flash(hybrid_attention, "striped", ring_group=ring_g, ulysses_group=uly_g)
        cases["hybrid"] = ("striped", hybrid, DOCS)
    errors = {}
    with standins_installed():
        for name, (layout, fn, forms) in cases.items():
            sh = lambda t, d=2: shard(t, d, rank, world, layout, 2 if name == "hybrid" else 1)  # noqa: E731
            # none, the rank's ids (gathered and read in each call), or the batch's Documents (read once)
            given = {"dense": None, "ids": sh(seg, 1), "documents": Documents(seg, seg.shape[1] // world)}
            for form in forms:
                ref, full = _reference(q, k, v, True, None if form == "dense" else seg)
                ref_grads = torch.autograd.grad(ref, full, dout)
                local = [sh(t).bfloat16().requires_grad_() for t in (q, k, v)]
                out = fn(*local, segment_ids=given[form])
                grads = torch.autograd.grad(out, local, sh(dout).bfloat16())
                errors[f"{name} {form}"] = max(
                    (a.float() - sh(b)).abs().max().item() for a, b in zip((out, *grads), (ref, *ref_grads))
                )
    return errors


def _cache_worker(rank, world):
    """Prefill (the ring in segments, then the cache's ring pass) and decode of a bf16 model."""
    import torch.distributed as dist
    from cuda_standins import installed as standins_installed

    from lwm.data.vocab import Vocab
    from lwm.infer import Generator

    vocab = Vocab(4096)
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug", vocab_size=vocab.size)).to(torch.bfloat16).eval()
    prompt = torch.randint(0, vocab.text_size, (45,), generator=torch.Generator().manual_seed(0))
    scores = {}
    with standins_installed() as calls:
        for backend in ("cpu_flash", "cuda_flash"):
            gen = Generator(model, vocab, group=dist.group.WORLD, prefill_chunk=5, backend=backend)
            scores[backend] = gen.score(prompt, [[5, 6, 7, 8, 9], [10]])
        return scores, dict(calls)


def test_kv_cache_prefill_and_decode_with_cuda_flash():
    for scores, calls in run_distributed(_cache_worker, 2, timeout=120):
        assert calls["flash forward"] > 0
        torch.testing.assert_close(
            torch.tensor(scores["cuda_flash"]), torch.tensor(scores["cpu_flash"]), atol=0.1, rtol=0.02
        )


@pytest.mark.parametrize("world", [2, 4])
def test_ring_ulysses_hybrid_on_gloo_with_cuda_flash(world):
    base = _baseline(torch.bfloat16)
    for rank_errors in run_distributed(_dist_worker, world, timeout=120):
        for name, err in rank_errors.items():
            assert err <= 4 * base + 1e-4, f"{name} on {world} ranks: error {err} (plain bf16 attention: {base})"


def test_guided_rows_decode_with_cuda_flash(standins):
    """The two rows of guided vision generation (KVCache.stack: rows left-padded, each row's keys read from its
    own start) through the flash kernel's stand-in, bf16: what the kernel is handed passes its checks, and each
    step's logits of both rows are cpu_flash's."""
    from lwm.data.vocab import Vocab
    from lwm.infer import Generator

    vocab = Vocab(300, n_vision_codes=64, pad_multiple=8)
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug", vocab_size=vocab.size)).to(torch.bfloat16).eval()
    rows = [[1, *range(20, 43), vocab.vision_start], [1, vocab.vision_start]]
    steps = {}
    for backend in ("cpu_flash", "cuda_flash"):
        gen = Generator(model, vocab, prefill_chunk=8, backend=backend)
        logits = [gen.prefill_rows(rows, reserve=4)]  # (2, V)
        for code in (3, 7, 11):
            logits.append(gen.extend_rows(torch.tensor([vocab.vision_offset + code])))
        gen.release()
        steps[backend] = torch.stack(logits)  # (4, 2, V)
    assert standins["flash forward"] > 0
    torch.testing.assert_close(steps["cuda_flash"], steps["cpu_flash"], atol=0.1, rtol=0.02)
