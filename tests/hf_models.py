"""Tiny random models of each Hugging Face family the project reads and writes, made locally with
transformers (no downloads), and the debug model with each family's options."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from lwm.data import Vocab
from lwm.model import ModelConfig, Transformer

VOCAB = Vocab(256)  # 8512 rows: the debug preset's
# Llama 3.1's RoPE scaling at a small scale (runs past original_max_position_embeddings in 1K tokens).
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500_000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}
# name: (model_type, the config's family options)
FAMILIES = {
    "llama3": ("llama", {"rope_parameters": LLAMA3_ROPE}),
    "llama3_2_tied": ("llama", {"rope_parameters": LLAMA3_ROPE, "tie_word_embeddings": True}),
    "qwen2": ("qwen2", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    # head_dim 32 with hidden 64 and 4 heads: Qwen3's heads are wider than hidden / heads
    "qwen3": ("qwen3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "head_dim": 32}),
}
# The same options on our side, on the debug preset.
OPTIONS = {
    "llama3": {},
    "llama3_2_tied": {"tie_embeddings": True},
    "qwen2": {"qkv_bias": True},
    "qwen3": {"qk_norm": True, "head_dim_override": 32},
    "qwen3_tied": {"qk_norm": True, "head_dim_override": 32, "tie_embeddings": True},  # Qwen3 0.6B-4B are tied
}


@torch.no_grad()
def perturb_vectors(model: torch.nn.Module, seed: int = 1) -> None:
    """Give biases and norm weights values far from their initial 0 and 1, so a test sees them."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))


def tiny_hf(name: str, vocab_size: int = VOCAB.size, **kw):
    """A transformers model of family `name` (FAMILIES), random weights, eval mode."""
    model_type, options = FAMILIES[name]
    head = {k: v for k, v in options.items() if k != "head_dim"}
    config = AutoConfig.for_model(
        model_type,
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=options.get("head_dim", 16),
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        **head,
        **kw,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    perturb_vectors(model)
    return model


def family_config(name: str, **changes) -> ModelConfig:
    """The debug preset with family `name`'s options."""
    return ModelConfig.from_preset("debug", **OPTIONS[name], **changes)


def family_model(name: str, **changes) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(family_config(name, **changes))
    perturb_vectors(model)
    return model
