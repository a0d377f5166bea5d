"""Convolutional building blocks of the VQGAN, op for op those of diffusers' VQModel
(ResnetBlock2D, Downsample2D, Upsample2D, DownEncoderBlock2D, UpDecoderBlock2D) so that imported
weights give the same numbers, not just the same shapes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ResnetBlock(nn.Module):
    """x + conv(silu(norm(conv(silu(norm(x)))))), with a 1x1 conv on the skip path when channels change."""

    def __init__(self, in_channels: int, out_channels: int, groups: int, eps: float):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_channels, eps=eps)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, out_channels, eps=eps)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        if self.shortcut is not None:
            x = self.shortcut(x)
        return x + h


class Downsample(nn.Module):
    """Stride-2 3x3 conv; the padding is asymmetric (right and bottom only), as in diffusers and taming."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, C, H, W) -> (B, C, H/2, W/2)
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest-neighbour x2, then a 3x3 conv."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, C, H, W) -> (B, C, 2H, 2W)
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class DownBlock(nn.Module):
    """n ResNet blocks, then (except in the last encoder block) a Downsample."""

    def __init__(self, in_channels: int, out_channels: int, n_layers: int, downsample: bool, groups: int, eps: float):
        super().__init__()
        channels = [in_channels] + [out_channels] * n_layers
        self.resnets = nn.ModuleList(
            ResnetBlock(c_in, c_out, groups, eps) for c_in, c_out in zip(channels, channels[1:])
        )
        self.downsample = Downsample(out_channels) if downsample else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x)
        return x if self.downsample is None else self.downsample(x)


class UpBlock(nn.Module):
    """n ResNet blocks, then (except in the last decoder block) an Upsample."""

    def __init__(self, in_channels: int, out_channels: int, n_layers: int, upsample: bool, groups: int, eps: float):
        super().__init__()
        channels = [in_channels] + [out_channels] * n_layers
        self.resnets = nn.ModuleList(
            ResnetBlock(c_in, c_out, groups, eps) for c_in, c_out in zip(channels, channels[1:])
        )
        self.upsample = Upsample(out_channels) if upsample else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x)
        return x if self.upsample is None else self.upsample(x)


def mid_block(channels: int, groups: int, eps: float) -> nn.Sequential:
    """Two ResNet blocks at the lowest resolution; aMUSEd's VQ model has no attention between them."""
    return nn.Sequential(ResnetBlock(channels, channels, groups, eps), ResnetBlock(channels, channels, groups, eps))
