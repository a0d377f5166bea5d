"""Model configuration: one dataclass, named presets, validated on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (Hugging Face rope_type "llama3"): wavelengths longer than
    original_max_seq_len / low_freq_factor are stretched by `factor`, those shorter than
    original_max_seq_len / high_freq_factor kept, and those between blended smoothly. Llama-3.1
    ships factor 8, low 1, high 4, original 8192."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_seq_len: int = 8192

    def __post_init__(self) -> None:
        if not self.factor >= 1:
            raise ValueError(f"RopeScaling.factor must be >= 1, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                f"RopeScaling needs 0 < low_freq_factor < high_freq_factor, got low_freq_factor "
                f"{self.low_freq_factor} and high_freq_factor {self.high_freq_factor}"
            )
        if not isinstance(self.original_max_seq_len, int) or self.original_max_seq_len <= 0:
            raise ValueError(
                f"RopeScaling.original_max_seq_len must be a positive integer, got {self.original_max_seq_len!r}"
            )


@dataclass
class ModelConfig:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 32
    ffn_dim: int = 11008
    vocab_size: int = 40256
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # Llama 3.1's frequency scaling of RoPE (lwm.model.rope); None: plain RoPE of rope_theta.
    rope_scaling: RopeScaling | None = None
    max_seq_len: int = 4096
    # Blockwise MLP: run the MLP over sequence chunks of this size, recomputed in backward (0: off).
    mlp_chunk_size: int = 0
    # Head-tiled attention: the attention (projections, RoPE, attention, output projection) runs over
    # this many groups of heads, one at a time, each recomputed in backward (1: off; divides n_kv_heads).
    attn_head_groups: int = 1
    # Sequence-tiled RMSNorm: the norms run over chunks of this many tokens, each recomputed in
    # backward, so their fp32 work lives for one chunk at a time (0: off).
    norm_chunk_size: int = 0
    # Tokens per chunk in the chunked cross entropy; the (B, S, V) logits never exist at once.
    loss_chunk_size: int = 1024
    # The family's options (lwm.interop.hf maps each family's checkpoints): a bias on the q/k/v
    # projections (Qwen2, Qwen2.5), an RMSNorm over each head's q and k before RoPE (Qwen3), the
    # output head sharing the embedding's weight (Llama-3.2 1B/3B, small Qwen models).
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    # Width of a head; 0: dim // n_heads (LLaMA). Qwen3 sets it apart from dim (e.g. 4B: 2560 / 32 heads of 128).
    head_dim_override: int = 0

    def __post_init__(self) -> None:
        positive = (
            "dim",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "ffn_dim",
            "vocab_size",
            "max_seq_len",
            "loss_chunk_size",
            "attn_head_groups",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        for name in ("qkv_bias", "qk_norm", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ModelConfig.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("mlp_chunk_size", "norm_chunk_size", "head_dim_override"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"ModelConfig.{name} must be an integer >= 0 (0 = off), got {getattr(self, name)!r}")
        if self.norm_eps <= 0:
            raise ValueError(f"ModelConfig.norm_eps must be > 0, got {self.norm_eps}")
        if self.rope_theta <= 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError(f"ModelConfig.rope_scaling must be a RopeScaling or None, got {self.rope_scaling!r}")
        if not self.head_dim_override and self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads} (or set head_dim_override)")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.n_kv_heads % self.attn_head_groups:
            raise ValueError(
                f"attn_head_groups {self.attn_head_groups} does not divide n_kv_heads {self.n_kv_heads} "
                f"(each group takes whole kv heads and their queries)"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim {self.head_dim} (dim {self.dim}, n_heads {self.n_heads}, head_dim_override "
                f"{self.head_dim_override}) must be even for RoPE"
            )

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.dim // self.n_heads

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; expected one of {sorted(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Parameter count, computed from the shapes (no model needed)."""
        attn = self.dim * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        attn += self.qkv_bias * self.head_dim * (self.n_heads + 2 * self.n_kv_heads) + self.qk_norm * 2 * self.head_dim
        mlp = 3 * self.dim * self.ffn_dim
        block = attn + mlp + 2 * self.dim
        return self.n_layers * block + (1 if self.tie_embeddings else 2) * self.vocab_size * self.dim + self.dim


# Vocabulary sizes are lwm.data.Vocab(text_size).size: text ids + 8192 vision codes + 4 specials,
# padded to a multiple of 64 (tests check the two agree).
PRESETS: dict[str, ModelConfig] = {
    # Tests: two layers, GQA (4 query heads share 2 kv heads), a 256-id text vocabulary.
    "debug": ModelConfig(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=176, vocab_size=8512, max_seq_len=2048, loss_chunk_size=256
    ),
    # The CPU demo model (about 9M parameters, 4K-id text vocabulary).
    "tiny": ModelConfig(
        dim=256,
        n_layers=4,
        n_heads=8,
        n_kv_heads=4,
        ffn_dim=704,
        vocab_size=12352,
        max_seq_len=8192,
        loss_chunk_size=1024,
    ),
    # LLaMA-2 7B shapes with LWM's extended vocabulary (32000 text ids + vision + specials).
    "7b": ModelConfig(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=32,
        ffn_dim=11008,
        vocab_size=40256,
        norm_eps=1e-6,
        max_seq_len=4096,
    ),
    # Llama-3.1-8B shapes (grouped-query attention, 8 kv heads; its RoPE scaling) with the vision
    # rows after its 128256 text ids: the model ALST's long-sequence runs train, and the shapes of
    # a start from Llama-3.1 weights (lwm.interop.hf.from_hf(..., extend_vocab=True)).
    "llama3_8b": ModelConfig(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=14336,
        vocab_size=136512,
        norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_seq_len=8192),
        max_seq_len=131072,  # Llama-3.1's trained context (max_position_embeddings)
        loss_chunk_size=1024,  # 1024 x 136512 fp32 logits: 0.56 GB a chunk
    ),
    # Qwen2.5-7B shapes (28 query heads sharing 4 kv heads, a bias on q/k/v) with the vision rows
    # after its tokenizer's 151665 ids (151643 + 22 added; its 152064-row embedding's padding is dropped).
    "qwen2_5_7b": ModelConfig(
        dim=3584,
        n_layers=28,
        n_heads=28,
        n_kv_heads=4,
        ffn_dim=18944,
        vocab_size=159872,
        norm_eps=1e-6,
        rope_theta=1e6,
        max_seq_len=32768,  # Qwen2.5-7B's max_position_embeddings
        loss_chunk_size=1024,  # 1024 x 159872 fp32 logits: 0.65 GB a chunk
        qkv_bias=True,
    ),
    # Qwen3-8B shapes (32 query heads sharing 8 kv heads, QK norm) with the vision rows after its
    # tokenizer's 151669 ids (151643 + 26 added; its 151936-row embedding's padding is dropped).
    "qwen3_8b": ModelConfig(
        dim=4096,
        n_layers=36,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=12288,
        vocab_size=159872,
        norm_eps=1e-6,
        rope_theta=1e6,
        max_seq_len=40960,  # Qwen3-8B's max_position_embeddings
        loss_chunk_size=1024,
        qk_norm=True,
    ),
}
