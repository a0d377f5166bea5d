"""The learning-rate factor both training runs hand to LambdaLR: linear warm-up, then constant or
cosine. Each caller says how far along its decay is (`progress`); the LM counts the steps after
warm-up, the VQGAN its step or time budget."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine")


def lr_factor(step: int, *, warmup_steps: int, schedule: str, min_lr_ratio: float, progress: float) -> float:
    """Factor of the base LR at `step`: (step + 1) / warmup_steps during warm-up (1 without), times
    1 ('constant') or a cosine from 1 at progress 0 down to min_lr_ratio at progress 1 ('cosine')."""
    warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0
    if schedule == "constant":
        return warm
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return warm * (min_lr_ratio + (1 - min_lr_ratio) * cosine)
