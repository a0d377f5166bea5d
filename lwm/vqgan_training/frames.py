"""Frames for VQGAN training: every frame of a list of videos, read once, split by video.

    data = FrameData(FramesConfig(index="data/sample/videos.jsonl"), resolution=64, batch_size=16)
    data.setup()          # reads the videos (decord), keeps the frames in memory as uint8
    data.train_dataloader()  # (B, 3, H, W) float in [-1, 1] (or crops), shuffled, optionally flipped

The split is by video, never by frame: neighbouring frames of one clip are near copies, so a
frame-level split would put the held-out frames' twins in the training set. The last `held_out`
videos of the index (in its order) are held out; the split is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lwm.io import records
from lwm.video.reader import read_video


@dataclass
class FramesConfig:
    index: str = "data/sample/videos.jsonl"  # jsonl, one video per line with "path" relative to the index's folder
    fps: float = 4.0  # frames per second read from each video (the sample videos are 4 fps: every frame)
    held_out: int = 4  # the last `held_out` videos of the index are the validation set
    hflip: bool = True  # random horizontal flips of training frames
    num_workers: int = 0  # frames are in memory; workers only compete for the cores

    def __post_init__(self) -> None:
        # types are lwm.configs.from_dict's to check; the ranges are this config's
        if not self.fps > 0:
            raise ValueError(f"FramesConfig.fps must be a positive number, got {self.fps!r}")
        if self.held_out < 1:
            raise ValueError(
                f"FramesConfig.held_out must be a positive integer (videos held out), got {self.held_out!r}"
            )
        if self.num_workers < 0:
            raise ValueError(f"FramesConfig.num_workers must be an integer >= 0, got {self.num_workers!r}")


def read_index(index: str | Path) -> list[Path]:
    """Video paths listed in a jsonl index (a "path" per line, relative to the index's folder)."""
    index = Path(index)
    if not index.is_file():
        raise FileNotFoundError(
            f"video index {index} not found (make the sample data with python -m lwm.synth.make_sample)"
        )
    paths = []
    for n, record in records(index):
        if not isinstance(record, dict) or "path" not in record:
            got = f"keys {sorted(record)}" if isinstance(record, dict) else type(record).__name__
            raise ValueError(f"{index}:{n}: a video record needs a 'path', got {got}")
        paths.append(index.parent / record["path"])
    return paths


def split_videos(paths: list[Path], held_out: int) -> tuple[list[Path], list[Path]]:
    """(train, held-out): the last `held_out` videos are held out."""
    if len(paths) <= held_out:
        raise ValueError(f"cannot hold out {held_out} of {len(paths)} videos: at least one must be left to train on")
    return paths[:-held_out], paths[-held_out:]


def load_frames(paths: list[Path], resolution: int, fps: float) -> torch.Tensor:
    """All frames of `paths` sampled at `fps`: (N, resolution, resolution, 3) uint8."""
    frames = [read_video(p, fps=fps, resolution=resolution)[0] for p in paths]
    return torch.from_numpy(np.concatenate(frames))


class FrameDataset(Dataset):
    """uint8 frames (N, H, W, 3) -> items (3, H, W) float in [-1, 1], flipped left-right at random if `hflip`;
    with `crop`, a random (3, crop, crop) window at offsets that are multiples of `align`."""

    def __init__(self, frames: torch.Tensor, hflip: bool = False, crop: int = 0, align: int = 1):
        if frames.dim() != 4 or frames.shape[3] != 3 or frames.dtype != torch.uint8:
            raise ValueError(f"frames must be (N, H, W, 3) uint8, got shape {tuple(frames.shape)} dtype {frames.dtype}")
        size = min(frames.shape[1:3])
        if crop and (crop > size or crop % align):
            raise ValueError(
                f"crop {crop} must be at most the frame size {size} and a multiple of the downsampling {align}"
            )
        self.frames, self.hflip, self.crop, self.align = frames, hflip, crop, align

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, i: int) -> torch.Tensor:
        frame = self.frames[i]  # (H, W, 3)
        if self.crop:
            top, left = (
                int(torch.randint((s - self.crop) // self.align + 1, ())) * self.align for s in frame.shape[:2]
            )
            frame = frame[top : top + self.crop, left : left + self.crop]  # (crop, crop, 3)
        x = frame.permute(2, 0, 1).float() / 127.5 - 1.0  # (H, W, 3) uint8 -> (3, H, W) in [-1, 1]
        if self.hflip and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x


class FrameData(L.LightningDataModule):
    """Training frames come as random crop x crop windows when crop > 0 (offsets multiples of `align`, the
    VQGAN's downsampling, so the code grid lines up as on whole frames); held-out frames are whole."""

    def __init__(self, config: FramesConfig, resolution: int, batch_size: int, crop: int = 0, align: int = 1):
        super().__init__()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.config, self.resolution, self.batch_size, self.crop, self.align = (
            config,
            resolution,
            batch_size,
            crop,
            align,
        )
        self.train: FrameDataset | None = None
        self.val: FrameDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train is not None:
            return  # read once: fit and a later validate share the frames
        train_paths, val_paths = split_videos(read_index(self.config.index), self.config.held_out)
        self.train = FrameDataset(
            load_frames(train_paths, self.resolution, self.config.fps),
            hflip=self.config.hflip,
            crop=self.crop,
            align=self.align,
        )
        self.val = FrameDataset(load_frames(val_paths, self.resolution, self.config.fps))
        self.videos = {"train": len(train_paths), "val": len(val_paths)}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train,
            batch_size=self.batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=self.config.num_workers,
            persistent_workers=self.config.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=64, shuffle=False, num_workers=0)
