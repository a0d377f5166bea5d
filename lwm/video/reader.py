"""Reading videos with decord and PyAV: sample frames by rate or count, resize and center-crop, stream in chunks.

    frames, timestamps = read_video("clip.mp4", fps=1.0, resolution=256)      # (T, 256, 256, 3) uint8, (T,) s
    for frames, timestamps in stream_video("hour.mp4", fps=1.0, chunk_size=32):
        ...                                                                    # at most 32 frames decoded at once

Times are the frames' own presentation timestamps (decord's `get_frame_timestamp`), so variable
frame rate videos are sampled at the right moments. Which frames: lwm.data.sampling's rule (by rate,
the frame on screen at each tick start + k / fps, held frames repeating; by count, `max_frames`
spread uniformly, as LWM does; or both), the one cached codes are sampled by too.

decord indexes the file and decodes the frames `read` asks for (random access); `Video.chunks` and
`stream_video` decode forward through the file with PyAV instead (forward.py), so memory holds one chunk
of frames however long the video. Sizes and the crop: frame_size.py. decord's native log lines are kept
off stderr (native_quiet.py): what goes wrong comes back as a VideoError with a short message.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from lwm.data.sampling import Sampling, SamplingError, frame_indices
from lwm.video.errors import VideoError
from lwm.video.forward import ForwardDecoder
from lwm.video.frame_size import center_square, crop_resize, decode_size
from lwm.video.native_quiet import NativeQuiet


@dataclass(frozen=True)
class Plan:
    """The frames a sampling picks from one video: decord frame indices and their timestamps in seconds."""

    indices: np.ndarray  # (T,) int64, non-decreasing (a held frame may repeat when sampling by rate)
    timestamps: np.ndarray  # (T,) float64

    def __len__(self) -> int:
        return len(self.indices)


def _decord():
    try:
        import decord
    except ImportError as e:  # decord has no aarch64 wheel: PyAV reads instead
        raise ImportError("reading videos needs decord (pip install decord; x86-64 only)") from e
    # Its ffmpeg's messages would land in the callers' progress bars and repeat what our errors say; also those of
    # its decoder thread, which runs on after a call returns. Process-wide, for decord's copy of ffmpeg only (PyAV
    # keeps ffmpeg's log off unless told otherwise).
    decord.logging.set_level(decord.logging.QUIET)
    return decord


def _short(error: BaseException) -> str:
    """decord's messages start with '[time] /path/file.cc:123: ', once or more (a check failed in its decoder thread,
    rethrown), and may carry a stack trace; keep the gist."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"^(\[[\d:]+\] \S+:\d+: )+", "", text)


