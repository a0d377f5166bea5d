"""Small videos written here with PyAV for the video and tokenization tests (nothing is downloaded).

Frame i is red with value 20 + 5 * (i mod 48) (so later frames are redder, and in longer videos neighbours
still differ), with green bands on the two ends of the long side, 1/16 of it each, which a center crop removes.
"""

from __future__ import annotations

import fractions
import json
import subprocess
import sys
from pathlib import Path

import av
import numpy as np


def frame_image(i: int, height: int, width: int) -> np.ndarray:
    img = np.zeros((height, width, 3), np.uint8)
    img[..., 0] = 20 + 5 * (i % 48)
    if width >= height:
        band = max(1, width // 16)
        img[:, :band, 1] = img[:, -band:, 1] = 255
    else:
        band = max(1, height // 16)
        img[:band, :, 1] = img[-band:, :, 1] = 255
    return img


def write_video(
    path: Path,
    *,
    width: int = 64,
    height: int = 48,
    frames: int = 40,
    fps: int = 10,
    codec: str = "libx264",
    pts_ms: list[int] | None = None,
    keyframe_interval: int | None = None,
    rotation: int | None = None,
) -> Path:
    """A constant frame rate video, or with pts_ms (one time in milliseconds per frame) a variable one.

    rotation (degrees, mp4/mov) writes a display matrix into the track header (PyAV's set_display_rotation; ffprobe
    shows side data "Display Matrix", ffmpeg 4, decord's, a `rotate` tag), and marks the top left corner blue so that
    a turn the wrong way shows."""
    options = dict(
        width=width,
        height=height,
        frames=frames,
        fps=fps,
        codec=codec,
        pts_ms=pts_ms,
        keyframe_interval=keyframe_interval,
        rotation=rotation,
    )
    try:
        return _write(path, **options)
    except av.error.ArgumentError:
        if codec != "libvpx-vp9":
            raise
    # decord, imported before PyAV in this process, loaded its own libvpx with global symbols, and PyAV's VP9 encoder
    # binds to that one ("ABI version mismatch"); a fresh interpreter has PyAV's only. (Decoding VP9 is ffmpeg's own.)
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from video_samples import write_video; "
        "write_video(sys.argv[2], **json.loads(sys.argv[3]))"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent), str(path), json.dumps(options)], check=True
    )
    return path


def _write(
    path: Path,
    *,
    width: int,
    height: int,
    frames: int,
    fps,
    codec: str,
    pts_ms: list[int] | None,
    keyframe_interval: int | None,
    rotation: int | None,
) -> Path:
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=fps)
        # The MJPEG encoder takes full-range YUV only.
        stream.width, stream.height, stream.pix_fmt = width, height, "yuvj420p" if codec == "mjpeg" else "yuv420p"
        if codec == "mpeg4":
            stream.bit_rate = 4_000_000  # its default quality merges frames that differ by a few levels
        if keyframe_interval is not None:
            stream.codec_context.gop_size = keyframe_interval
        if rotation is not None:
            stream.set_display_rotation(rotation)
        if pts_ms is not None:
            stream.codec_context.time_base = fractions.Fraction(1, 1000)
        for i in range(frames if pts_ms is None else len(pts_ms)):
            image = frame_image(i, height, width)
            if rotation is not None:
                image[: height // 4, : width // 4, 2] = 255
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
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


# Irregular gaps between frames, in milliseconds, from 10 ms to a 0.7 s hold: 40 frames over 5.4 s.
VFR_GAPS_MS = [10, 40, 90, 33, 33, 250, 17, 700, 66, 120] * 4


def make_formats(folder: Path) -> dict[str, Path]:
    """name -> path of one small video per container and codec that streaming must read as random access does,
    96x64 (widened for decord, then resized), a keyframe every 10 frames where the codec has a choice.

    The VP9 file is written in a fresh interpreter where decord was imported first (see write_video)."""
    folder.mkdir(parents=True, exist_ok=True)
    common = dict(width=96, height=64, fps=30, keyframe_interval=10)
    return {
        "h264_mp4": write_video(folder / "h264.mp4", frames=90, **common),
        "vp9_webm": write_video(folder / "vp9.webm", frames=90, codec="libvpx-vp9", **common),
        # 30 fps in AVI: the time base is 1/30 s, one tick per frame; every MJPEG frame is a keyframe. 9 s, as at
        # fps 1 the frame due at 8 s is one whose seek rounded to the frame after (frame 241 instead of 240).
        "mjpeg_avi": write_video(folder / "mjpeg.avi", frames=270, codec="mjpeg", width=96, height=64, fps=30),
        "mpeg4_avi": write_video(folder / "mpeg4.avi", frames=90, codec="mpeg4", **common),
        "rotated_mp4": write_video(folder / "rotated.mp4", frames=90, rotation=90, **common),
        "vfr_mkv": write_video(folder / "vfr.mkv", pts_ms=[0, *np.cumsum(VFR_GAPS_MS[:-1]).tolist()], **common),
    }


def make_bad(folder: Path, source: Path) -> dict[str, Path]:
    """name -> path of files that must fail: truncated, corrupt (opens, fails to decode), not a video, no frames,
    shorter than 1 s (at 1 fps)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = source.read_bytes()
    truncated = folder / "truncated.mp4"
    truncated.write_bytes(data[: len(data) // 2])
    # Scrambled bytes a third of the way in, among the frames (PyAV writes the index, moov, last): opens, fails to decode.
    corrupt = folder / "corrupt.mp4"
    scrambled, at = bytearray(data), len(data) // 3
    scrambled[at : at + 400] = bytes((b * 7 + 3) % 256 for b in data[at : at + 400])
    corrupt.write_bytes(bytes(scrambled))
    text = folder / "text.mp4"
    text.write_text("this is not a video\n" * 20)
    return {
        "truncated": truncated,
        "corrupt": corrupt,
        "text": text,
        "zero": write_zero_frame_video(folder / "zero.mp4"),
        "short": write_video(folder / "short.mp4", frames=5),  # 0.5 s
    }
