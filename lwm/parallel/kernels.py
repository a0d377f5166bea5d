"""Block attention kernels: (out, logsumexp) of one block, and its backward.

q (B, Hq, Lq, D); k, v (B, Hkv, Lk, D) with Hq a multiple of Hkv. `causal` is the plain lower
triangle of a square block: the kernels disagree on where it lies when Lq != Lk (top-left on CPU
and in the memory-efficient kernel, bottom-right in CUDA flash), so that case is refused. The
backward recomputes the block from the final (merged) output and logsumexp, as flash attention
does, so the per-block gradients of a ring add up to the gradients of the whole.

Backends (the CUDA kernels' contracts are checked on CPU by tests/cuda_standins.py):
    cpu_flash       aten's flash kernel for CPU (any float dtype, GQA native)
    cuda_flash      aten's flash kernel for CUDA (fp16/bf16, head dim <= 256 and a multiple of 8,
                    GQA native: k/v are never expanded); its backward reads the logsumexp as a
                    dense (B, H, Lq) block, whatever the strides, so a slice of a larger one is
                    copied first. Packed documents use its varlen form (varlen.py)
    cuda_efficient  aten's memory-efficient kernel for CUDA (fp32 too; the logsumexp it returns
                    and reads back is padded to a multiple of 32 rows; no GQA, k/v are expanded)
    cuda_cudnn      aten's cuDNN attention for CUDA (parallel.attention_kernel=cudnn): fp16/bf16,
                    head dim <= 128 and a multiple of 8, more than one key, q/k/v (and the output
                    and its gradient) in the (B, S, H, D) memory order with exact strides (each
                    block is copied into it), no GQA (k/v are expanded), its logsumexp (B, H, Lq, 1);
                    a block outside those rules (one key: a document's first token) runs on
                    cuda_flash, which reads the same logsumexp (the rules are torch's:
                    sdp_utils.cpp's check_cudnn_tensor_shapes and check_cudnn_layout)
    math            plain PyTorch, any device and dtype: materializes the (Lq, Lk) scores, so it
                    serves fp64 references and what no kernel takes, never long CUDA blocks
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "cpu_flash", "cuda_flash", "cuda_efficient", "cuda_cudnn", "math")
CUDNN_DTYPES = (torch.float16, torch.bfloat16)
CUDNN_HEAD_DIM = 128  # torch's limit for cuDNN attention (256 only on compute capability 9.0 with cuDNN 9.10)
LSE_ROWS = 32  # the memory-efficient kernel's logsumexp has its rows padded to a multiple of this


def select_backend(q: torch.Tensor, backend: str = "auto") -> str:
    """The kernel for q's device, dtype and head dim ("auto"), or the one named."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; expected one of {BACKENDS}")
    if backend != "auto":
        return backend
    return auto_backend(q.device.type, q.dtype, q.shape[-1])


def auto_backend(device_type: str, dtype: torch.dtype, head_dim: int) -> str:
    if device_type == "cpu":
        return "cpu_flash"
    if device_type != "cuda":
        return "math"
    if dtype in (torch.float16, torch.bfloat16) and head_dim <= 256 and head_dim % 8 == 0:
        return "cuda_flash"
    if dtype in (torch.float16, torch.bfloat16, torch.float32) and head_dim % (4 if dtype == torch.float32 else 8) == 0:
        return "cuda_efficient"
    return "math"


def _check_causal(q: torch.Tensor, k: torch.Tensor, causal: bool) -> None:
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(
            f"a causal block needs as many queries as keys (kernels align the triangle differently), "
            f"got Lq {q.shape[2]}, Lk {k.shape[2]}"
        )


def softmax_scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _expand_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    rep = n_heads // x.shape[1]
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)  # (B, Hkv, L, D) -> (B, Hq, L, D)


