"""Images as one-frame videos, as LWM trains them: a picture is cropped and resized as a video's frames
are and encoded by the same VQGAN into one frame of codes (256 for LWM's), which the data then closes
with <eov>. lwm-tokenize takes image files beside videos (lwm.data.form.IMAGE_EXTENSIONS), and the images
of webdataset shards (lwm.data.shards: "<shard>::<member>")."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lwm.data.shards import read_member, split_ref
from lwm.video.errors import VideoError
from lwm.video.frame_size import crop_resize


@dataclass(frozen=True)
class Picture:
    """What the manifest records of an image's source, in a video's terms (one frame, no duration)."""

    width: int
    height: int
    num_frames: int = 1
    duration: float = 0.0


def read_pixels(path: str | Path) -> tuple[np.ndarray, Picture]:
    """(h, w, 3) uint8: the image's RGB pixels (a GIF's first frame, no alpha), and what it was; VideoError
    naming the file when it cannot be read as an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        member = split_ref(str(path))  # an image inside a webdataset shard
        with Image.open(io.BytesIO(read_member(str(path))) if member else path) as image:
            pixels = np.array(image.convert("RGB"))  # writable
    except FileNotFoundError:
        raise VideoError(f"{path}: no such file") from None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise VideoError(f"{path}: cannot open as an image ({type(e).__name__}: {e})") from None
    h, w, _ = pixels.shape
    return pixels, Picture(width=w, height=h)


def encode_pixels(pixels: np.ndarray, vqgan, dtype=np.int64) -> np.ndarray:
    """(h, w, 3) uint8 RGB -> codes (1, tokens_per_frame): center-cropped to a square and resized as video
    frames are, then encoded."""
    frames = crop_resize(pixels[None], vqgan.config.resolution)  # (1, r, r, 3)
    device = next(vqgan.parameters()).device
    return vqgan.encode(torch.from_numpy(frames).to(device)).cpu().numpy().astype(dtype)  # (1, 256)


def encode_image(path: str | Path, vqgan, dtype=np.int64) -> tuple[np.ndarray, np.ndarray, Picture]:
    """Codes (1, tokens_per_frame) of the image, its timestamps ([0.0]) and what it was."""
    pixels, picture = read_pixels(path)
    return encode_pixels(pixels, vqgan, dtype), np.zeros(1), picture
