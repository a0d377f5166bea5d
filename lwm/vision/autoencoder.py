"""The VQGAN's convolutional halves: frames -> code-space vectors, and code-space vectors -> frames.

The 1x1 convs into and out of the code space (diffusers' quant_conv / post_quant_conv) live here,
so the quantizer sits directly between encoder and decoder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lwm.vision.blocks import DownBlock, UpBlock, mid_block
from lwm.vision.vqgan_config import VQGANConfig


class Encoder(nn.Module):
    def __init__(self, config: VQGANConfig, in_channels: int = 3):
        super().__init__()
        chs, groups, eps = config.block_out_channels, config.norm_groups, config.norm_eps
        self.conv_in = nn.Conv2d(in_channels, chs[0], 3, padding=1)
        ins = (chs[0],) + chs[:-1]
        self.down = nn.ModuleList(
            DownBlock(c_in, c_out, config.layers_per_block, downsample=i < len(chs) - 1, groups=groups, eps=eps)
            for i, (c_in, c_out) in enumerate(zip(ins, chs))
        )
        self.mid = mid_block(chs[-1], groups, eps)
        self.norm_out = nn.GroupNorm(groups, chs[-1], eps=eps)
        self.conv_out = nn.Conv2d(chs[-1], config.z_channels, 3, padding=1)
        self.quant_conv = nn.Conv2d(config.z_channels, config.code_dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, 3, H, W) -> (B, C0, H, W) -> ... -> (B, C_last, H/f, W/f)
        h = self.conv_in(x)
        for block in self.down:
            h = block(h)
        h = self.mid(h)
        h = self.conv_out(F.silu(self.norm_out(h)))  # (B, C_last, h, w) -> (B, z_channels, h, w)
        return self.quant_conv(h)  # -> (B, code_dim, h, w)


class Decoder(nn.Module):
    def __init__(self, config: VQGANConfig, out_channels: int = 3):
        super().__init__()
        chs, groups, eps = config.block_out_channels[::-1], config.norm_groups, config.norm_eps
        self.post_quant_conv = nn.Conv2d(config.code_dim, config.z_channels, 1)
        self.conv_in = nn.Conv2d(config.z_channels, chs[0], 3, padding=1)
        self.mid = mid_block(chs[0], groups, eps)
        ins = (chs[0],) + chs[:-1]
        # One more ResNet block per level than the encoder, as in diffusers and taming.
        self.up = nn.ModuleList(
            UpBlock(c_in, c_out, config.layers_per_block + 1, upsample=i < len(chs) - 1, groups=groups, eps=eps)
            for i, (c_in, c_out) in enumerate(zip(ins, chs))
        )
        self.norm_out = nn.GroupNorm(groups, chs[-1], eps=eps)
        self.conv_out = nn.Conv2d(chs[-1], out_channels, 3, padding=1)

    def forward(self, z_q: torch.Tensor) -> torch.Tensor:
        # (B, code_dim, h, w) -> (B, z_channels, h, w) -> (B, C_last, h, w)
        h = self.conv_in(self.post_quant_conv(z_q))
        h = self.mid(h)
        for block in self.up:
            h = block(h)  # -> ... -> (B, C0, H, W)
        return self.conv_out(F.silu(self.norm_out(h)))  # -> (B, 3, H, W)