def _reduce_kv(grad: torch.Tensor, n_kv: int) -> torch.Tensor:
    B, H, L, D = grad.shape
    return grad if H == n_kv else grad.view(B, n_kv, H // n_kv, L, D).sum(2)  # (B, Hq, L, D) -> (B, Hkv, L, D)


# ----------------------------------------------------------------------------------------- cuDNN


def cudnn_takes(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether cuDNN attention serves this block (torch's shape rules for it); else cuda_flash does."""
    d = q.shape[-1]
    return q.dtype in CUDNN_DTYPES and d <= CUDNN_HEAD_DIM and d % 8 == 0 and k.shape[2] > 1


def _bshd(x: torch.Tensor) -> torch.Tensor:
    """(B, H, S, D) values laid out as cuDNN reads them: (B, S, H, D) memory with exact strides."""
    B, H, S, D = x.shape
    if x.stride() == (S * H * D, D, H * D, 1):
        return x
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def _cudnn_forward(q, k, v, causal, scale):
    kx, vx = (_bshd(_expand_kv(t, q.shape[1])) for t in (k, v))
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        _bshd(q), kx, vx, None, True, 0.0, causal, False, scale=scale
    )[:2]
    return out, lse.squeeze(-1)  # (B, H, Lq, 1) -> (B, H, Lq)


def _cudnn_backward(dout, q, k, v, out, lse, causal, scale):
    kx, vx = (_bshd(_expand_kv(t, q.shape[1])) for t in (k, v))
    stats = lse.float().unsqueeze(-1).contiguous()  # (B, H, Lq) -> (B, H, Lq, 1), as its forward returned it
    unused = torch.empty(0, device=q.device)  # no dropout: the RNG state is never read
    dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        _bshd(dout), _bshd(q), kx, vx, _bshd(out), stats, unused, unused, None, None, None,
        q.shape[2], k.shape[2], 0.0, causal, scale=scale,
    )  # fmt: skip
    return dq, _reduce_kv(dk, k.shape[1]), _reduce_kv(dv, k.shape[1])


# ----------------------------------------------------------------------------------------- math


def _math_scores(q, k, causal, scale):
    s = (q @ _expand_kv(k, q.shape[1]).transpose(-1, -2)) * scale  # (B, Hq, Lq, Lk)
    if causal:
        lq, lk = q.shape[2], k.shape[2]
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return s


def _math_forward(q, k, v, causal, scale):
    s = _math_scores(q, k, causal, scale)
    lse = torch.logsumexp(s, dim=-1)  # (B, Hq, Lq)
    out = torch.exp(s - lse.unsqueeze(-1)) @ _expand_kv(v, q.shape[1])
    return out, lse


def _math_backward(dout, q, k, v, out, lse, causal, scale):
    p = torch.exp(_math_scores(q, k, causal, scale) - lse.unsqueeze(-1).to(q.dtype))  # (B, Hq, Lq, Lk)
    dv = p.transpose(-1, -2) @ dout
    dp = dout @ _expand_kv(v, q.shape[1]).transpose(-1, -2)
    delta = (dout * out).sum(-1, keepdim=True)
    ds = p * (dp - delta) * scale
    dq = ds @ _expand_kv(k, q.shape[1])
    dk = ds.transpose(-1, -2) @ q
    return dq, _reduce_kv(dk, k.shape[1]), _reduce_kv(dv, k.shape[1])


# ----------------------------------------------------------------------------------------- entry points


def block_forward(q, k, v, causal: bool, scale: float | None = None, backend: str = "auto"):
    """-> out (B, Hq, Lq, D) in q's dtype, lse (B, Hq, Lq) in fp32 (fp64 for fp64 inputs)."""
    backend, scale = select_backend(q, backend), softmax_scale(q, scale)
    _check_causal(q, k, causal)
    if backend == "cuda_cudnn":
        backend = "cuda_cudnn" if cudnn_takes(q, k) else "cuda_flash"
    if backend == "cuda_cudnn":
        out, lse = _cudnn_forward(q, k, v, causal, scale)
    elif backend == "cpu_flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=None, scale=scale
        )
    elif backend == "cuda_flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
    elif backend == "cuda_efficient":
        kx, vx = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, kx, vx, None, True, 0.0, causal, scale=scale
        )[:2]
        lse = lse[..., : q.shape[2]]  # (B, H, padded) -> (B, H, Lq)
    else:
        out, lse = _math_forward(q, k, v, causal, scale)
    return out, lse.to(torch.promote_types(q.dtype, torch.float32))


def block_backward(dout, q, k, v, out, lse, causal: bool, scale: float | None = None, backend: str = "auto"):
    """-> dq (like q), dk, dv (like k, v): gradients of this block's share of the attention."""
    backend, scale = select_backend(q, backend), softmax_scale(q, scale)
    _check_causal(q, k, causal)
    if backend == "cuda_cudnn":
        if cudnn_takes(q, k):
            return _cudnn_backward(dout, q, k, v, out, lse, causal, scale)
        backend = "cuda_flash"
    if backend == "cpu_flash":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout,
            q,
            k,
            v,
            out,
            lse.float() if q.dtype != torch.float64 else lse,
            0.0,
            causal,
            attn_mask=None,
            scale=scale,
        )
    if backend == "cuda_flash":
        # No dropout: the RNG state is never read; cum_seq_* = None selects the dense (not varlen) path.
        seed = torch.zeros(2, dtype=torch.uint64, device=q.device)
        offset = torch.zeros((), dtype=torch.uint64, device=q.device)
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout,
            q,
            k,
            v,
            out,
            lse.float().contiguous(),  # read as dense (B, H, Lq): a row slice must be copied
            None,
            None,
            q.shape[2],
            k.shape[2],
            0.0,
            causal,
            seed,
            offset,
            scale=scale,
        )  # dk, dv come back with k's heads: the kernel sums each group's
    if backend == "cuda_efficient":
        kx, vx = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
        lq = q.shape[2]
        padded = F.pad(lse.float(), (0, -lq % LSE_ROWS)).contiguous()  # (B, H, Lq) -> (B, H, Lq padded to 32)
        seed = offset = torch.zeros((), dtype=torch.long, device=q.device)  # no dropout: never read
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            dout, q, kx, vx, None, out, padded, seed, offset, 0.0, [True, True, True, False], causal, scale=scale
        )
        return dq, _reduce_kv(dk, k.shape[1]), _reduce_kv(dv, k.shape[1])
    return _math_backward(dout, q, k, v, out, lse, causal, scale)
