"""The Hugging Face model families the one Transformer reads and writes: LLaMA (LLaMA-2, Llama-3.x),
Qwen2 (Qwen2, Qwen2.5: a bias on q/k/v) and Qwen3 (an RMSNorm over each head's q and k). A family
is a model_type, the options of ModelConfig it fixes, and its key map; tying the output head to the
embedding is an option of every family (tie_word_embeddings)."""

from __future__ import annotations

from dataclasses import dataclass

from lwm.interop.keymap import KeyMap
from lwm.model import ModelConfig

# ours -> transformers', for every family; "{i}" is the layer index.
BASE_KEYS = {
    "embed.weight": "model.embed_tokens.weight",
    "layers.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "layers.{i}.attn.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.attn.wk.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.attn.wv.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.attn.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.mlp_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "layers.{i}.mlp.w1.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.mlp.w3.weight": "model.layers.{i}.mlp.up_proj.weight",
    "layers.{i}.mlp.w2.weight": "model.layers.{i}.mlp.down_proj.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
QKV_BIAS_KEYS = {f"layers.{{i}}.attn.w{x}.bias": f"model.layers.{{i}}.self_attn.{x}_proj.bias" for x in "qkv"}
QK_NORM_KEYS = {f"layers.{{i}}.attn.{x}_norm.weight": f"model.layers.{{i}}.self_attn.{x}_norm.weight" for x in "qk"}


@dataclass(frozen=True)
class Family:
    model_type: str
    architecture: str  # transformers' class, written to config.json's "architectures"
    qkv_bias: bool
    qk_norm: bool
    keys: KeyMap


FAMILIES = {
    f.model_type: f
    for f in (
        Family("llama", "LlamaForCausalLM", False, False, KeyMap(BASE_KEYS, theirs="LLaMA")),
        Family("qwen2", "Qwen2ForCausalLM", True, False, KeyMap(BASE_KEYS | QKV_BIAS_KEYS, theirs="Qwen2")),
        Family("qwen3", "Qwen3ForCausalLM", False, True, KeyMap(BASE_KEYS | QK_NORM_KEYS, theirs="Qwen3")),
    )
}
MODEL_TYPES = tuple(FAMILIES)


def family_named(model_type, where: str) -> Family:
    if model_type not in FAMILIES:
        raise ValueError(f"{where}: model_type is {model_type!r:.80}; the model types taken are {list(MODEL_TYPES)}")
    return FAMILIES[model_type]


def family_of(config: ModelConfig) -> Family:
    """The family whose checkpoints hold `config`'s model."""
    for family in FAMILIES.values():
        if (family.qkv_bias, family.qk_norm) == (config.qkv_bias, config.qk_norm):
            return family
    raise ValueError(
        f"no Hugging Face family has both qkv_bias and qk_norm (qwen2 has the bias, qwen3 the norm); "
        f"got qkv_bias {config.qkv_bias}, qk_norm {config.qk_norm}"
    )


def unsupported_options(hf_config) -> dict:
    """Options of a checkpoint's config that the Transformer does not compute, with their values."""
    model_type = getattr(hf_config, "model_type", None)
    options = {
        "mlp_bias": getattr(hf_config, "mlp_bias", False),
        "use_sliding_window": getattr(hf_config, "use_sliding_window", False),
    }
    if model_type != "qwen2":  # Qwen2's q/k/v bias is its family's; attention_bias elsewhere adds o_proj's too
        options["attention_bias"] = getattr(hf_config, "attention_bias", False)
    layer_types = getattr(hf_config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        options["layer_types"] = sorted(set(layer_types))
    return {k: v for k, v in options.items() if v}
