"""One path from a video to its codes, for every command that needs them (lwm-tokenize, lwm-generate,
video QA; the datamodule reads the same cache through lwm.data.code_cache):

    source = CodeSource(fps=1.0, max_frames=64, cache="codes/", vqgan=lambda: load_vqgan(...))
    got = source.codes(path="clip.mp4")          # got.codes (T, 256), got.timestamps (T,), got.origin
    codes = video_codes("clip.mp4", vqgan, fps=1.0)   # no cache: decoded and encoded

Frames are chosen by lwm.data.sampling's rule, over the decoded video's frame times or over the
timestamps the cache recorded, so both give the same frames. The cache (an lwm-tokenize folder) is
consulted first, by the video's id; a video not in it is decoded forward in chunks and encoded chunk
by chunk, so memory holds one chunk of frames however long the video.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lwm.data.code_cache import CodeStore, check_range, out_of_range
from lwm.data.form import is_image
from lwm.data.sampling import Sampling
from lwm.video.image import encode_image
from lwm.video.reader import Plan, Video


def video_id(path: str, scheme: str = "hashed") -> str:
    """How lwm-tokenize names a video's codes. hashed: the file stem (for people) + a hash of the absolute
    path (collision-free, but tied to where the data lies); stem: the file stem alone, what example files
    usually refer to."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(path).stem)[:80] or "video"
    if scheme == "stem":
        return stem
    return f"{stem}-{hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:10]}"


@torch.no_grad()
def encode_video(
    path, vqgan, sampling: Sampling, batch_size: int = 16, dtype=np.int64, progress=None
) -> tuple[np.ndarray, np.ndarray, Video]:
    """Codes (T, 256) of the frames `sampling` takes, decoded and encoded `batch_size` frames at a time;
    also their timestamps (T,) and the Video. progress: a tqdm bar counting frames, or None. Raises
    lwm.video.reader.VideoError for a missing or unreadable file."""
    video = Video(path, vqgan.config.resolution)
    plan = video.plan(sampling)
    # a rate above the video's holds frames (an index repeats): each distinct frame is decoded and encoded
    # once and its copies take its codes, the same as at the video's own rate, not a near tie broken apart
    # by batch position
    _, first, copies = np.unique(plan.indices, return_index=True, return_inverse=True)
    distinct = Plan(plan.indices[first], plan.timestamps[first])
    planned = np.cumsum(np.bincount(copies))  # planned frames up to each distinct one, for the progress bar
    if progress is not None:
        progress.total += len(plan)
        progress.refresh()
    device = next(vqgan.parameters()).device
    codes = np.empty((len(distinct), vqgan.config.tokens_per_frame), dtype)
    done = counted = 0
    try:
        for frames, _ in video.chunks(distinct, chunk_size=batch_size):
            # (t, r, r, 3) uint8 -> (t, 256) long
            codes[done : done + len(frames)] = (
                vqgan.encode(torch.from_numpy(frames).to(device), batch_size=batch_size).cpu().numpy()
            )
            done += len(frames)
            if progress is not None:
                progress.update(int(planned[done - 1]) - counted)
            counted = int(planned[done - 1])
    finally:
        if progress is not None and counted < len(plan):
            progress.total -= len(plan) - counted
    return codes[copies], plan.timestamps, video


def encode_media(
    path, vqgan, sampling: Sampling, batch_size: int = 16, dtype=np.int64, progress=None
) -> tuple[np.ndarray, np.ndarray, object]:
    """encode_video's result for a video, or encode_image's for an image (a one-frame video: the sampling does
    not apply), counted on the progress bar alike."""
    if not is_image(path):
        return encode_video(path, vqgan, sampling, batch_size, dtype, progress)
    got = encode_image(path, vqgan, dtype)
    if progress is not None:
        progress.total += 1
        progress.update(1)
    return got


