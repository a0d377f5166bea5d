"""Self-attention with a replaceable attention function.

The attention function takes q (B, Hq, S, D) and k, v (B, Hkv, S, D) with Hq a multiple of Hkv
and returns (B, Hq, S, D); given `segment_ids` (B, S), packed documents attend only within
themselves. The model only ever calls it; lwm.parallel swaps in ring or Ulysses attention from
outside with `Transformer.set_attention`.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lwm.model.config import ModelConfig
from lwm.model.documents import document_attention
from lwm.model.norm import RMSNorm
from lwm.model.rope import apply_rope

AttentionFn = Callable[..., torch.Tensor]  # attn(q, k, v, causal, segment_ids=None) -> out


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    segment_ids: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Local attention on one process (PyTorch SDPA); k/v may have fewer heads than q."""
    if segment_ids is not None:
        return document_attention(q, k, v, segment_ids, causal, scale)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.head_groups = config.attn_head_groups
        bias = config.qkv_bias
        self.wq = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=bias)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=bias)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=bias)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)
        # Qwen3's QK norm: one RMSNorm over head_dim, shared by every q head (and one by every k head).
        self.q_norm = RMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None
        self.attn_fn: AttentionFn = sdpa_attention
        self.rope = apply_rope  # (x, cos, sin) -> x rotated; a compiled one where blocks are compiled
        # the head groups' checkpoints' context_fn (torch.utils.checkpoint), set by whoever wraps the block
        self.group_context_fn = None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segment_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.head_groups == 1:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
            return self.wo(self._attend(q, k, v, cos, sin, segment_ids))
        # Head-tiled: one group of heads at a time, each recomputed in backward, so only one group's
        # q/k/v, attention output and the attention's scratch (a ring's fp32 sums) live at once.
        out = None
        for g in range(self.head_groups):
            if torch.is_grad_enabled():
                options = {} if self.group_context_fn is None else {"context_fn": self.group_context_fn}
                part = checkpoint(self._group, x, cos, sin, segment_ids, g, use_reentrant=False, **options)
            else:
                part = self._group(x, cos, sin, segment_ids, g)
            out = part if out is None else out + part
        return out

    def _group(self, x, cos, sin, segment_ids, g: int) -> torch.Tensor:
        """Group g's share of the output: its heads' attention through their rows of wq/wk/wv and
        columns of wo. (B, S, dim) -> (B, S, dim)"""
        q_rows = self.n_heads // self.head_groups * self.head_dim
        kv_rows = self.n_kv_heads // self.head_groups * self.head_dim
        qs, kvs = slice(g * q_rows, (g + 1) * q_rows), slice(g * kv_rows, (g + 1) * kv_rows)
        q = F.linear(x, self.wq.weight[qs], _rows(self.wq.bias, qs))
        k, v = (
            F.linear(x, self.wk.weight[kvs], _rows(self.wk.bias, kvs)),
            F.linear(x, self.wv.weight[kvs], _rows(self.wv.bias, kvs)),
        )
        return F.linear(self._attend(q, k, v, cos, sin, segment_ids), self.wo.weight[:, qs])

    def _attend(self, q, k, v, cos, sin, segment_ids) -> torch.Tensor:
        """Projected q (B, S, Hq*D), k/v (B, S, Hkv*D) -> attention output (B, S, Hq*D)."""
        B, S, _ = q.shape
        q = q.view(B, S, -1, self.head_dim)  # (B, S, H*D) -> (B, S, H, D)
        k = k.view(B, S, -1, self.head_dim)  # (B, S, Hkv, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, S, H, D) -> (B, H, S, D)
        v = v.view(B, S, -1, self.head_dim).transpose(1, 2)  # (B, Hkv, S, D)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        # Without segment ids the call is the plain one, so attention functions that know no
        # documents (the KV-cache paths of generation) keep working.
        out = (
            self.attn_fn(q, k, v, causal=True)
            if segment_ids is None
            else self.attn_fn(q, k, v, causal=True, segment_ids=segment_ids)
        )  # (B, H, S, D)
        return out.transpose(1, 2).reshape(B, S, -1)  # (B, H, S, D) -> (B, S, H*D)

    def init_weights(self, std: float, out_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.normal_(linear.weight, std=std)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        nn.init.normal_(self.wo.weight, std=out_std)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.reset_parameters()


def _rows(bias: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return None if bias is None else bias[rows]
