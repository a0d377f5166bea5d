"""Rotary position embedding (LLaMA / Hugging Face "rotate half" layout).

Angles are computed from the positions given, in fp32, so that a rank holding a strided or
zigzag slice of a sequence rotates each token by its global position.
"""

from __future__ import annotations

import torch


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for each position: (S,) or (B, S) -> (S, head_dim) or (B, S, head_dim), fp32."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)  # (head_dim / 2,)
    freqs = positions.float().unsqueeze(-1) * inv_freq  # (..., S, head_dim / 2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (..., S, head_dim)
    return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, S, D) in fp32 by cos/sin of shape (S, D) or (B, S, D); returns x's dtype."""
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, S, D) -> (B, 1, S, D)
    xf = x.float()
    return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)
