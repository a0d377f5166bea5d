"""Cached video codes written by the tokenization command (lwm-tokenize):

    DIR/tokens/<id>.npy      uint16 (T, 256)
    DIR/manifest*.jsonl      one JSON object per video: {"id", "timestamps", ...}

A CodeStore loads a video's codes by id, optionally subsampled to a frame count (uniform over
the clip, as LWM does) or a rate (by the recorded timestamps). Code files come from anywhere (a
download, a shared disk), so nothing in them is trusted: an id names a file inside tokens/ only (no
path, `..` or symlink out of it), and a file must be a whole .npy of an integer dtype with
TOKENS_PER_FRAME codes a frame, or a CodesError names it and says what it holds instead.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.lib.format import open_memmap

from lwm.data.vocab import TOKENS_PER_FRAME
from lwm.io import records


class CodesError(ValueError):
    """A video id or a cached codes file that cannot be used; the message names the file."""


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
        """tokens/<id>.npy; an id that leads out of tokens/ (a path, `..`, a symlink) is refused."""
        tokens = self.root / "tokens"
        path = tokens / f"{video_id}.npy"
        if "\0" in video_id:
            raise CodesError(f"video id {video_id!r} holds a NUL byte; ids name files in {tokens}")
        try:  # resolve follows every symlink and `..`: where the bytes would really come from
            real = path.resolve()
        except (OSError, RuntimeError) as e:  # a symlink loop
            raise CodesError(f"video id {video_id!r}: cannot resolve {path}: {e}") from None
        if not real.is_relative_to(tokens.resolve()):
            raise CodesError(
                f"video id {video_id!r} names {real}, outside {tokens}; an id names a file in the "
                "code store's tokens/ folder, never a path out of it (absolute, '..' or a symlink)"
            )
        return path

    def load(self, video_id: str, max_frames: int | None = None, fps: float | None = None) -> np.ndarray:
        """(T, 256) int64 codes of one video, subsampled by count or by rate."""
        path = self.path(video_id)
        if not path.is_file():
            raise FileNotFoundError(f"no cached codes for video {video_id!r} (expected {path})")
        codes = read_codes(path)
        if fps is not None:
            stamps = self.meta.get(video_id, {}).get("timestamps")
            if stamps is None or len(stamps) != codes.shape[0]:
                raise ValueError(
                    f"video {video_id!r} has no timestamps for its {codes.shape[0]} frames in the manifest; cannot sample by rate"
                )
            codes = codes[rate_indices(np.asarray(stamps, dtype=np.float64), fps)]
        if max_frames is not None:
            codes = codes[uniform_indices(codes.shape[0], max_frames)]
        return np.array(codes, dtype=np.int64)  # a copy in memory: only the frames kept are read


def read_codes(path: Path) -> np.ndarray:
    """The (frames > 0, TOKENS_PER_FRAME) integer array of a codes file, mapped (read when used): a file
    that is not a whole .npy of that shape and an integer dtype raises CodesError naming it."""
    try:
        codes = open_memmap(path, mode="r")  # checks the header against the file's size: nothing is allocated
    except (ValueError, OSError) as e:
        raise CodesError(
            f"cached codes {path} are cut short or corrupted ({e}); delete the file and rerun lwm-tokenize "
            "with the same --out to make it again"
        ) from None
    if not np.issubdtype(codes.dtype, np.integer):
        raise CodesError(
            f"cached codes {path} are {codes.dtype}; expected an integer dtype (lwm-tokenize writes uint16)"
        )
    if codes.ndim != 2 or codes.shape[0] == 0 or codes.shape[1] != TOKENS_PER_FRAME:
        raise CodesError(
            f"cached codes {path} have shape {codes.shape}; expected (frames > 0, {TOKENS_PER_FRAME}): "
            f"a frame is {TOKENS_PER_FRAME} codes"
        )
    return codes
