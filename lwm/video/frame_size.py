"""The frames' sizes: what decord and PyAV scale decoded frames to, and the center crop (and, rarely, a resize) to
a `resolution` square. decord 0.6 mis-shapes frames of some widths, so the decode size may be wider than asked and
the crop then resizes the rest of the way (with torch)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


def safe_width(width: int) -> bool:
    # decord 0.6 returns wrongly shaped frames (and get_batch fails) when ffmpeg pads a row and the padded
    # row length is a multiple of the width (e.g. widths 8, 16, 24, 48, 72). Rows are padded to a multiple
    # of at most 64 pixels, so widths that are multiples of 64, or at least 3 * 64, are never affected.
    return width % 64 == 0 or width >= 192


def decode_size(height: int, width: int, resolution: int) -> tuple[int, int]:
    """(height, width) for decord to scale frames to: short side `resolution` (or a bit more, to keep the width safe)."""
    scale = resolution / min(height, width)
    out_w = max(resolution, round(width * scale))
    if not safe_width(out_w):
        out_w = 64 * math.ceil(out_w / 64)
        scale = out_w / width
    out_h = max(resolution, round(height * scale))
    return out_h, out_w


def center_square(height: int, width: int) -> tuple[int, int, int]:
    """(top, left, side) of the largest square centered in a height x width frame."""
    side = min(height, width)
    return (height - side) // 2, (width - side) // 2, side


def crop_resize(frames: np.ndarray, resolution: int) -> np.ndarray:
    """Center-crop (t, h, w, 3) uint8 frames to a square and resize it to (t, resolution, resolution, 3) uint8."""
    t, h, w, _ = frames.shape
    top, left, side = center_square(h, w)
    frames = frames[:, top : top + side, left : left + side]  # (t, side, side, 3), side >= resolution
    if side == resolution:
        return np.ascontiguousarray(frames)
    # Only when the decode width was widened for decord (small frames): a mild downscale.
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()  # (t, 3, side, side)
    x = F.interpolate(x, size=(resolution, resolution), mode="bilinear", antialias=True, align_corners=False)
    return x.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()  # (t, r, r, 3)
