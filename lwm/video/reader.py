"""Reading videos with decord and PyAV: sample frames by rate or count, resize and center-crop, stream in chunks.

    frames, timestamps = read_video("clip.mp4", fps=1.0, resolution=256)      # (T, 256, 256, 3) uint8, (T,) s
    for frames, timestamps in stream_video("hour.mp4", fps=1.0, chunk_size=32):
        ...                                                                    # at most 32 frames decoded at once

Times are the frames' own presentation timestamps (decord's `get_frame_timestamp`), so variable
frame rate videos are sampled at the right moments. Which frames: lwm.data.sampling's rule (by rate,
the frame on screen at each tick start + k / fps, held frames repeating; by count, `max_frames`
spread uniformly, as LWM does; or both), the one cached codes are sampled by too.

decord indexes the file and decodes the frames `read` asks for (random access); `Video.chunks` and
`stream_video` decode forward through the file with PyAV instead, so memory holds one chunk of frames
however long the video (see `Video._decode_forward`). Both scale with the same ffmpeg filters, so
the frames are the same.

decord's and its ffmpeg's own log lines are kept off stderr (where the tools' progress bars are; see
`_NativeQuiet`): what goes wrong comes back as a VideoError with a short message.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from lwm.data.sampling import TIME_EPS, Sampling, SamplingError, frame_indices


class VideoError(Exception):
    """A video that cannot be read or sampled as asked; the message names the file and says why."""


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


# The native libraries' log lines: decord's C++ (dmlc) '[12:34:56] /path/file.cc:83: ...', ffmpeg's '[h264 @ 0x55d0] ...'.
_NATIVE_LINE = re.compile(rb"^\[[\d:]+\] \S+:\d+: |^\[[^\]]+ @ 0x[0-9a-fA-F]+\] ")


class _NativeQuiet:
    """With it, fd 2 points to a temporary file while decord runs: its C++ writes log lines ('ERROR opening: ...')
    straight to fd 2, past both ffmpeg's log level and sys.stderr, and its errors come back as exceptions anyway.
    Other lines that reach fd 2 meanwhile (another thread's) are written to stderr afterwards. Counted, so nested or
    concurrent uses share one redirect and the last one out restores fd 2."""

    _lock = threading.Lock()
    _depth = 0
    _saved: int | None = None
    _sink = None

    def __enter__(self) -> None:
        cls = type(self)
        with cls._lock:
            cls._depth += 1
            if cls._depth > 1:
                return
            sink = saved = None
            try:
                if sys.stderr is not None:
                    sys.stderr.flush()  # Python's pending text belongs before the redirect
                sink = tempfile.TemporaryFile()
                saved = os.dup(2)
                os.dup2(sink.fileno(), 2)
            except (OSError, ValueError):  # no usable fd 2 (closed): nothing to keep clean
                if saved is not None:
                    os.close(saved)
                if sink is not None:
                    sink.close()
                return
            cls._saved, cls._sink = saved, sink

    def __exit__(self, *exc) -> None:
        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth > 0 or cls._saved is None:
                return
            saved, sink, cls._saved, cls._sink = cls._saved, cls._sink, None, None
            os.dup2(saved, 2)
            os.close(saved)
            with sink:
                sink.seek(0)
                other = [line for line in sink.read().splitlines(keepends=True) if not _NATIVE_LINE.match(line)]
            if other:
                os.write(2, b"".join(other))


def _av():
    try:
        import av
    except ImportError as e:
        raise ImportError("streaming videos needs PyAV (pip install av)") from e
    return av


def _short(error: BaseException) -> str:
    """decord's messages start with '[time] /path/file.cc:123: ', once or more (a check failed in its decoder thread,
    rethrown), and may carry a stack trace; keep the gist."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"^(\[[\d:]+\] \S+:\d+: )+", "", text)


def _safe_width(width: int) -> bool:
    # decord 0.6 returns wrongly shaped frames (and get_batch fails) when ffmpeg pads a row and the padded
    # row length is a multiple of the width (e.g. widths 8, 16, 24, 48, 72). Rows are padded to a multiple
    # of at most 64 pixels, so widths that are multiples of 64, or at least 3 * 64, are never affected.
    return width % 64 == 0 or width >= 192


