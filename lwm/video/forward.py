"""Streaming a video's planned frames with PyAV, decoding forward through the file and seeking only forward, so
memory holds one frame at a time however long the video is. The frames equal decord's random-access reads
(reader.py): the same ffmpeg filters scale them, and each is checked against decord's index."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from lwm.data.sampling import TIME_EPS
from lwm.video.errors import VideoError


def _av():
    try:
        import av
    except ImportError as e:
        raise ImportError("streaming videos needs PyAV (pip install av)") from e
    return av


def _seek(container, stream, origin: int, tb: float, time: float):
    """Seek to the keyframe at or before `time` seconds; a fresh decoding iterator from there."""
    # Floor, not round: in ticks the time is halfway between a keyframe's pts and the next frame's, and where
    # frames are one tick apart (AVI: the time base is the frame interval) rounding that half up lands on the next
    # frame, itself a keyframe in intra-only video (MJPEG), one frame past the target.
    container.seek(origin + math.floor(time / tb), stream=stream, backward=True)
    return container.decode(stream)


@dataclass(frozen=True)
class ForwardDecoder:
    """Decodes frames of the video at `path` forward, given decord's index of it: each frame's start time in seconds
    (`starts`), the keyframes' indices (`key_indices`, the first 0), whether the times are the frames' own timestamps
    (`timed`; if not, it never seeks) and the (height, width) to scale frames to (`decode_size`)."""

    path: str
    starts: np.ndarray  # (N,) float64
    key_indices: np.ndarray  # (K,) int64
    timed: bool
    decode_size: tuple[int, int]

    def frames(self, indices: np.ndarray) -> Iterator[np.ndarray]:
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
                seek_to = self.seek_time(pos, target) if back is None else None
                if seek_to is not None:
                    decoded, pos, back = _seek(container, stream, origin, tb, seek_to), None, 0
                try:
                    frame = next(decoded, None)
                except Exception as e:
                    raise VideoError(
                        f"{self.path}: decoding failed before frame {target} (corrupt or truncated file?): {e}"
                    ) from e
                if frame is None and pos is not None:
                    raise VideoError(f"{self.path}: the video ended before frame {target} (corrupt or truncated file?)")
                t = (frame.pts - origin) * tb if frame is not None and self.timed and frame.pts is not None else None
                if pos is None:  # the first frame after a seek: where did it land?
                    pos = self.nearest(t) if frame is not None else None
                    if pos is None or pos > target or not frame.key_frame:
                        # Containers without a keyframe index (MPEG-TS) seek by bytes and may land past the target (or
                        # the end), or between keyframes: retry from one keyframe earlier, down to the first.
                        back += 1
                        key = int(np.searchsorted(self.key_indices, target, side="right")) - 1 - back
                        if key < 0:
                            raise VideoError(
                                f"{self.path}: seeking cannot reach frame {target} (it lands on frame {pos})"
                            )
                        decoded, pos = _seek(container, stream, origin, tb, self.key_time(key)), None
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
                    scale = self.scaler(av, stream, getattr(frame, "rotation", 0))
                scale.push(frame)
                image = scale.pull().to_ndarray()  # (Hd, Wd, 3)
                if image.shape != (*self.decode_size, 3):
                    raise VideoError(
                        f"{self.path}: PyAV returned frames of shape {image.shape}, expected {(*self.decode_size, 3)}"
                    )
                while k < len(indices) and indices[k] == pos:
                    yield image  # a held frame repeats
                    k += 1

    def seek_time(self, pos: int, target: int) -> float | None:
        """A time to seek to on the way from frame `pos` (decoded last) to frame `target`, if a whole keyframe interval
        lies between them: that of target's keyframe (`key_time`). None: decode on (or the frames' timestamps are
        unusable, so seeking is not safe)."""
        keys = self.key_indices
        key = np.searchsorted(keys, target, side="right") - 1  # target's keyframe is keys[key]
        if not self.timed or key <= np.searchsorted(keys, pos, side="right"):
            return None
        return self.key_time(int(key))

    def key_time(self, key: int) -> float:
        """A time between the start of keyframe `key_indices[key]` and that of the frame after it: a backward seek to it
        lands on that keyframe though decord's float32 times are not the exact timestamps (see `_seek`)."""
        i = self.key_indices[key]
        return float(self.starts[i : i + 2].mean())

    def nearest(self, t: float | None) -> int:
        """The index of the frame that starts nearest to `t` seconds."""
        if t is None:
            raise VideoError(f"{self.path}: after a seek, a frame without a timestamp (cannot tell where decoding is)")
        i = int(np.searchsorted(self.starts, t))  # starts[i - 1] < t <= starts[i]
        if i == len(self.starts) or (i > 0 and t - self.starts[i - 1] < self.starts[i] - t):
            i -= 1
        return i

    def scaler(self, av, stream, rotation: int):
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
