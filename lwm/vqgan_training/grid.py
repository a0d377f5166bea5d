"""A reconstruction grid: original frames in the top row, their reconstructions below, as a PNG. It is
the frames' own pixels side by side, not a plot, so Pillow writes it (matplotlib would resample them)."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from lwm.vision.vqgan import to_uint8


def recon_grid(originals: torch.Tensor, recons: torch.Tensor) -> Image.Image:
    """originals, recons (n, 3, H, W) in [-1, 1] -> an image (2H tall, nW wide): originals above, reconstructions below."""
    if originals.shape != recons.shape or originals.dim() != 4 or originals.shape[1] != 3:
        raise ValueError(
            f"originals and recons must both be (n, 3, H, W), got {tuple(originals.shape)} and {tuple(recons.shape)}"
        )
    n, _, h, w = originals.shape
    rows = torch.stack([to_uint8(originals), to_uint8(recons)])  # (2, n, H, W, 3)
    grid = rows.permute(0, 2, 1, 3, 4).reshape(2 * h, n * w, 3)  # (2, H, n, W, 3) -> (2H, nW, 3)
    return Image.fromarray(grid.numpy())


def save_grid(originals: torch.Tensor, recons: torch.Tensor, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recon_grid(originals, recons).save(path)
    return path
