"""Writing frames to files: an H.264 mp4 (libx264, yuv420p, PyAV), an animated GIF or a PNG (Pillow).

write_frames("out.mp4", frames, fps=4)   # frames (T, H, W, 3) uint8 RGB; the suffix picks the form
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
from PIL import Image

FRAME_SUFFIXES = (".png", ".gif", ".mp4")


def write_mp4(path: Path, frames: np.ndarray, fps: int) -> None:
    """frames (T, H, W, 3) uint8 RGB -> path. One encoder thread and fixed settings, so the same frames
    give the same stream; a keyframe every 2 s keeps seeking cheap. Macroblock-tree rate control is off:
    with it, this libx264 (PyAV 18.1) gave a different stream for the same frames in about 1 of 3 runs
    (and different decoded frames now and then); without it, 0 of 92 runs differed."""
    with av.open(str(path), mode="w", format="mp4") as container:
        options = {"crf": "18", "preset": "medium", "x264-params": "mbtree=0"}
        stream = container.add_stream("libx264", rate=fps, options=options)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = 2 * fps
        stream.codec_context.thread_count = 1
        for rgb in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")))
        container.mux(stream.encode(None))


def frames_path(path: str | Path) -> Path:
    """path, checked to end in a suffix write_frames writes (ValueError naming it otherwise)."""
    path = Path(path)
    if path.suffix.lower() not in FRAME_SUFFIXES:
        raise ValueError(f"{path}: expected a file ending in one of {', '.join(FRAME_SUFFIXES)}")
    return path


def write_frames(path: str | Path, frames: np.ndarray, fps: int = 4) -> Path:
    """frames (T, H, W, 3) uint8 RGB -> path, in the form its suffix names: .png (one frame, lossless),
    .gif (every frame, each quantized to a palette of 256 colors, 1000/fps ms a frame) or .mp4 (fps frames a
    second). Raises ValueError naming the path for another suffix or a PNG of several frames."""
    path = frames_path(path)
    frames = np.asarray(frames)
    suffix = path.suffix.lower()
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
        raise ValueError(f"{path}: frames must be (T, H, W, 3) uint8 with T >= 1, got {frames.dtype} {frames.shape}")
    if suffix == ".png":
        if len(frames) != 1:
            raise ValueError(f"{path}: a PNG holds one frame, got {len(frames)}; write a .gif or .mp4")
        Image.fromarray(frames[0]).save(path)
    elif suffix == ".gif":
        first, *rest = [Image.fromarray(f) for f in frames]
        first.save(path, save_all=True, append_images=rest, duration=round(1000 / fps), loop=0)
    else:
        write_mp4(path, frames, fps)
    return path
