"""Rotary position embedding (LLaMA / Hugging Face "rotate half" layout).

Angles are computed from the positions given, in fp32, so that a rank holding a strided or
zigzag slice of a sequence rotates each token by its global position.
"""

from __future__ import annotations

import torch


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for each position: (S,) or (B, S) -> (S, head_dim/2) or (B, S, head_dim/2), fp32."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)  # (head_dim / 2,)
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
