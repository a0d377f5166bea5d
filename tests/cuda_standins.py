"""CPU stand-ins of the CUDA-only kernels the project calls (attention, the fused RMSNorm's
backward), holding to their contracts.

Registered for CPU tensors under the real aten names (which have no CPU kernel), so that the
project's CUDA code paths (backends `cuda_flash` and `cuda_efficient`) run in the ordinary suite.
Each stand-in computes exact attention in fp32, and checks and reads its arguments the way the
CUDA kernel does, so a call that would be wrong on a GPU is wrong (or refused) here too:

flash (FlashAttention-2 behind aten._scaled_dot_product_flash_attention[_backward])
    fp16/bf16 only, q/k/v of one dtype, head dim <= 256, every tensor's last dim contiguous,
    k/v heads dividing q heads (grouped-query attention is native);
    causal with Lq != Lk is aligned bottom-right (query i sees key j when j <= i + Lk - Lq);
    the backward reads its logsumexp as a dense (B, H, Lq) block from the data pointer, whatever
    its strides (the kernel indexes (b * H + h) * Lq + row).
flash varlen (FlashAttention-2's variable-length form behind aten._flash_attention_forward /
_flash_attention_backward with cum_seq_q / cum_seq_k)
    q (total_q, Hq, D), k/v (total_k, Hkv, D), last dim contiguous, other strides free; cum_seq_q,
    cum_seq_k int32, contiguous, (pairs + 1,), from 0 to the totals, non-decreasing; max_q/max_k
    at least every pair's length; pair i is rows cum_q[i]:cum_q[i+1] against keys
    cum_k[i]:cum_k[i+1], causal aligned bottom-right in each pair (and off when max_q == 1, as the
    kernel sets it); a row with no key gets output 0 and logsumexp +inf; the logsumexp is
    (Hq, total_q) fp32, and the backward reads it as that dense block from its data pointer.
memory-efficient (aten._scaled_dot_product_efficient_attention[_backward])
    fp16/bf16/fp32, equal q and k/v heads, head dim a multiple of 8 (16-bit) or 4 (fp32);
    causal aligned top-left; the forward's logsumexp is padded to a multiple of 32 rows (the
    padding is NaN here, so reading it shows); the backward needs that padded length, reads rows
    with unit stride and batch/head with the tensor's strides.
cuDNN (aten._scaled_dot_product_cudnn_attention[_backward]; torch's sdp_utils.cpp rules)
    fp16/bf16, equal q and k/v heads, head dim <= 128 and a multiple of 8, more than one key, batch
    and heads at most 65535; q, k, v (and the backward's out and grad_out) in the (B, S, H, D) memory
    order with exact strides (check_cudnn_layout); the forward asked for its logsumexp, which comes
    back (B, H, Lq, 1) fp32, and the backward reads it so (contiguous); no bias, dropout or varlen.
Outputs and gradients come back as the kernels give them: (B, S, H, D) memory seen as (B, H, S, D).
fused RMSNorm backward (aten._fused_rms_norm_backward; its forward has a CPU composite)
    grad_out like the input; rstd fp32 (fp64 for fp64 input), the input's shape with 1 in the
    normalized dims; weight None or of the input's dtype and the normalized shape; computes in
    the rstd's dtype, returns the input gradient in the input's dtype and the weight's in the
    weight's, None where output_mask says so.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

FLASH_DTYPES = (torch.float16, torch.bfloat16)
EFFICIENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
calls: dict[str, int] = {}  # stand-in name -> times called (tests read it to see the path was taken)


class KernelContractError(RuntimeError):
    """A call the CUDA kernel would refuse or read wrongly."""


def _require(ok: bool, kernel: str, message: str) -> None:
    if not ok:
        raise KernelContractError(f"{kernel}: {message}")


def _check_qkv(kernel: str, q, k, v, dtypes, grouped: bool) -> None:
    for name, t in (("query", q), ("key", k), ("value", v)):
        _require(t.dim() == 4, kernel, f"{name} must be 4-D (B, H, S, D), got {tuple(t.shape)}")
        _require(t.dtype in dtypes, kernel, f"{name} dtype {t.dtype} is not supported (only {dtypes})")
        _require(t.stride(-1) == 1, kernel, f"{name} must have a contiguous last dim, strides {t.stride()}")
    _require(q.dtype == k.dtype == v.dtype, kernel, f"q/k/v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    _require(k.shape == v.shape, kernel, f"key {tuple(k.shape)} and value {tuple(v.shape)} differ")
    hq, hkv = q.shape[1], k.shape[1]
    if grouped:
        _require(hq % hkv == 0, kernel, f"q heads {hq} are not a multiple of k/v heads {hkv}")
    else:
        _require(hq == hkv, kernel, f"q heads {hq} != k/v heads {hkv} (the kernel has no grouped heads)")


def _scores(q, k, causal: bool, scale: float | None, bottom_right: bool) -> torch.Tensor:
    """fp32 scores (B, Hq, Lq, Lk), k heads repeated for grouped queries, the causal mask applied."""
    rep = q.shape[1] // k.shape[1]
    s = q.float() @ k.float().repeat_interleave(rep, 1).transpose(-1, -2)
    s = s * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        lq, lk = q.shape[2], k.shape[2]
        shift = lk - lq if bottom_right else 0
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1 + shift), float("-inf"))
    return s


def _bshd(t: torch.Tensor) -> torch.Tensor:
    """(B, H, S, D) values in the kernels' (B, S, H, D) memory order."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _forward(q, k, v, causal, scale, bottom_right):
    s = _scores(q, k, causal, scale, bottom_right)
    lse = torch.logsumexp(s, dim=-1)  # (B, H, Lq)
    rep = q.shape[1] // k.shape[1]
    out = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0) @ v.float().repeat_interleave(rep, 1)
    return _bshd(out.to(q.dtype)), lse


