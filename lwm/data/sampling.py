"""The one rule for which frames of a video are used, as a function of frame times alone, so decoded
videos (lwm.video) and cached codes (lwm.data.code_cache: the timestamps lwm-tokenize recorded) are sampled
alike, and a model is trained and evaluated on the same frames.

By rate (`fps`): at each time start + k / fps, the frame on screen then (the last one that started at
or before it); T = floor((end - start) * fps), and a frame held longer than 1 / fps is taken once per
tick. By count (`max_frames`): that many frames spread uniformly over the candidates (first and last
included, all of them if there are fewer), as LWM does; the candidates are the rate's frames when
both are given, else every frame shown in [start, end). Neither: every frame shown in [start, end).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

# Slack for comparing times computed in float32 (decord's timestamps) with times given by a user.
TIME_EPS = 1e-4


class SamplingError(ValueError):
    """A clip that the sampling cannot take frames from; the caller adds which video."""


@dataclass(frozen=True)
class Sampling:
    """Which frames to take: by rate (`fps`), by count (`max_frames`) or both (the rate's frames, at most
    max_frames of them), optionally within [start, end) seconds; neither: every frame."""

    fps: float | None = None
    max_frames: int | None = None
    start: float | None = None
    end: float | None = None

    def __post_init__(self) -> None:
        if self.fps is not None and not (
            isinstance(self.fps, (int, float)) and math.isfinite(self.fps) and self.fps > 0
        ):
            raise ValueError(f"fps must be a positive number, got {self.fps!r}")
        if self.max_frames is not None and (
            isinstance(self.max_frames, bool) or not isinstance(self.max_frames, int) or self.max_frames <= 0
        ):
            raise ValueError(f"max_frames must be a positive integer, got {self.max_frames!r}")
        for name in ("start", "end"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a time in seconds >= 0, got {value!r}")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ValueError(f"end {self.end} s must be after start {self.start} s")

    def to_dict(self) -> dict:
        return asdict(self)


def uniform_indices(n_frames: int, count: int) -> np.ndarray:
    """`count` indices spread evenly over [0, n_frames), first and last included (all if fewer)."""
    if count >= n_frames:
        return np.arange(n_frames)
    return np.linspace(0, n_frames - 1, count).round().astype(np.int64)


def frame_indices(starts: np.ndarray, end: float, sampling: Sampling) -> np.ndarray:
    """Indices (T,) int64, non-decreasing, of the frames `sampling` takes from frames starting at `starts`
    (N,) seconds, non-decreasing, the last one shown until `end`. Raises SamplingError."""
    starts = np.asarray(starts, dtype=np.float64)
    clip_start = float(starts[0]) if sampling.start is None else float(sampling.start)
    clip_end = end if sampling.end is None else float(sampling.end)
    if clip_start >= end - TIME_EPS:
        raise SamplingError(f"start {clip_start:g} s is not inside the clip (0 to {end:.3f} s)")
    if clip_end > end + TIME_EPS:
        raise SamplingError(f"end {clip_end:g} s is past the end of the clip ({end:.3f} s)")
    if sampling.fps is not None:
        interval = 1.0 / sampling.fps
        count = math.floor((clip_end - clip_start) * sampling.fps + TIME_EPS)
        if count < 1:
            raise SamplingError(
                f"the clip from {clip_start:.3f} s to {clip_end:.3f} s ({clip_end - clip_start:.3f} s) is shorter "
                f"than one sampling interval ({interval:g} s at fps {sampling.fps:g})"
            )
        ticks = clip_start + np.arange(count) * interval
        # The frame on screen at each tick: the last one that started at or before it.
        indices = np.clip(np.searchsorted(starts, ticks + TIME_EPS, side="right") - 1, 0, len(starts) - 1)
    else:
        # Frames shown at some moment of [start, end).
        shown_until = np.append(starts[1:], end)
        indices = np.flatnonzero((starts < clip_end - TIME_EPS) & (shown_until > clip_start + TIME_EPS))
        if len(indices) == 0:
            raise SamplingError(f"no frame is shown between {clip_start:.3f} s and {clip_end:.3f} s")
    if sampling.max_frames is not None:
        indices = indices[uniform_indices(len(indices), sampling.max_frames)]
    return indices.astype(np.int64)
