"""The video part of a prompt: a video read and tokenized on the fly (the chat form itself is
lwm.data.chat, the training data's format)."""

from __future__ import annotations

import numpy as np
import torch

from lwm.paths import TINY_VQGAN
from lwm.video.reader import read_video

# data/ is in the repository, not the package (installed editable): found from the package's
# location, so the default works from any working directory
DEFAULT_VQGAN = TINY_VQGAN


@torch.no_grad()
def video_codes(path, vqgan, fps: float = 1.0, max_frames: int | None = None, batch_size: int = 16) -> np.ndarray:
    """Read a video at `fps` (at most `max_frames`, spread evenly) and tokenize it -> (T, 256) codes.
    Raises lwm.video.reader.VideoError for a missing or unreadable file."""

    frames, _ = read_video(path, fps=fps, resolution=vqgan.config.resolution)
    if max_frames is not None and len(frames) > max_frames:
        frames = frames[np.linspace(0, len(frames) - 1, max_frames).round().astype(int)]
    device = next(vqgan.parameters()).device
    return vqgan.encode(torch.from_numpy(frames).to(device), batch_size=batch_size).cpu().numpy().astype(np.int64)