def video_codes(path, vqgan, fps: float | None = 1.0, max_frames: int | None = None, batch_size: int = 16):
    """(T, 256) int64 codes of a video read at `fps`, at most `max_frames` of those spread evenly."""
    return encode_video(path, vqgan, Sampling(fps=fps, max_frames=max_frames), batch_size)[0]


@dataclass
class VideoCodes:
    codes: np.ndarray  # (T, 256) int64
    timestamps: np.ndarray | None  # (T,) seconds; None from a cache whose manifest has none
    origin: str  # "cache" or "video"
    cache_id: str | None  # the video's id in the cache
    duration: float | None  # the video's length in seconds, when known


class CodeSource:
    """Codes of videos sampled one way (by rate, count or both): from an lwm-tokenize cache when it holds
    the video, else the file decoded and encoded with the VQGAN. vqgan: a VQGAN, or a function that
    loads one (called at the first video not in the cache); ids: the cache's naming schemes to try;
    n_codes: the model's vision codes (its vocabulary's), given: codes outside [0, n_codes) are refused
    naming the codes file (CodesError) or the video and the VQGAN (ValueError)."""

    def __init__(
        self,
        fps: float | None = 1.0,
        max_frames: int | None = None,
        cache: CodeStore | str | os.PathLike | None = None,
        vqgan=None,
        ids: tuple[str, ...] = ("hashed", "stem"),
        batch_size: int = 16,
        n_codes: int | None = None,
    ):
        self.sampling = Sampling(fps=fps, max_frames=max_frames)
        self.store = cache if isinstance(cache, CodeStore) or cache is None else CodeStore(cache, n_codes)
        self.n_codes = n_codes
        self.ids, self.batch_size = ids, batch_size
        self._vqgan = vqgan

    def cache_id(self, path=None, key: str | None = None) -> str | None:
        """The id the cache holds the video under (of the file's, in each naming scheme, then `key`), or None."""
        if self.store is None:
            return None
        candidates = [video_id(str(path), s) for s in self.ids] if path is not None else []
        candidates += [key] if key is not None else []
        return next((c for c in candidates if self.store.path(c).is_file()), None)

    def from_cache(self, cid: str) -> VideoCodes:
        """Raises FileNotFoundError or ValueError (lwm.data.code_cache.CodesError among them) naming the file."""
        codes, stamps = self.store.sample(cid, self.sampling.max_frames, self.sampling.fps)
        if self.n_codes is not None and self.store.n_codes is None:  # a store the caller built
            check_range(codes, self.n_codes, self.store.path(cid))
        seconds = (self.store.meta.get(cid, {}).get("video") or {}).get("duration")
        return VideoCodes(codes, stamps, "cache", cid, seconds)

    def vqgan(self):
        if not isinstance(self._vqgan, torch.nn.Module):
            if self._vqgan is None:
                raise ValueError("the video is not in the code cache and no VQGAN was given to encode it")
            self._vqgan = self._vqgan()
        return self._vqgan

    def from_video(self, path) -> VideoCodes:
        """Raises VideoError for a missing or unreadable file, ValueError for codes the model cannot read. An
        image (lwm.data.form.IMAGE_EXTENSIONS) is a one-frame video, as lwm-tokenize reads it."""
        codes, stamps, video = encode_media(path, self.vqgan(), self.sampling, self.batch_size)
        if self.n_codes is not None:
            problem = out_of_range(codes, self.n_codes)
            if problem:  # no codes file's fault: the VQGAN does not match the model
                raise ValueError(f"the VQGAN's codes of {path} {problem}: the VQGAN is not the model's")
        return VideoCodes(codes, stamps, "video", None, video.duration)

    def codes(self, path=None, key: str | None = None) -> VideoCodes:
        """The video's codes: from the cache when it holds the file (or `key`), else from the file."""
        cid = self.cache_id(path, key)
        if cid is None and path is None:
            if self.store is None or key is None:
                raise ValueError("no video file, and no code cache and id to find its codes")
            cid = key  # not in the cache: from_cache's error says where it looked
        return self.from_cache(cid) if cid is not None else self.from_video(path)