def _backward(dout, q, k, v, out, lse, causal, scale, bottom_right):
    """Gradients from the logsumexp the kernel read (B, H, Lq fp32), k/v grads summed per group."""
    B, H, Lq, D = q.shape
    rep = H // k.shape[1]
    p = torch.exp(_scores(q, k, causal, scale, bottom_right) - lse.unsqueeze(-1)).nan_to_num(0.0)
    do, o = dout.float(), out.float()
    dv = p.transpose(-1, -2) @ do
    ds = p * (do @ v.float().repeat_interleave(rep, 1).transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    ds = ds * (1.0 / math.sqrt(D) if scale is None else scale)
    dq = ds @ k.float().repeat_interleave(rep, 1)
    dk = ds.transpose(-1, -2) @ q.float()
    group = lambda g: g.view(B, k.shape[1], rep, *g.shape[2:]).sum(2)  # noqa: E731  (B, Hq, ..) -> (B, Hkv, ..)
    return tuple(_bshd(g.to(q.dtype)) for g in (dq, group(dk), group(dv)))


def _dense_read(lse: torch.Tensor, shape: tuple[int, ...], kernel: str) -> torch.Tensor:
    """The block of `shape` a kernel reads from lse's data pointer with dense row-major indexing."""
    need = lse.storage_offset() + math.prod(shape)
    _require(
        need * lse.element_size() <= lse.untyped_storage().nbytes(),
        kernel,
        f"logsumexp {tuple(lse.shape)} strides {lse.stride()}: a dense {shape} read runs past its memory",
    )
    return torch.as_strided(lse, shape, torch.empty(shape, device="meta").stride())


# ----------------------------------------------------------------------------------------- flash


def flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    kernel = "flash forward"
    calls[kernel] = calls.get(kernel, 0) + 1
    _check_qkv(kernel, query, key, value, FLASH_DTYPES, grouped=True)
    _require(query.shape[-1] <= 256, kernel, f"head dim {query.shape[-1]} > 256")
    _require(dropout_p == 0.0 and not return_debug_mask, kernel, "the stand-in has no dropout or debug mask")
    out, lse = _forward(query, key, value, is_causal, scale, bottom_right=True)
    seed, offset = torch.zeros(2, dtype=torch.uint64), torch.zeros((), dtype=torch.uint64)
    return out, lse, None, None, query.shape[2], key.shape[2], seed, offset, torch.empty(0, dtype=query.dtype)


def flash_backward(
    grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
    philox_seed, philox_offset, *, scale=None,
):  # fmt: skip
    kernel = "flash backward"
    calls[kernel] = calls.get(kernel, 0) + 1
    _check_qkv(kernel, query, key, value, FLASH_DTYPES, grouped=True)
    for name, t in (("grad_out", grad_out), ("out", out)):
        _require(t.shape == query.shape and t.dtype == query.dtype, kernel, f"{name} must be like query")
        _require(t.stride(-1) == 1, kernel, f"{name} must have a contiguous last dim, strides {t.stride()}")
    _require(cum_seq_q is None and cum_seq_k is None, kernel, "the stand-in serves the dense (not varlen) call")
    _require(logsumexp.dtype == torch.float32, kernel, f"logsumexp must be fp32, got {logsumexp.dtype}")
    B, H, Lq, _ = query.shape
    lse = _dense_read(logsumexp, (B, H, Lq), kernel)  # strides ignored, as the kernel does
    return _backward(grad_out, query, key, value, out, lse, is_causal, scale, bottom_right=True)


# ----------------------------------------------------------------------------------------- flash varlen


def _cumulative(kernel: str, name: str, t, total: int, longest: int) -> list[int]:
    _require(t is not None, kernel, f"{name} is None: the stand-in serves the varlen call only")
    _require(
        t.dtype == torch.int32 and t.dim() == 1 and t.is_contiguous(), kernel, f"{name} must be contiguous 1-D int32"
    )
    c = t.tolist()
    steps = [b - a for a, b in zip(c, c[1:])]
    _require(c[0] == 0 and c[-1] == total and min(steps) >= 0, kernel, f"{name} {c} must rise from 0 to {total}")
    _require(max(steps) <= longest, kernel, f"{name}: a pair of {max(steps)} rows exceeds its max {longest}")
    return c


def _check_packed(kernel, q, k, v, cum_q, cum_k, max_q, max_k) -> tuple[list[int], list[int]]:
    for name, t in (("query", q), ("key", k), ("value", v)):
        _require(t.dim() == 3, kernel, f"{name} must be packed (total, H, D), got {tuple(t.shape)}")
    _check_qkv(kernel, *(t.transpose(0, 1)[None] for t in (q, k, v)), FLASH_DTYPES, grouped=True)
    _require(q.shape[-1] <= 256 and q.shape[-1] % 8 == 0, kernel, f"head dim {q.shape[-1]}: <= 256, a multiple of 8")
    cq = _cumulative(kernel, "cum_seq_q", cum_q, q.shape[0], max_q)
    ck = _cumulative(kernel, "cum_seq_k", cum_k, k.shape[0], max_k)
    _require(len(cq) == len(ck), kernel, f"{len(cq) - 1} query pairs but {len(ck) - 1} key pairs")
    return cq, ck


def _pair(t, c, i):
    return t[c[i] : c[i + 1]].transpose(0, 1)[None]  # rows of pair i: (n, H, D) -> (1, H, n, D)


def varlen_forward(
    query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *, scale=None,
    window_size_left=None, window_size_right=None, seqused_k=None, alibi_slopes=None, block_table=None, num_splits=None,
):  # fmt: skip
    kernel = "flash varlen forward"
    calls[kernel] = calls.get(kernel, 0) + 1
    cq, ck = _check_packed(kernel, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k)
    extras = (window_size_left, window_size_right, seqused_k, alibi_slopes, block_table)
    _require(dropout_p == 0.0 and not return_debug_mask and extras == (None,) * 5, kernel, "only the plain call")
    causal = is_causal and max_q > 1
    out = torch.zeros(query.shape, dtype=query.dtype)
    lse = torch.full((query.shape[1], query.shape[0]), float("inf"))  # (Hq, total_q): no key -> +inf
    for i in range(len(cq) - 1):
        if cq[i + 1] > cq[i] and ck[i + 1] > ck[i]:
            o, l = _forward(*(_pair(t, c, i) for t, c in ((query, cq), (key, ck), (value, ck))), causal, scale, True)
            out[cq[i] : cq[i + 1]] = o[0].transpose(0, 1)
            lse[:, cq[i] : cq[i + 1]] = l[0].masked_fill(l[0] == float("-inf"), float("inf"))
    seed, offset = torch.zeros(2, dtype=torch.uint64), torch.zeros((), dtype=torch.uint64)
    return out, lse, seed, offset, torch.empty(0, dtype=query.dtype)


def varlen_backward(
    grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
    rng_state, unused, *, scale=None, window_size_left=None, window_size_right=None,
):  # fmt: skip
    kernel = "flash varlen backward"
    calls[kernel] = calls.get(kernel, 0) + 1
    cq, ck = _check_packed(kernel, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k)
    for name, t in (("grad_out", grad_out), ("out", out)):
        _require(t.shape == query.shape and t.dtype == query.dtype, kernel, f"{name} must be like query")
        _require(t.stride(-1) == 1, kernel, f"{name} must have a contiguous last dim, strides {t.stride()}")
    _require(logsumexp.dtype == torch.float32, kernel, f"logsumexp must be fp32, got {logsumexp.dtype}")
    _require(dropout_p == 0.0 and window_size_left is None and window_size_right is None, kernel, "only the plain call")
    lse = _dense_read(logsumexp, (query.shape[1], query.shape[0]), kernel)  # (Hq, total_q), strides ignored
    grads = [torch.zeros(t.shape, dtype=t.dtype) for t in (query, key, value)]
    for i in range(len(cq) - 1):
        if cq[i + 1] > cq[i] and ck[i + 1] > ck[i]:
            q_, k_, v_ = (_pair(t, c, i) for t, c in ((query, cq), (key, ck), (value, ck)))
            do, o = _pair(grad_out, cq, i), _pair(out, cq, i)
            parts = _backward(do, q_, k_, v_, o, lse[None, :, cq[i] : cq[i + 1]], is_causal and max_q > 1, scale, True)
            for g, c, part in zip(grads, (cq, ck, ck), parts):
                g[c[i] : c[i + 1]] = part[0].transpose(0, 1)
    return tuple(grads)


# ----------------------------------------------------------------------------------------- memory-efficient


def _check_efficient(kernel, q, k, v):
    _check_qkv(kernel, q, k, v, EFFICIENT_DTYPES, grouped=False)
    align = 4 if q.dtype == torch.float32 else 8
    _require(q.shape[-1] % align == 0, kernel, f"head dim {q.shape[-1]} is not a multiple of {align} for {q.dtype}")


def efficient_forward(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    kernel = "efficient forward"
    calls[kernel] = calls.get(kernel, 0) + 1
    _check_efficient(kernel, query, key, value)
    _require(attn_bias is None and dropout_p == 0.0, kernel, "the stand-in has no bias or dropout")
    out, lse = _forward(query, key, value, is_causal, scale, bottom_right=False)
    B, H, Lq, _ = query.shape
    padded = torch.full((B, H, math.ceil(Lq / 32) * 32 if compute_log_sumexp else 0), float("nan"))
    if compute_log_sumexp:
        padded[..., :Lq] = lse
    seed, offset = torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long)
    return out, padded, seed, offset


def efficient_backward(
    grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset, dropout_p,
    grad_input_mask, is_causal=False, *, scale=None,
):  # fmt: skip
    kernel = "efficient backward"
    calls[kernel] = calls.get(kernel, 0) + 1
    _check_efficient(kernel, query, key, value)
    B, H, Lq, _ = query.shape
    _require(logsumexp.dtype == torch.float32, kernel, f"logsumexp must be fp32, got {logsumexp.dtype}")
    _require(
        logsumexp.dim() == 3 and tuple(logsumexp.shape[:2]) == (B, H) and logsumexp.shape[2] >= math.ceil(Lq / 32) * 32,
        kernel,
        f"logsumexp {tuple(logsumexp.shape)} must be (B, H, Lq padded to 32) = ({B}, {H}, {math.ceil(Lq / 32) * 32})",
    )
    _require(logsumexp.stride(-1) == 1, kernel, f"logsumexp rows must be contiguous, strides {logsumexp.stride()}")
    lse = logsumexp[..., :Lq]
    dq, dk, dv = _backward(grad_out, query, key, value, out, lse, is_causal, scale, bottom_right=False)
    return dq, dk, dv, torch.empty(0, dtype=query.dtype)


# ----------------------------------------------------------------------------------------- cuDNN


def _check_cudnn(kernel, q, k, v):
    _check_qkv(kernel, q, k, v, FLASH_DTYPES, grouped=False)
    d = q.shape[-1]
    _require(d <= 128 and d % 8 == 0, kernel, f"head dim {d}: at most 128, a multiple of 8")
    _require(k.shape[2] > 1, kernel, "key/value sequence length 1 is not supported")
    _require(q.shape[0] <= 65535 and q.shape[1] <= 65535, kernel, f"batch or heads above 65535: {tuple(q.shape)}")
    for name, t in (("query", q), ("key", k), ("value", v)):
        B, H, S, D = t.shape
        _require(
            t.stride() == (S * H * D, D, H * D, 1),
            kernel,
            f"{name} strides {t.stride()} are not the (B, S, H, D) layout's {(S * H * D, D, H * D, 1)}",
        )


def cudnn_forward(
    query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
    scale=None,
):  # fmt: skip
    kernel = "cudnn forward"
    calls[kernel] = calls.get(kernel, 0) + 1
    _check_cudnn(kernel, query, key, value)
    _require(attn_bias is None and dropout_p == 0.0 and not return_debug_mask, kernel, "only the plain call")
    _require(compute_log_sumexp, kernel, "the ring reads the logsumexp: compute_log_sumexp must be true")
    out, lse = _forward(query, key, value, is_causal, scale, bottom_right=False)
    seed, offset = torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long)
    return out, lse.unsqueeze(-1).contiguous(), None, None, query.shape[2], key.shape[2], seed, offset, None


