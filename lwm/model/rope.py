"""Rotary position embedding (LLaMA / Hugging Face "rotate half" layout).

Angles are computed from the positions given, in fp32, so that a rank holding a strided or
zigzag slice of a sequence rotates each token by its global position.
"""

from __future__ import annotations

import math

import torch

from lwm.model.config import RopeScaling


def scaled_inv_freq(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1's frequency scaling, as transformers' "llama3" RoPE computes it (same fp32 arithmetic,
    so imported Llama-3 weights see the angles they were trained with): a frequency whose wavelength
    is longer than original_max_seq_len / low_freq_factor turns `factor` times slower, one shorter
    than original_max_seq_len / high_freq_factor is kept, and one between is a blend of the two,
    linear in original_max_seq_len / wavelength."""
    low, high, context = scaling.low_freq_factor, scaling.high_freq_factor, scaling.original_max_seq_len
    wavelen = 2 * math.pi / inv_freq
    smooth = (context / wavelen - low) / (high - low)  # 0 at the long-wave edge, 1 at the short-wave edge
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    kept_or_blended = torch.where(wavelen < context / high, inv_freq, blended)
    return torch.where(wavelen > context / low, inv_freq / scaling.factor, kept_or_blended)


def rope_angles(
    positions: torch.Tensor, head_dim: int, theta: float, scaling: RopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for each position: (S,) or (B, S) -> (S, head_dim/2) or (B, S, head_dim/2), fp32;
    with `scaling`, of the frequencies Llama 3.1's scaling makes from theta's."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)  # (head_dim / 2,)
    if scaling is not None:
        inv_freq = scaled_inv_freq(inv_freq, scaling)
    freqs = positions.float().unsqueeze(-1) * inv_freq  # (..., S) -> (..., S, head_dim / 2)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, S, D) in fp32 by cos/sin of shape (S, D/2) or (B, S, D/2); returns x's dtype.

    Dimension i pairs with i + D/2 (rotate-half layout): the same arithmetic as
    x * cat(cos, cos) + rotate_half(x) * cat(sin, sin), on half-width tensors.
    """
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, S, D/2) -> (B, 1, S, D/2)
    x1, x2 = x.float().chunk(2, dim=-1)  # (B, H, S, D) -> 2 x (B, H, S, D/2)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