class Video:
    """One video file opened with decord: its frame count, size, timestamps; sampling plans; decoded frames.

    Frames come back resized so the short side is `resolution` and center-cropped to a square; the decoder's
    ffmpeg filters scale them while decoding, so a chunk of frames never exists at the source resolution.
    """

    def __init__(self, path: str | os.PathLike, resolution: int = 256):
        if not isinstance(resolution, int) or resolution <= 0:
            raise ValueError(f"resolution must be a positive integer, got {resolution!r}")
        self.path = str(path)
        self.resolution = resolution
        if not os.path.exists(self.path):
            raise VideoError(f"{self.path}: no such file")
        if not os.path.isfile(self.path):
            raise VideoError(f"{self.path}: not a file")
        if os.path.getsize(self.path) == 0:
            raise VideoError(f"{self.path}: empty file (0 bytes)")
        decord = _decord()

        with NativeQuiet():
            probe = self._open(decord)
            self.num_frames = len(probe)
            try:
                # Decoding one frame tells the size after rotation; in decord 0.6 the (height, width) of the
                # returned array are right even where its channel count is not (see _safe_width).
                self.height, self.width = probe[0].shape[:2]
                times = probe.get_frame_timestamp(
                    np.arange(self.num_frames)
                )  # (N, 2) start, end; a slice would decode all
                avg_fps = float(probe.get_avg_fps())
                keys = np.asarray(probe.get_key_indices(), dtype=np.int64)
            except Exception as e:
                raise VideoError(f"{self.path}: cannot decode (corrupt or truncated file?): {_short(e)}") from e
            del probe
        self.starts, self.duration, self._timed = self._frame_times(np.asarray(times, dtype=np.float64), avg_fps)
        self.key_indices = (
            keys if len(keys) and keys[0] == 0 else np.append(0, keys)
        )  # the first frame starts an interval

        self.decode_size = decode_size(self.height, self.width, resolution)
        self._reader = None  # decord's scaling reader, opened by the first read()

    def _open(self, decord, height: int = -1, width: int = -1):
        try:
            reader = decord.VideoReader(self.path, ctx=decord.cpu(0), width=width, height=height)
        except AssertionError as e:  # decord asserts a positive frame count
            raise VideoError(f"{self.path}: the video has no frames") from e
        except Exception as e:
            detail = _short(e)
            reason = (
                "no video stream, or no frames in it"
                if "video stream" in detail
                else ("not a video file, or corrupt or truncated (or no video frames)")
            )
            raise VideoError(f"{self.path}: cannot open as a video: {reason} (decord: {detail})") from e
        if len(reader) == 0:
            raise VideoError(f"{self.path}: the video has no frames")
        return reader

    def _frame_times(self, times: np.ndarray, avg_fps: float) -> tuple[np.ndarray, float, bool]:
        """Per-frame start times, the clip's end, and whether they are the frames' own timestamps (else they come
        from the index and the average rate, the timestamps being unusable)."""
        starts, ends = times[:, 0], times[:, 1]
        # decord gives a packet without a pts (AVI with packed B-frames) the time AV_NOPTS_VALUE * time base: -2^63
        # ticks, beyond 1e9 s (30 years) for any time base coarser than a nanosecond.
        plausible = np.isfinite(times).all() and (np.abs(times) < 1e9).all()
        if plausible and (np.diff(starts) >= 0).all() and (len(starts) == 1 or starts[-1] > starts[0]):
            # The last frame lasts until its end time, or one typical frame interval if the container has none.
            step = np.median(np.diff(starts)) if len(starts) > 1 else (1 / avg_fps if avg_fps > 0 else 0.0)
            end = ends[-1] if ends[-1] > starts[-1] else starts[-1] + step
            return starts, float(end), True
        if not (math.isfinite(avg_fps) and avg_fps > 0):
            raise VideoError(f"{self.path}: the video has neither usable frame timestamps nor a frame rate")
        starts = np.arange(self.num_frames, dtype=np.float64) / avg_fps
        return starts, self.num_frames / avg_fps, False

    # ------------------------------------------------------------------------------------ sampling

    def plan(self, sampling: Sampling) -> Plan:
        """The frames `sampling` takes (lwm.data.sampling's rule over the frames' start times)."""
        try:
            indices = frame_indices(self.starts, self.duration, sampling)
        except SamplingError as e:
            raise VideoError(f"{self.path}: {e}") from None
        return Plan(indices=indices, timestamps=self.starts[indices].astype(np.float64))

    # ------------------------------------------------------------------------------------ decoding

    def read(self, indices: np.ndarray) -> np.ndarray:
        """Decode the frames at `indices`: (len(indices), resolution, resolution, 3) uint8."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) == 0:
            return np.empty((0, self.resolution, self.resolution, 3), np.uint8)
        with NativeQuiet():
            if self._reader is None:
                self._reader = self._open(_decord(), *self.decode_size)
            try:
                frames = self._reader.get_batch(indices).asnumpy()  # (t, Hd, Wd, 3)
            except Exception as e:
                raise VideoError(
                    f"{self.path}: decoding frames {indices[0]}..{indices[-1]} failed (corrupt or truncated file?): {_short(e)}"
                ) from e
        if frames.shape[1:] != (*self.decode_size, 3):
            raise VideoError(
                f"{self.path}: decord returned frames of shape {frames.shape[1:]}, expected {(*self.decode_size, 3)}"
            )
        return self._crop_resize(frames)

    def chunks(self, plan: Plan, chunk_size: int = 32) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (frames, timestamps) of at most `chunk_size` frames, decoding forward through the file once
        (`_decode_forward`); only one chunk of frames is held at a time. The frames are those `read` returns."""
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        top, left, side = center_square(*self.decode_size)
        frames = self._decode_forward(plan.indices)
        for i in range(0, len(plan), chunk_size):
            chunk = np.empty((min(chunk_size, len(plan) - i), side, side, 3), np.uint8)
            for j in range(len(chunk)):
                chunk[j] = next(frames)[top : top + side, left : left + side]  # (Hd, Wd, 3) -> (side, side, 3)
            yield self._crop_resize(chunk), plan.timestamps[i : i + chunk_size]  # square already: at most a resize

    def _decode_forward(self, indices: np.ndarray) -> Iterator[np.ndarray]:
        """One frame (Hd, Wd, 3) uint8 per entry of `indices` (non-decreasing), decoded forward with PyAV (see
        lwm.video.forward.ForwardDecoder.frames)."""
        return ForwardDecoder(self.path, self.starts, self.key_indices, self._timed, self.decode_size).frames(indices)

    def _crop_resize(self, frames: np.ndarray) -> np.ndarray:
        return crop_resize(frames, self.resolution)


def default_rate(fps=None, max_frames=None, start=None, end=None) -> Sampling:
    """The sampling asked for, at 1 fps when neither a rate nor a count is given (the commands' default)."""
    return Sampling(fps=1.0 if fps is None and max_frames is None else fps, max_frames=max_frames, start=start, end=end)


def read_video(
    path: str | os.PathLike,
    *,
    fps: float | None = None,
    max_frames: int | None = None,
    start: float | None = None,
    end: float | None = None,
    resolution: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
    """Frames (T, resolution, resolution, 3) uint8 and their timestamps (T,) in seconds; fps 1.0 unless told."""
    video = Video(path, resolution)
    plan = video.plan(default_rate(fps, max_frames, start, end))
    return video.read(plan.indices), plan.timestamps


def stream_video(
    path: str | os.PathLike,
    *,
    fps: float | None = None,
    max_frames: int | None = None,
    start: float | None = None,
    end: float | None = None,
    resolution: int = 256,
    chunk_size: int = 32,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """read_video in chunks of at most `chunk_size` frames; memory stays bounded however long the video is.
    A generator: a bad file or sampling raises VideoError at the first next()."""
    video = Video(path, resolution)
    plan = video.plan(default_rate(fps, max_frames, start, end))
    yield from video.chunks(plan, chunk_size)
