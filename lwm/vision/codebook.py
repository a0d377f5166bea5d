"""Keeping a VQ codebook alive while training: usage statistics, dead-code restarts, EMA updates.

- usage: the fraction of codes that were picked at least once (in a window of recent steps, or on
  a set of frames); perplexity: exp of the entropy of the code histogram (n_codes when every code
  is used equally, 1 when one code takes everything).
- restart: codes unused over the window are moved onto random encoder outputs of the current
  batch, where they will be picked (the k-means remedy for empty clusters).
- EMA (VQ-VAE-2 / "Neural Discrete Representation Learning" appendix): instead of a gradient,
  each code moves to the exponential moving average of the encoder outputs assigned to it.

The quantizer itself (lwm/vision/quantizer.py) is untouched: these act on its codebook from outside.
"""

from __future__ import annotations

import torch
from torch import nn


def code_histogram(codes: torch.Tensor, n_codes: int) -> torch.Tensor:
    """codes (any shape) in [0, n_codes) -> counts (n_codes,) long."""
    return torch.bincount(codes.reshape(-1).long(), minlength=n_codes)


def usage_fraction(histogram: torch.Tensor) -> float:
    """Fraction of codes with a non-zero count."""
    return float((histogram > 0).sum()) / histogram.numel()


def perplexity(histogram: torch.Tensor) -> float:
    """exp(entropy) of the code distribution; 0 for an empty histogram."""
    total = histogram.sum()
    if total == 0:
        return 0.0
    p = histogram[histogram > 0].double() / total
    return float(torch.exp(-(p * p.log()).sum()))


class CodeUsage:
    """Code counts over the last `window` steps (a ring of per-step histograms and their running sum)."""

    def __init__(self, n_codes: int, window: int):
        if window < 1:
            raise ValueError(f"the usage window must be at least 1 step, got {window}")
        self.n_codes, self.window = n_codes, window
        self.steps = torch.zeros(window, n_codes, dtype=torch.long)  # (window, n_codes)
        self.total = torch.zeros(n_codes, dtype=torch.long)
        self.seen = 0  # steps recorded so far

    def update(self, codes: torch.Tensor) -> None:
        slot = self.seen % self.window
        new = code_histogram(codes.detach().cpu(), self.n_codes)
        self.total += new - self.steps[slot]
        self.steps[slot] = new
        self.seen += 1

    def histogram(self) -> torch.Tensor:
        return self.total.clone()

    def dead(self) -> torch.Tensor:
        """(n_codes,) bool: codes not picked in the window."""
        return self.total == 0

    def usage(self) -> float:
        return usage_fraction(self.total)

    def perplexity(self) -> float:
        return perplexity(self.total)


@torch.no_grad()
def restart_codes(
    codebook: torch.Tensor, dead: torch.Tensor, z: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Move the `dead` rows of `codebook` (n_codes, D) onto random rows of `z` (N, D) (encoder outputs),
    in place; distinct rows of z while there are enough. Returns the indices of the restarted codes."""
    if dead.shape != codebook.shape[:1] or dead.dtype != torch.bool:
        raise ValueError(
            f"dead must be a bool mask of shape ({codebook.shape[0]},), got {tuple(dead.shape)} {dead.dtype}"
        )
    if z.dim() != 2 or z.shape[1] != codebook.shape[1] or len(z) == 0:
        raise ValueError(f"z must be (N, {codebook.shape[1]}) encoder outputs with N >= 1, got shape {tuple(z.shape)}")
    idx = dead.nonzero().squeeze(1)
    if len(idx) == 0:
        return idx
    if len(z) >= len(idx):
        pick = torch.randperm(len(z), generator=generator, device="cpu")[: len(idx)]
    else:
        pick = torch.randint(len(z), (len(idx),), generator=generator, device="cpu")
    codebook[idx.to(codebook.device)] = z[pick.to(z.device)].to(codebook.dtype)
    return idx


class EMACodebook(nn.Module):
    """EMA codebook updates for a codebook (n_codes, D) that gets no gradient.

    After each step: N_k <- decay N_k + (1 - decay) n_k, S_k <- decay S_k + (1 - decay) sum of the z
    assigned to k, and e_k = S_k / N~_k with N~ Laplace-smoothed so empty codes do not divide by 0.
    """

    def __init__(self, n_codes: int, code_dim: int, decay: float, eps: float = 1e-5):
        super().__init__()
        if not 0 < decay < 1:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay, self.eps = decay, eps
        self.register_buffer("cluster_size", torch.zeros(n_codes))  # N_k
        self.register_buffer("embed_sum", torch.zeros(n_codes, code_dim))  # S_k
        self.register_buffer("initialized", torch.tensor(False))

    @torch.no_grad()
    def update(self, codebook: torch.Tensor, z: torch.Tensor, codes: torch.Tensor) -> None:
        """codebook (n_codes, D) updated in place from z (N, D) and their codes (N,)."""
        if not self.initialized:  # start the averages at the current codebook, with weight 1 each
            self.cluster_size.fill_(1.0)
            self.embed_sum.copy_(codebook.float())
            self.initialized.fill_(True)
        z = z.float()
        counts = torch.bincount(codes, minlength=len(codebook)).float()  # (n_codes,)
        sums = torch.zeros_like(self.embed_sum).index_add_(0, codes, z)  # (n_codes, D)
        self.cluster_size.lerp_(counts, 1 - self.decay)
        self.embed_sum.lerp_(sums, 1 - self.decay)
        n = self.cluster_size.sum()
        smoothed = (self.cluster_size + self.eps) / (n + len(codebook) * self.eps) * n
        codebook.copy_((self.embed_sum / smoothed.unsqueeze(1)).to(codebook.dtype))

    @torch.no_grad()
    def restarted(self, idx: torch.Tensor, codebook: torch.Tensor) -> None:
        """Codes `idx` were moved (restart_codes): their averages start again at the new vectors, weight 1."""
        self.cluster_size[idx] = 1.0
        self.embed_sum[idx] = codebook[idx].float()
