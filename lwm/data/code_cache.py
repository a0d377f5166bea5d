"""Cached video codes written by the tokenization command (lwm-tokenize):

    DIR/tokens/<id>.npy      uint16 (T, 256)
    DIR/manifest*.jsonl      one JSON object per video: {"id", "timestamps", "sha256", ...}

A CodeStore loads a video's codes by id, optionally subsampled by rate, count or both with the rule
decoded videos are sampled by (lwm.data.sampling), over the timestamps the manifest recorded, so a
video's cached codes and the video read again at the same rate give the same frames. Code files come from anywhere (a
download, a shared disk), so nothing in them is trusted: an id names a file inside tokens/ only (no
path, `..` or symlink out of it), and a file must be a whole .npy of an integer dtype with
TOKENS_PER_FRAME codes a frame, or a CodesError names it and says what it holds instead. A manifest
record's "sha256" (of the file's bytes, recorded by whoever wrote the file: lwm-tokenize, the synthetic
data makers, through save_codes) is checked each time the file is read, so a file changed since is
refused naming it; a record without one (a manifest from before checksums) is read unverified. Given
n_codes (the vocabulary's vision codes), codes outside [0, n_codes) are refused naming the file too.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.lib.format import open_memmap

from lwm.data.sampling import Sampling, SamplingError, frame_indices, uniform_indices
from lwm.data.vocab import TOKENS_PER_FRAME
from lwm.io import records


class CodesError(ValueError):
    """A video id or a cached codes file that cannot be used; the message names the file."""


_SHA256 = re.compile(r"[0-9a-f]{64}")


class _Hashed:
    """A binary file whose written bytes are hashed on the way."""

    def __init__(self, f: BinaryIO):
        self.f, self.sha256 = f, hashlib.sha256()

    def write(self, data) -> int:
        self.sha256.update(data)
        return self.f.write(data)


def save_codes(f: BinaryIO, codes: np.ndarray) -> str:
    """Write codes (T, 256) as a .npy to the open binary file f -> the sha256 (hex) of the bytes written,
    what the file's manifest record holds as "sha256". Every writer of a codes file writes through this."""
    hashed = _Hashed(f)
    np.save(hashed, codes)
    return hashed.sha256.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()  # read in pieces (hashlib.file_digest is Python 3.11+; 3.10 is supported)
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


