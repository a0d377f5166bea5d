"""Cached video codes written by the tokenization command (lwm-tokenize):

    DIR/tokens/<id>.npy      uint16 (T, 256)
    DIR/manifest*.jsonl      one JSON object per video: {"id", "timestamps", ...}

A CodeStore loads a video's codes by id, optionally subsampled to a frame count (uniform over
the clip, as LWM does) or a rate (by the recorded timestamps).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lwm.io import records


def uniform_indices(n_frames: int, count: int) -> np.ndarray:
    """`count` frame indices spread evenly over [0, n_frames), first and last included."""
    if count >= n_frames:
        return np.arange(n_frames)
    return np.linspace(0, n_frames - 1, count).round().astype(np.int64)


def rate_indices(timestamps: np.ndarray, fps: float) -> np.ndarray:
    """Indices of frames at least 1/fps seconds apart, starting with the first."""
    keep, next_t = [], -np.inf
    for i, t in enumerate(timestamps):
        if t >= next_t - 1e-6:
            keep.append(i)
            next_t = t + 1.0 / fps
    return np.asarray(keep, dtype=np.int64)


class CodeStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        if not (self.root / "tokens").is_dir():
            raise FileNotFoundError(f"{self.root} has no tokens/ folder; expected the output of lwm-tokenize")
        self.meta: dict[str, dict] = {}
        for manifest in sorted(self.root.glob("manifest*.jsonl")):
            # a line a killed lwm-tokenize cut short is skipped: its video was never finished
            for n, entry in records(manifest):
                if not isinstance(entry, dict) or "id" not in entry:
                    raise ValueError(f'{manifest}:{n}: a manifest record is a JSON object with an "id"')
                self.meta[entry["id"]] = entry

    def path(self, video_id: str) -> Path:
        return self.root / "tokens" / f"{video_id}.npy"

    def load(self, video_id: str, max_frames: int | None = None, fps: float | None = None) -> np.ndarray:
        """(T, 256) int64 codes of one video, subsampled by count or by rate."""
        path = self.path(video_id)
        if not path.is_file():
            raise FileNotFoundError(f"no cached codes for video {video_id!r} (expected {path})")
        codes = np.load(path)
        if codes.ndim != 2 or codes.shape[0] == 0:
            raise ValueError(f"cached codes {path} have shape {codes.shape}; expected (frames > 0, 256)")
        if fps is not None:
            stamps = self.meta.get(video_id, {}).get("timestamps")
            if stamps is None or len(stamps) != codes.shape[0]:
                raise ValueError(
                    f"video {video_id!r} has no timestamps for its {codes.shape[0]} frames in the manifest; cannot sample by rate"
                )
            codes = codes[rate_indices(np.asarray(stamps, dtype=np.float64), fps)]
        if max_frames is not None:
            codes = codes[uniform_indices(codes.shape[0], max_frames)]
        return codes.astype(np.int64)
