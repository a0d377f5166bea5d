"""What a video of one shape shows, read from its frames: the shape's color, its kind and the way it moves, in
the words of lwm.synth.scene, so that a video generated for "a red circle moving left" (lwm.synth.make_t2v) can
be checked against its prompt.

    read_video(frames)   # frames (T, H, W, 3) uint8 -> Reading(color="red", shape="circle", motion="left")

Pixels brighter than the dark backgrounds the scenes are drawn on (any channel above BRIGHT) are the shape. Its
color is the palette color nearest their mean; its kind is how much of its bounding box it fills (a circle about
pi/4, a square all of it, a triangle half), the median over the frames; its motion is the way its center went
from the first frame to the last, "still" under MIN_SHIFT of the frame's width. A frame without such pixels
reads as nothing (None).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lwm.synth.scene import PALETTE

BRIGHT = 100  # the scenes' backgrounds are below 32 in every channel; every palette color has one above 200
MIN_SHIFT = 0.04
FILL = {"triangle": 0.5, "circle": np.pi / 4, "square": 1.0}  # of the bounding box


@dataclass(frozen=True)
class Reading:
    color: str
    shape: str
    motion: str

    def matches(self, color: str, shape: str, motion: str) -> dict[str, bool]:
        return {"color": self.color == color, "shape": self.shape == shape, "motion": self.motion == motion}


def read_video(frames: np.ndarray) -> Reading | None:
    """frames (T, H, W, 3) uint8 -> what they show, or None where a frame shows no shape."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
        raise ValueError(f"frames must be (T, H, W, 3) with T >= 1, got shape {frames.shape}")
    masks = frames.max(-1) > BRIGHT  # (T, H, W)
    if not masks.reshape(len(frames), -1).any(-1).all():
        return None
    mean = frames[masks].reshape(-1, 3).astype(np.float64).mean(0)
    color = min(PALETTE, key=lambda name: float(np.sum((np.asarray(PALETTE[name]) - mean) ** 2)))
    fills, centers = [], []
    for mask in masks:
        ys, xs = np.nonzero(mask)
        box = (ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1)
        fills.append(len(xs) / box)
        centers.append((xs.mean(), ys.mean()))
    fill = float(np.median(fills))
    shape = min(FILL, key=lambda name: abs(FILL[name] - fill))
    dx, dy = np.subtract(centers[-1], centers[0])
    if max(abs(dx), abs(dy)) < MIN_SHIFT * frames.shape[2]:
        motion = "still"
    elif abs(dx) >= abs(dy):
        motion = "left" if dx < 0 else "right"
    else:
        motion = "up" if dy < 0 else "down"
    return Reading(color, shape, motion)