class CodeStore:
    """The codes of an lwm-tokenize folder by video id. n_codes: the vocabulary's vision codes; given, a
    video's codes outside [0, n_codes) raise CodesError naming the file (None: the caller checks)."""

    def __init__(self, root: str | Path, n_codes: int | None = None):
        self.root = Path(root)
        self.n_codes = n_codes
        if not (self.root / "tokens").is_dir():
            raise FileNotFoundError(f"{self.root} has no tokens/ folder; expected the output of lwm-tokenize")
        self.meta: dict[str, dict] = {}
        self.where: dict[str, str] = {}  # id -> "manifest:line" of the record that counts (the last)
        self.by_source: dict[str, str] = {}  # the absolute path lwm-tokenize read (its "source") -> id
        # files already verified, by (size, mtime): a video sampled every epoch is hashed once, not each time
        self._verified: dict[Path, tuple[int, int]] = {}
        for manifest in sorted(self.root.glob("manifest*.jsonl")):
            # a line a killed lwm-tokenize cut short is skipped: its video was never finished
            for n, entry in records(manifest):
                if not isinstance(entry, dict) or "id" not in entry:
                    raise ValueError(f'{manifest}:{n}: a manifest record is a JSON object with an "id"')
                self.meta[entry["id"]] = entry
                self.where[entry["id"]] = f"{manifest}:{n}"
                if isinstance(entry.get("source"), str):
                    self.by_source[entry["source"]] = entry["id"]

    def id_of(self, path: str) -> str:
        """The id of the codes lwm-tokenize made from the media file at `path` (absolute); CodesError naming
        the file when this store has none."""
        found = self.by_source.get(path)
        if found is None:
            raise CodesError(
                f"{path} has no codes in {self.root}: tokenize it first (lwm-tokenize --out {self.root} with the "
                "file, its folder, or --source naming the data source)"
            )
        return found

    def verify(self, video_id: str, path: Path) -> None:
        """Raises CodesError naming the file when its bytes are not those the manifest's "sha256" records;
        a record without one (written before checksums) is not checked."""
        recorded = self.meta.get(video_id, {}).get("sha256")
        if recorded is None:
            return
        where = self.where[video_id]
        if not isinstance(recorded, str) or not _SHA256.fullmatch(recorded):
            raise CodesError(
                f"{where}: the record of video {video_id!r} has sha256 {recorded!r}; expected 64 hex digits "
                f"(the checksum of {path})"
            )
        stat = path.stat()
        if self._verified.get(path) == (stat.st_size, stat.st_mtime_ns):
            return
        actual = file_sha256(path)
        if actual != recorded:
            raise CodesError(
                f"cached codes {path} are not the file lwm-tokenize wrote: their sha256 is {actual[:16]}..., "
                f"the manifest ({where}) records {recorded[:16]}... (the file was changed or corrupted since); "
                "delete the file and rerun lwm-tokenize with the same --out to make it again"
            )
        self._verified[path] = (stat.st_size, stat.st_mtime_ns)

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

    def frames(self, video_id: str, n_frames: int, max_frames: int | None = None, fps: float | None = None):
        """(indices (T,) of the cached frames the sampling takes, their timestamps (T,) or None when the
        manifest has none). By rate the ticks run over the clip lwm-tokenize cut (its start and end, else
        the video's duration, else the last frame lasts a typical interval)."""
        meta = self.meta.get(video_id, {})
        stamps = meta.get("timestamps")
        if n_frames == 1 and (meta.get("video") or {}).get("num_frames") == 1:  # an image: its one frame at any rate
            return np.zeros(1, np.int64), None if stamps is None else np.asarray(stamps[:1], np.float64)
        stamps = np.asarray(stamps, dtype=np.float64) if stamps is not None and len(stamps) == n_frames else None
        if fps is None:  # by count or all: every cached frame is in the clip
            indices = np.arange(n_frames) if max_frames is None else uniform_indices(n_frames, max_frames)
            return indices, None if stamps is None else stamps[indices]
        if stamps is None:
            raise ValueError(
                f"video {video_id!r} has no timestamps for its {n_frames} frames in the manifest; cannot sample by rate"
            )
        cut = meta.get("sampling") or {}
        if cut.get("fps") is None and cut.get("max_frames") is not None or (cut.get("fps") or fps) < fps - 1e-9:
            # the frames between the cached ones are not there: repeating cached frames would pass for them
            raise ValueError(
                f"video {video_id!r} was tokenized with {_sampling_text(cut)}; its cached codes cannot be sampled "
                f"at {fps:g} fps (the frames between them are not there): sample by count (max_frames) or at a rate up to "
                f"the cache's, or tokenize again with --fps {fps:g}"
            )
        end = cut.get("end") or (meta.get("video") or {}).get("duration") or _last_frame_end(stamps, fps)
        try:
            sampling = Sampling(fps=fps, max_frames=max_frames, start=cut.get("start"))
            indices = frame_indices(stamps, float(end), sampling)
        except (SamplingError, ValueError, TypeError) as e:
            raise ValueError(f"video {video_id!r} in {self.root}: {e}") from None
        return indices, stamps[indices]

    def sample(self, video_id: str, max_frames: int | None = None, fps: float | None = None):
        """(codes (T, 256) int64, their timestamps (T,) or None) of one video, subsampled by rate, count or
        both (lwm.data.sampling)."""
        path = self.path(video_id)
        if not path.is_file():
            raise FileNotFoundError(f"no cached codes for video {video_id!r} (expected {path})")
        self.verify(video_id, path)
        codes = read_codes(path)
        indices, stamps = self.frames(video_id, codes.shape[0], max_frames, fps)
        kept = np.array(codes[indices], dtype=np.int64)  # a copy in memory: only the frames kept are read
        if self.n_codes is not None:
            check_range(kept, self.n_codes, path)
        return kept, stamps

    def load(self, video_id: str, max_frames: int | None = None, fps: float | None = None) -> np.ndarray:
        """(T, 256) int64 codes of one video, subsampled by rate, count or both (lwm.data.sampling)."""
        return self.sample(video_id, max_frames, fps)[0]


def _sampling_text(cut: dict) -> str:
    return ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in cut.items() if v is not None)


def _last_frame_end(stamps: np.ndarray, fps: float) -> float:
    """When the manifest does not say how long the video is: its last frame lasts the median interval
    (one tick for a lone frame)."""
    step = float(np.median(np.diff(stamps))) if len(stamps) > 1 else 1.0 / fps
    return float(stamps[-1]) + (step if step > 0 else 1.0 / fps)


def out_of_range(codes: np.ndarray, n_codes: int) -> str | None:
    """What is wrong with codes outside [0, n_codes) (the vocabulary's vision codes), or None."""
    if codes.size and (codes.min() < 0 or codes.max() >= n_codes):
        return f"hold codes in [{codes.min()}, {codes.max()}]; the model's vocabulary has {n_codes} vision codes [0, {n_codes})"
    return None


def check_range(codes: np.ndarray, n_codes: int, path: Path) -> None:
    """Raises CodesError naming the codes file `path` when its codes lie outside [0, n_codes)."""
    problem = out_of_range(codes, n_codes)
    if problem:
        raise CodesError(
            f"cached codes {path} {problem}: they were made by a VQGAN with more codes than the model's, or are "
            "corrupted; tokenize the video again with the model's VQGAN"
        )


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
