"""The VQGAN video tokenizer: frames (T, H, W, 3) uint8 <-> codes (T, 256) in [0, n_codes).

Frames are tokenized one by one (no temporal mixing), as in LWM. The architecture is aMUSEd's
VQ model (diffusers' VQModel without mid-block attention); lwm.interop.diffusers imports its
weights. Training the VQGAN uses forward(), which returns the reconstruction and both quantizer
losses; encode()/decode() are the no-grad tokenizer API and run in batches of frames.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from lwm.vision.autoencoder import Decoder, Encoder
from lwm.vision.quantizer import VectorQuantizer
from lwm.vision.vqgan_config import VQGANConfig

# Float frames may overshoot [-1, 1] a little (a decoder's output does); beyond this they are
# almost surely in another range, e.g. [0, 255].
_FLOAT_RANGE_SLACK = 0.5


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """Decoded frames (..., 3, H, W) float in [-1, 1] -> (..., H, W, 3) uint8 (clamped) on the host."""
    return ((x.detach().float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).movedim(-3, -1).cpu()


class VQGANOutput(NamedTuple):
    recon: torch.Tensor  # (B, 3, H, W) float, roughly in [-1, 1]
    codes: torch.Tensor  # (B, tokens_per_frame) long
    codebook_loss: torch.Tensor  # 0-dim; the VQ-VAE objective adds codebook_loss + beta * commitment_loss
    commitment_loss: torch.Tensor  # 0-dim


def _as_tensor(x, name: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}")
    return x


class VQGAN(nn.Module):
    def __init__(self, config: VQGANConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.quantizer = VectorQuantizer(config.n_codes, config.code_dim)
        self.decoder = Decoder(config)

    # ------------------------------------------------------------------------------ inputs

    def _check_frames(self, frames) -> torch.Tensor:
        frames = _as_tensor(frames, "frames")
        r = self.config.resolution
        expected = f"(T, {r}, {r}, 3) uint8 or (T, 3, {r}, {r}) float in [-1, 1]"
        got = f"got shape {tuple(frames.shape)} dtype {frames.dtype}"
        if frames.dim() != 4:
            raise ValueError(f"frames must be {expected}; {got}")
        if frames.dtype == torch.uint8:
            if frames.shape[3] != 3:
                raise ValueError(f"uint8 frames must be channels-last (T, H, W, 3), i.e. {expected}; {got}")
            size = tuple(frames.shape[1:3])
        elif frames.is_floating_point():
            if frames.shape[1] != 3:
                raise ValueError(f"float frames must be channels-first (T, 3, H, W), i.e. {expected}; {got}")
            size = tuple(frames.shape[2:])
        else:
            raise ValueError(f"frames must be uint8 or floating point, i.e. {expected}; {got}")
        if size != (r, r):
            raise ValueError(
                f"frames are {size[0]}x{size[1]} but this VQGAN takes {r}x{r} (resize or crop first); {got}"
            )
        if frames.is_floating_point() and frames.numel() and not frames.is_meta:
            lo, hi = (float(v) for v in frames.aminmax())
            if lo < -1 - _FLOAT_RANGE_SLACK or hi > 1 + _FLOAT_RANGE_SLACK:
                raise ValueError(
                    f"float frames must be in [-1, 1], got values in [{lo:.4g}, {hi:.4g}] "
                    f"(pass uint8 (T, H, W, 3) frames to have them scaled)"
                )
        return frames

    def _check_codes(self, codes) -> torch.Tensor:
        codes = _as_tensor(codes, "codes")
        n = self.config.tokens_per_frame
        got = f"got shape {tuple(codes.shape)} dtype {codes.dtype}"
        if codes.dim() != 2 or codes.shape[1] != n:
            raise ValueError(f"codes must be (T, {n}); {got}")
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise ValueError(f"codes must be an integer tensor (long); {got}")
        if codes.numel() and not codes.is_meta:
            lo, hi = int(codes.min()), int(codes.max())
            if lo < 0 or hi >= self.config.n_codes:
                raise ValueError(f"codes must be in [0, {self.config.n_codes}), got values in [{lo}, {hi}]")
        return codes

    def _to_input(self, frames: torch.Tensor) -> torch.Tensor:
        """Checked frames -> (B, 3, H, W) in [-1, 1], on the model's device and in its dtype."""
        ref = self.quantizer.codebook.weight
        x = frames.to(ref.device)
        if x.dtype == torch.uint8:
            x = x.permute(0, 3, 1, 2).to(ref.dtype) / 127.5 - 1.0  # (T, H, W, 3) -> (T, 3, H, W)
        # Plain NCHW: a channels-last view would send the convs down other kernels (other rounding).
        return x.to(ref.dtype).contiguous()

    # ------------------------------------------------------------------------------ API

    def forward(self, frames) -> VQGANOutput:
        """frames (B, H, W, 3) uint8 or (B, 3, H, W) float in [-1, 1] -> reconstruction, codes, losses."""
        x = self._to_input(self._check_frames(frames))
        q = self.quantizer(self.encoder(x))
        return VQGANOutput(self.decoder(q.z_q), q.codes, q.codebook_loss, q.commitment_loss)

    @torch.no_grad()
    def encode(self, frames, batch_size: int = 8) -> torch.Tensor:
        """frames (T, H, W, 3) uint8 or (T, 3, H, W) float in [-1, 1] -> codes (T, 256) long in
        [0, n_codes), on the frames' device. Runs batch_size frames at a time."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        frames = self._check_frames(frames)
        out = [
            self.quantizer.nearest(self.encoder(self._to_input(chunk))).to(frames.device)
            for chunk in frames.split(batch_size)
        ]
        if not out:
            return torch.empty(0, self.config.tokens_per_frame, dtype=torch.long, device=frames.device)
        return torch.cat(out)

    @torch.no_grad()
    def decode(self, codes, batch_size: int = 8) -> torch.Tensor:
        """codes (T, 256) integer in [0, n_codes) -> frames (T, 3, H, W) float, roughly in [-1, 1],
        on the codes' device. Runs batch_size frames at a time."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        codes = self._check_codes(codes)
        ref, n = self.quantizer.codebook.weight, self.config.latent_size
        out = [
            self.decoder(self.quantizer.lookup(chunk.to(ref.device, torch.long), n, n)).to(codes.device)
            for chunk in codes.split(batch_size)
        ]
        if not out:
            r = self.config.resolution
            return torch.empty(0, 3, r, r, dtype=ref.dtype, device=codes.device)
        return torch.cat(out)