def _decode_size(height: int, width: int, resolution: int) -> tuple[int, int]:
    """(height, width) for decord to scale frames to: short side `resolution` (or a bit more, to keep the width safe)."""
    scale = resolution / min(height, width)
    out_w = max(resolution, round(width * scale))
    if not _safe_width(out_w):
        out_w = 64 * math.ceil(out_w / 64)
        scale = out_w / width
    out_h = max(resolution, round(height * scale))
    return out_h, out_w


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

        with _NativeQuiet():
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

        self.decode_size = _decode_size(self.height, self.width, resolution)
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
        with _NativeQuiet():
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
        h, w = self.decode_size
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        frames = self._decode_forward(plan.indices)
        for i in range(0, len(plan), chunk_size):
            chunk = np.empty((min(chunk_size, len(plan) - i), side, side, 3), np.uint8)
            for j in range(len(chunk)):
                chunk[j] = next(frames)[top : top + side, left : left + side]  # (Hd, Wd, 3) -> (side, side, 3)
            yield self._crop_resize(chunk), plan.timestamps[i : i + chunk_size]  # square already: at most a resize

    def _decode_forward(self, indices: np.ndarray) -> Iterator[np.ndarray]:
        """One frame (Hd, Wd, 3) uint8 per entry of `indices` (non-decreasing), decoded with PyAV, never seeking back.

        Why not decord: its get_batch seeks back to a keyframe whenever the indices cross one (rewinding the file and
        restarting its decoder thread, which reads packets ahead into an unbounded queue), so streaming an hour at 1 fps
        held and read more the longer the file was (docs/benchmarks.md, vqgan); its next() does not seek but queues
        ahead of its decoder thread all the same, and measured no flatter. PyAV decodes here, in this thread, a packet
        at a time, and converts only the planned frames; it seeks only forward, over whole keyframe intervals with no
        planned frame (sparse plans, a late start). Frames are counted from the start of the file, or after a seek from
        the one whose timestamp says where it landed, and each kept frame's timestamp is checked against decord's
        index, so a disagreement between the two libraries is an error, not a wrong frame. A seek that lands past the
        target, past the end or off a keyframe (containers that seek by bytes, MPEG-TS) is retried from one keyframe
        earlier: the only steps back, and only in such containers.
        """
        if len(indices) == 0:
            return
        av = _av()
        try:
            container = av.open(self.path)
        except Exception as e:
            raise VideoError(f"{self.path}: cannot open with PyAV: {e}") from e
        with container:
            stream = container.streams.best("video")
            stream.codec_context.thread_type = "AUTO"  # frame and slice threads
            origin, tb = stream.start_time or 0, float(stream.time_base)
            decoded = container.decode(stream)
            pos, k, scale = -1, 0, None  # pos: index of the frame decoded last (None: unknown, after a seek)
            back = None  # after a seek: how many keyframes before the target's it went (None: no seek in flight)
            while k < len(indices):
                target = int(indices[k])
                seek_to = self._seek_time(pos, target) if back is None else None
                if seek_to is not None:
                    decoded, pos, back = self._seek(container, stream, origin, tb, seek_to), None, 0
                try:
                    frame = next(decoded, None)
                except Exception as e:
                    raise VideoError(
                        f"{self.path}: decoding failed before frame {target} (corrupt or truncated file?): {e}"
                    ) from e
                if frame is None and pos is not None:
                    raise VideoError(f"{self.path}: the video ended before frame {target} (corrupt or truncated file?)")
                t = (frame.pts - origin) * tb if frame is not None and self._timed and frame.pts is not None else None
                if pos is None:  # the first frame after a seek: where did it land?
                    pos = self._nearest(t) if frame is not None else None
                    if pos is None or pos > target or not frame.key_frame:
                        # Containers without a keyframe index (MPEG-TS) seek by bytes and may land past the target (or
                        # the end), or between keyframes: retry from one keyframe earlier, down to the first.
                        back += 1
                        key = int(np.searchsorted(self.key_indices, target, side="right")) - 1 - back
                        if key < 0:
                            raise VideoError(
                                f"{self.path}: seeking cannot reach frame {target} (it lands on frame {pos})"
                            )
                        decoded, pos = self._seek(container, stream, origin, tb, self._key_time(key)), None
                        continue
                    back = None
                else:
                    pos += 1
                if pos < target:
                    continue  # decoded, never converted
                if pos > target or (t is not None and abs(t - self.starts[pos]) > TIME_EPS + np.spacing(np.float32(t))):
                    raise VideoError(
                        f"{self.path}: decoding forward met frame {pos} at {t} s where frame {target} at "
                        f"{self.starts[target]:.4f} s was due (PyAV and decord disagree on the frames)"
                    )
                if scale is None:
                    scale = self._scaler(av, stream, getattr(frame, "rotation", 0))
                scale.push(frame)
                image = scale.pull().to_ndarray()  # (Hd, Wd, 3)
                if image.shape != (*self.decode_size, 3):
                    raise VideoError(
                        f"{self.path}: PyAV returned frames of shape {image.shape}, expected {(*self.decode_size, 3)}"
                    )
                while k < len(indices) and indices[k] == pos:
                    yield image  # a held frame repeats
                    k += 1

    def _seek_time(self, pos: int, target: int) -> float | None:
        """A time to seek to on the way from frame `pos` (decoded last) to frame `target`, if a whole keyframe interval
        lies between them: that of target's keyframe (`_key_time`). None: decode on (or the frames' timestamps are
        unusable, so seeking is not safe)."""
        keys = self.key_indices
        key = np.searchsorted(keys, target, side="right") - 1  # target's keyframe is keys[key]
        if not self._timed or key <= np.searchsorted(keys, pos, side="right"):
            return None
        return self._key_time(int(key))

    def _key_time(self, key: int) -> float:
        """A time between the start of keyframe `key_indices[key]` and that of the frame after it: a backward seek to it
        lands on that keyframe though decord's float32 times are not the exact timestamps (see `_seek`)."""
        i = self.key_indices[key]
        return float(self.starts[i : i + 2].mean())

    def _seek(self, container, stream, origin: int, tb: float, time: float):
        """Seek to the keyframe at or before `time` seconds; a fresh decoding iterator from there."""
        # Floor, not round: in ticks the time is halfway between a keyframe's pts and the next frame's, and where
        # frames are one tick apart (AVI: the time base is the frame interval) rounding that half up lands on the next
        # frame, itself a keyframe in intra-only video (MJPEG), one frame past the target.
        container.seek(origin + math.floor(time / tb), stream=stream, backward=True)
        return container.decode(stream)

    def _nearest(self, t: float | None) -> int:
        """The index of the frame that starts nearest to `t` seconds."""
        if t is None:
            raise VideoError(f"{self.path}: after a seek, a frame without a timestamp (cannot tell where decoding is)")
        i = int(np.searchsorted(self.starts, t))  # starts[i - 1] < t <= starts[i]
        if i == self.num_frames or (i > 0 and t - self.starts[i - 1] < self.starts[i] - t):
            i -= 1
        return i

    def _scaler(self, av, stream, rotation: int):
        """decord's filter graph, so the frames equal read's: turn upright, scale to the decode size (bilinear), RGB."""
        h, w = self.decode_size
        turn = {90: ["transpose=1"], 180: ["transpose=1", "transpose=1"], 270: ["transpose=2"]}.get(-rotation % 360, [])
        graph = av.filter.Graph()
        nodes = [graph.add_buffer(template=stream)]
        for spec in [*turn, f"scale={w}:{h}:flags=bilinear", "format=rgb24"]:
            name, args = spec.split("=", 1)
            nodes.append(graph.add(name, args))
        nodes.append(graph.add("buffersink"))
        for a, b in zip(nodes, nodes[1:]):
            a.link_to(b)
        graph.configure()
        return graph

    def _crop_resize(self, frames: np.ndarray) -> np.ndarray:
        t, h, w, _ = frames.shape
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        frames = frames[:, top : top + side, left : left + side]  # (t, side, side, 3), side >= resolution
        if side == self.resolution:
            return np.ascontiguousarray(frames)
        # Only when the decode width was widened for decord (small frames): a mild downscale.
        x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()  # (t, 3, side, side)
        x = F.interpolate(
            x, size=(self.resolution, self.resolution), mode="bilinear", antialias=True, align_corners=False
        )
        return x.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()  # (t, r, r, 3)


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