def cudnn_backward(
    grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q, cum_seq_k,
    max_q, max_k, dropout_p, is_causal, *, scale=None,
):  # fmt: skip
    kernel = "cudnn backward"
    calls[kernel] = calls.get(kernel, 0) + 1
    _check_cudnn(kernel, query, key, value)
    for name, t in (("grad_out", grad_out), ("out", out)):
        _require(t.shape == query.shape and t.dtype == query.dtype, kernel, f"{name} must be like query")
    _require(grad_out.stride() == out.stride() == query.stride(), kernel, "grad_out and out must share q's layout")
    _require(attn_bias is None and cum_seq_q is None and cum_seq_k is None, kernel, "no bias, no varlen")
    _require(dropout_p == 0.0 and (max_q, max_k) == (query.shape[2], key.shape[2]), kernel, "the dense call")
    B, H, Lq, _ = query.shape
    _require(
        logsumexp.dtype == torch.float32 and tuple(logsumexp.shape) == (B, H, Lq, 1) and logsumexp.is_contiguous(),
        kernel,
        f"logsumexp must be its forward's contiguous (B, H, Lq, 1) fp32, got {tuple(logsumexp.shape)} "
        f"{logsumexp.dtype} strides {logsumexp.stride()}",
    )
    return _backward(grad_out, query, key, value, out, logsumexp[..., 0], is_causal, scale, bottom_right=False)


def rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    kernel = "fused rms_norm backward"
    calls[kernel] = calls.get(kernel, 0) + 1
    k = len(normalized_shape)
    _require(
        tuple(input.shape[-k:]) == tuple(normalized_shape),
        kernel,
        f"input {tuple(input.shape)} is not (*, {normalized_shape})",
    )
    _require(grad_out.shape == input.shape and grad_out.dtype == input.dtype, kernel, "grad_out must be like the input")
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    stats = (*input.shape[:-k], *[1] * k)
    _require(
        rstd.dtype == acc and tuple(rstd.shape) == stats,
        kernel,
        f"rstd must be {stats} {acc}, got {tuple(rstd.shape)} {rstd.dtype}",
    )
    if weight is not None:
        _require(
            weight.dtype == input.dtype, kernel, f"weight dtype {weight.dtype} differs from the input's {input.dtype}"
        )
        _require(
            tuple(weight.shape) == tuple(normalized_shape),
            kernel,
            f"weight {tuple(weight.shape)} is not {normalized_shape}",
        )
    dims = tuple(range(-k, 0))
    x_hat = input.to(acc) * rstd
    g = grad_out.to(acc) * (weight.to(acc) if weight is not None else 1)
    dx = rstd * (g - x_hat * (g * x_hat).mean(dims, keepdim=True)) if output_mask[0] else None
    dw = None
    if output_mask[1] and weight is not None:
        dw = (grad_out.to(acc) * x_hat).sum(tuple(range(input.dim() - k))).to(weight.dtype)
    return (dx.to(input.dtype) if dx is not None else None), dw


STANDINS = {
    "_fused_rms_norm_backward": rms_norm_backward,
    "_scaled_dot_product_flash_attention": flash_forward,
    "_scaled_dot_product_flash_attention_backward": flash_backward,
    "_flash_attention_forward": varlen_forward,
    "_flash_attention_backward": varlen_backward,
    "_scaled_dot_product_efficient_attention": efficient_forward,
    "_scaled_dot_product_efficient_attention_backward": efficient_backward,
    "_scaled_dot_product_cudnn_attention": cudnn_forward,
    "_scaled_dot_product_cudnn_attention_backward": cudnn_backward,
}


@contextmanager
def installed():
    """The stand-ins registered as the CPU kernels of the CUDA ops while the block runs."""
    lib = torch.library.Library("aten", "IMPL")
    for name, fn in STANDINS.items():
        lib.impl(name, fn, "CPU")
    try:
        yield calls
    finally:
        lib._destroy()
