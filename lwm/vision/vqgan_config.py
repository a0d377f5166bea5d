"""VQGAN configuration: one dataclass, named presets, validated on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# A frame is 16x16 = 256 codes in the vocabulary layout; every VQGAN here produces that.
from lwm.data.vocab import TOKENS_PER_FRAME


@dataclass
class VQGANConfig:
    resolution: int = 256  # frames are resolution x resolution RGB
    base_channels: int = 128
    # Block i has base_channels * channel_mult[i] channels; every block but the last halves the size.
    channel_mult: tuple[int, ...] = (1, 2, 2, 4, 6)
    layers_per_block: int = 2  # ResNet blocks per encoder block (the decoder has one more)
    z_channels: int = 64  # encoder output / decoder input channels (diffusers' latent_channels)
    n_codes: int = 8192
    code_dim: int = 64  # codebook vector size (diffusers' vq_embed_dim)
    norm_groups: int = 32
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        self.channel_mult = tuple(self.channel_mult)  # Hydra hands lists
        positive = (
            "resolution",
            "base_channels",
            "layers_per_block",
            "z_channels",
            "n_codes",
            "code_dim",
            "norm_groups",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"VQGANConfig.{name} must be a positive integer, got {value!r}")
        if not self.channel_mult or not all(isinstance(m, int) and m > 0 for m in self.channel_mult):
            raise ValueError(
                f"VQGANConfig.channel_mult must be a non-empty tuple of positive integers, got {self.channel_mult!r}"
            )
        if self.norm_eps <= 0:
            raise ValueError(f"VQGANConfig.norm_eps must be > 0, got {self.norm_eps}")
        bad = [c for c in self.block_out_channels if c % self.norm_groups]
        if bad:
            raise ValueError(
                f"block channels {list(self.block_out_channels)} (base_channels {self.base_channels} x channel_mult "
                f"{list(self.channel_mult)}) must be divisible by norm_groups {self.norm_groups}; {bad} are not"
            )
        if self.resolution % self.downsample:
            raise ValueError(
                f"resolution {self.resolution} is not divisible by the downsampling {self.downsample} "
                f"(2 ** (len(channel_mult) - 1), channel_mult {list(self.channel_mult)})"
            )
        if self.tokens_per_frame != TOKENS_PER_FRAME:
            side = self.latent_size
            raise ValueError(
                f"resolution {self.resolution} / downsampling {self.downsample} gives {side}x{side} = "
                f"{self.tokens_per_frame} codes per frame; the vocabulary layout expects 16x16 = {TOKENS_PER_FRAME} "
                f"(use resolution {16 * self.downsample})"
            )

    @property
    def block_out_channels(self) -> tuple[int, ...]:
        return tuple(self.base_channels * m for m in self.channel_mult)

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.channel_mult) - 1)

    @property
    def latent_size(self) -> int:
        """Side of the code grid: resolution / downsample."""
        return self.resolution // self.downsample

    @property
    def tokens_per_frame(self) -> int:
        return self.latent_size**2

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VQGANConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown VQGAN preset {name!r}; expected one of {sorted(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    def replace(self, **changes) -> "VQGANConfig":
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, VQGANConfig] = {
    # The VQGAN LWM used: aMUSEd's VQ model (146M parameters), 256x256 -> 16x16 codes.
    "lwm": VQGANConfig(),
    # Tests and the CPU demo: 64x64 frames, downsampling 4 -> 16x16 codes, the full 8192-code codebook
    # so its codes fit the vocabulary.
    "tiny": VQGANConfig(
        resolution=64,
        base_channels=32,
        channel_mult=(1, 2, 2),
        layers_per_block=1,
        z_channels=16,
        code_dim=16,
        norm_groups=8,
    ),
}
