"""Small videos written here with PyAV for the video and tokenization tests (nothing is downloaded).

Frame i is red with value 20 + 5 * i (so later frames are redder), with green bands on the two ends
of the long side, 1/16 of it each, which a center crop removes.
"""

from __future__ import annotations

import fractions
from pathlib import Path

import av
import numpy as np


def frame_image(i: int, height: int, width: int) -> np.ndarray:
    img = np.zeros((height, width, 3), np.uint8)
    img[..., 0] = min(20 + 5 * i, 255)
    if width >= height:
        band = max(1, width // 16)
        img[:, :band, 1] = img[:, -band:, 1] = 255
    else:
        band = max(1, height // 16)
        img[:band, :, 1] = img[-band:, :, 1] = 255
    return img


def write_video(path: Path, *, width: int = 64, height: int = 48, frames: int = 40, fps: int = 10,
                codec: str = "libx264", pts_ms: list[int] | None = None) -> Path:
    """A constant frame rate video, or with pts_ms (one time in milliseconds per frame) a variable one."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if codec == "mpeg4":
            stream.bit_rate = 4_000_000  # its default quality merges frames that differ by a few levels
        if pts_ms is not None:
            stream.codec_context.time_base = fractions.Fraction(1, 1000)
        for i in range(frames if pts_ms is None else len(pts_ms)):
            frame = av.VideoFrame.from_ndarray(frame_image(i, height, width), format="rgb24")
            if pts_ms is not None:
                frame.pts, frame.time_base = pts_ms[i], fractions.Fraction(1, 1000)
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return path


def write_zero_frame_video(path: Path) -> Path:
    """An mp4 with a video stream that holds no frames (and some audio, so the container is written)."""
    with av.open(str(path), "w") as out:
        video = out.add_stream("libx264", rate=10)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        audio = out.add_stream("aac", rate=16000)
        for i in range(5):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            out.mux(audio.encode(frame))
        out.mux(audio.encode())
    return path


VFR_PTS_MS = [0, 100, 200, 300, 1000, 1100, 1200, 2500, 2600, 3000]


def make_good(folder: Path) -> dict[str, Path]:
    """name -> path of videos that read fine (landscape mp4/h264 and mkv/mpeg4, portrait, 8x6, variable rate)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sub").mkdir(exist_ok=True)
    return {
        "landscape_mp4": write_video(folder / "landscape.mp4"),  # 64x48, 40 frames at 10 fps: 4 s
        "landscape_mkv": write_video(folder / "landscape.mkv", codec="mpeg4"),  # same stem, other container
        "portrait": write_video(folder / "portrait.mp4", width=48, height=64, frames=20),
        "tiny": write_video(folder / "sub" / "tiny.mp4", width=8, height=6, frames=20),
        "vfr": write_video(folder / "sub" / "vfr.mp4", pts_ms=VFR_PTS_MS),  # 3.1 s
    }


def make_bad(folder: Path, source: Path) -> dict[str, Path]:
    """name -> path of files that must fail: truncated, not a video, no frames, shorter than 1 s (at 1 fps)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = source.read_bytes()
    truncated = folder / "truncated.mp4"
    truncated.write_bytes(data[: len(data) // 2])
    text = folder / "text.mp4"
    text.write_text("this is not a video\n" * 20)
    return {
        "truncated": truncated,
        "text": text,
        "zero": write_zero_frame_video(folder / "zero.mp4"),
        "short": write_video(folder / "short.mp4", frames=5),  # 0.5 s
    }
