"""The LLaMA-architecture transformer: its feed-forward, its block and the model. One process; it never knows
about context parallelism."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lwm.model.attention import Attention, AttentionFn
from lwm.model.config import ModelConfig
from lwm.model.documents import check_segment_ids
from lwm.model.loss import LossOutput, chunked_cross_entropy
from lwm.model.norm import NORM_KERNELS, RMSNorm
from lwm.model.rope import rope_angles


class FeedForward(nn.Module):
    """SwiGLU feed-forward, optionally blockwise over the sequence (BPT-style)."""

    def __init__(self, dim: int, ffn_dim: int, chunk_size: int = 0):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)  # down
        self.chunk_size = chunk_size

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.chunk_size or x.shape[1] <= self.chunk_size:
            return self._ffn(x)
        # Blockwise: only one chunk's (B, chunk, ffn_dim) intermediates live at a time; in training
        # each chunk is recomputed in backward, so they are not kept for the whole sequence either.
        chunks = x.split(self.chunk_size, dim=1)
        if torch.is_grad_enabled():
            outs = [checkpoint(self._ffn, c, use_reentrant=False) for c in chunks]
        else:
            outs = [self._ffn(c) for c in chunks]
        return torch.cat(outs, dim=1)

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.w1.weight, std=std)
        nn.init.normal_(self.w3.weight, std=std)
        nn.init.normal_(self.w2.weight, std=out_std)


class Block(nn.Module):
    """One pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.norm_eps, config.norm_chunk_size)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.dim, config.norm_eps, config.norm_chunk_size)
        self.mlp = FeedForward(config.dim, config.ffn_dim, config.mlp_chunk_size)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segment_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x), cos, sin, segment_ids)
        return h + self.mlp(self.mlp_norm(h))

    def init_weights(self, std: float, out_std: float) -> None:
        self.attn_norm.reset_parameters()
        self.mlp_norm.reset_parameters()
        self.attn.init_weights(std, out_std)
        self.mlp.init_weights(std, out_std)


class Transformer(nn.Module):
    """Build on the meta device (`with torch.device("meta")`), then `to_empty` and `init_weights()`
    to create a large model without allocating it twice; elsewhere the weights are initialized here."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps, config.norm_chunk_size)
        # Tied: the head reads the embedding's weight and has no parameter of its own, so the weights,
        # their shards and their state dict hold it once.
        self.output = None if config.tie_embeddings else nn.Linear(config.dim, config.vocab_size, bias=False)
        if not self.embed.weight.is_meta:
            self.init_weights()

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        out_std = std / math.sqrt(2 * self.config.n_layers)  # residual projections, GPT-2 style
        nn.init.normal_(self.embed.weight, std=std)
        for layer in self.layers:
            layer.init_weights(std, out_std)
        self.norm.reset_parameters()
        if self.output is not None:
            nn.init.normal_(self.output.weight, std=std)

    @property
    def head_weight(self) -> torch.Tensor:
        """The output head's (V, dim) weight: its own, or the embedding's when tied."""
        return self.embed.weight if self.output is None else self.output.weight

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., dim) hidden states -> (..., V) logits."""
        return F.linear(h, self.head_weight)

    def set_attention(self, attn_fn: AttentionFn | Sequence[AttentionFn]) -> None:
        """The one way to change the blocks' attention: one function for every block, or one per
        block (lwm.parallel swaps in ring attention; inference swaps in its KV cache and back)."""
        fns = list(attn_fn) if isinstance(attn_fn, (list, tuple)) else [attn_fn] * len(self.layers)
        if len(fns) != len(self.layers):
            raise ValueError(f"{len(fns)} attention functions for {len(self.layers)} blocks")
        for layer, fn in zip(self.layers, fns):
            layer.attn.attn_fn = fn

    def attention_fns(self) -> list[AttentionFn]:
        """Each block's attention function, in order (what set_attention takes back)."""
        return [layer.attn.attn_fn for layer in self.layers]

    def set_norm_kernel(self, kernel: str) -> None:
        """Every RMSNorm's kernel (lwm.model.norm.NORM_KERNELS)."""
        if kernel not in NORM_KERNELS:
            raise ValueError(f"unknown norm kernel {kernel!r}; expected one of {NORM_KERNELS}")
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.kernel = kernel

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        targets: torch.Tensor | None = None,
        loss_coeff: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        loss_rows: torch.Tensor | None = None,
    ) -> torch.Tensor | LossOutput:
        """tokens (B, S) long; positions (S,) or (B, S) long, default arange(S); segment_ids (B, S)
        integers: packed documents attend only within themselves (None: one document).

        Returns logits (B, S, V); with `targets` (B, S), returns the chunked loss instead
        (see lwm.model.loss), which never materializes the full logits; loss_rows (n,): the flat
        positions that carry loss, the only ones the head runs on (None: all).
        """
        h = self.hidden(tokens, positions, segment_ids)
        if targets is None:
            return self.logits(h)  # (B, S, dim) -> (B, S, V)
        return chunked_cross_entropy(h, self.head_weight, targets, loss_coeff, self.config.loss_chunk_size, loss_rows)

    def hidden(
        self, tokens: torch.Tensor, positions: torch.Tensor | None = None, segment_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The final normalized hidden states (B, S, dim), before the output projection: what
        generation needs when only the last position's logits matter."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, seq), got shape {tuple(tokens.shape)}")
        B, S = tokens.shape
        if positions is None:
            positions = torch.arange(S, device=tokens.device)
        elif positions.shape not in ((S,), (B, S)):
            raise ValueError(
                f"positions must be ({S},) or ({B}, {S}) for tokens {tuple(tokens.shape)}, got {tuple(positions.shape)}"
            )
        if segment_ids is not None:
            check_segment_ids(segment_ids, B, S)
        c = self.config
        cos, sin = rope_angles(positions, c.head_dim, c.rope_theta, c.rope_scaling)  # (S, D/2) or (B, S, D/2)
        h = self.embed(tokens)  # (B, S) -> (B, S, dim)
        for layer in self.layers:
            h = layer(h, cos, sin, segment_ids)
        return self.norm(h)
