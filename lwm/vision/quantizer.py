"""Vector quantizer: each latent vector becomes the index of its nearest codebook row.

Training signal (VQ-VAE): codebook_loss = |sg(z) - e|^2 moves the codes toward the encoder's
outputs, commitment_loss = |z - sg(e)|^2 keeps the encoder near its codes (weighted by beta, 0.25
in VQ-VAE, by the trainer); the decoder's gradient reaches the encoder through the
straight-through estimator z + sg(e - z).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


class QuantizerOutput(NamedTuple):
    z_q: torch.Tensor  # (B, D, h, w): the codes' vectors, with straight-through gradients to z
    codes: torch.Tensor  # (B, h*w) long, row-major over the grid
    codebook_loss: torch.Tensor  # 0-dim, gradient to the codebook only
    commitment_loss: torch.Tensor  # 0-dim, gradient to the encoder only


class VectorQuantizer(nn.Module):
    def __init__(self, n_codes: int, code_dim: int):
        super().__init__()
        self.n_codes, self.code_dim = n_codes, code_dim
        self.codebook = nn.Embedding(n_codes, code_dim)
        if not self.codebook.weight.is_meta:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.codebook.weight.uniform_(-1.0 / self.n_codes, 1.0 / self.n_codes)  # diffusers' and taming's init

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """(B, D, h, w) -> codes (B, h*w)."""
        b, d, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(b * h * w, d)  # (B, D, h, w) -> (B*h*w, D)
        # fp32 distances: a bf16 argmin over 8192 codes would pick among near-ties at random.
        # torch.cdist, as diffusers uses, so imported models give the very same codes.
        dist = torch.cdist(flat.float(), self.codebook.weight.float())  # (B*h*w, n_codes)
        return dist.argmin(dim=1).view(b, h * w)

    def lookup(self, codes: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """codes (B, h*w) -> vectors (B, D, h, w)."""
        b = codes.shape[0]
        # (B, h*w) -> (B, h, w, D) -> (B, D, h, w); contiguous, so the convs that follow see a plain
        # NCHW tensor rather than a channels-last view.
        return self.codebook(codes).view(b, h, w, self.code_dim).permute(0, 3, 1, 2).contiguous()

    def forward(self, z: torch.Tensor) -> QuantizerOutput:
        if z.dim() != 4 or z.shape[1] != self.code_dim:
            raise ValueError(f"quantizer input must be (B, {self.code_dim}, h, w), got shape {tuple(z.shape)}")
        codes = self.nearest(z)
        e = self.lookup(codes, z.shape[2], z.shape[3])
        codebook_loss = F.mse_loss(e, z.detach())
        commitment_loss = F.mse_loss(z, e.detach())
        z_q = z + (e - z).detach()  # straight-through: forward e, backward identity to z
        return QuantizerOutput(z_q, codes, codebook_loss, commitment_loss)
