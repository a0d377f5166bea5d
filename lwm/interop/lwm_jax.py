"""LWM's Jax models (LWM-Text-*-Jax, LWM-Chat-*-Jax) -> lwm Transformer, leaf by leaf.

LWM's parameter tree, as its lwm/llama.py and lwm/vision_llama.py build it:

    transformer/wte/embedding            (V, D)     text embedding
    transformer/vte/embedding            (Vv, D)    vision embedding (vision-language models)
    transformer/h/scan_decoder/<layer>   (L, ...)   every layer stacked (scanned layers, as released)
    transformer/h/<i>/<layer>            (...)      or one subtree per layer
    transformer/ln_f/kernel              (D,)
    lm_head/kernel                       (D, V)     text logits
    vision_head/kernel                   (D, Vv)    vision logits, from the same hidden state

Dense kernels are (in, out): ours are their transpose. LWM's RoPE rotates adjacent pairs (2i, 2i+1)
of each head; ours (and Hugging Face's) rotates halves (i, i + head_dim/2), so the output rows of
wq and wk are reordered within each head; q.k is unchanged.

Vocabulary: text ids stay; LWM's vision id c (c < 8192 a code, 8192 end of frame, 8193 end of video)
becomes text_size + c, which is lwm.data.Vocab's layout (codes, <eof>, <eov>). LWM's vision rows
from 8194 on are never produced by its tokenizer and are dropped; our <vision> / </vision> rows and
the padding rows stay zero (LWM writes those markers as text). A text-only checkpoint keeps its
V rows, a plain LLaMA.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

from lwm.data.vocab import Vocab
from lwm.interop.lwm_params import LWMConfig
from lwm.model import ModelConfig

LWM_VISION_IDS = 8194  # 8192 codes, end of frame, end of video

# LWM's per-layer leaf -> (our key, how it converts)
_LAYER = {
    "attention/wq/kernel": ("layers.{i}.attn.wq.weight", "rope"),
    "attention/wk/kernel": ("layers.{i}.attn.wk.weight", "rope"),
    "attention/wv/kernel": ("layers.{i}.attn.wv.weight", "dense"),
    "attention/wo/kernel": ("layers.{i}.attn.wo.weight", "dense"),
    "feed_forward/w1/kernel": ("layers.{i}.mlp.w1.weight", "dense"),
    "feed_forward/w2/kernel": ("layers.{i}.mlp.w2.weight", "dense"),
    "feed_forward/w3/kernel": ("layers.{i}.mlp.w3.weight", "dense"),
    "attention_norm/kernel": ("layers.{i}.attn_norm.weight", "copy"),
    "ffn_norm/kernel": ("layers.{i}.mlp_norm.weight", "copy"),
}
_TOP = {
    "transformer/wte/embedding": "wte",
    "transformer/vte/embedding": "vte",
    "transformer/ln_f/kernel": "ln_f",
    "lm_head/kernel": "lm_head",
    "vision_head/kernel": "vision_head",
}
_SCANNED = re.compile(r"^transformer/h/scan_decoder/(?P<leaf>.+)$")
_UNSCANNED = re.compile(r"^transformer/h/(?P<i>\d{1,9})/(?P<leaf>.+)$")


def model_config(cfg: LWMConfig, vision: bool) -> ModelConfig:
    return ModelConfig(
        dim=cfg.hidden_size,
        n_layers=cfg.num_hidden_layers,
        n_heads=cfg.num_attention_heads,
        n_kv_heads=cfg.num_attention_heads,
        ffn_dim=cfg.intermediate_size,
        vocab_size=Vocab(cfg.vocab_size).size if vision else cfg.vocab_size,
        norm_eps=cfg.rms_norm_eps,
        rope_theta=float(cfg.theta),
        max_seq_len=cfg.max_sequence_length,
    )


def _layer_shape(cfg: LWMConfig, leaf: str) -> tuple[int, ...]:
    D, F = cfg.hidden_size, cfg.intermediate_size
    if leaf.endswith("norm/kernel"):
        return (D,)
    return {"feed_forward/w1/kernel": (D, F), "feed_forward/w3/kernel": (D, F), "feed_forward/w2/kernel": (F, D)}.get(
        leaf, (D, D)
    )


def _top_shape(cfg: LWMConfig, what: str) -> tuple[int, ...]:
    D, V, Vv = cfg.hidden_size, cfg.vocab_size, cfg.vision_vocab_size
    return {"wte": (V, D), "vte": (Vv, D), "ln_f": (D,), "lm_head": (D, V), "vision_head": (D, Vv)}[what]


def _check(where: str, got: torch.Tensor, want: tuple[int, ...], cfg: LWMConfig) -> None:
    if tuple(got.shape) != want:
        raise ValueError(
            f"{where}: shape {tuple(got.shape)} in the checkpoint, but the config (hidden_size {cfg.hidden_size}, "
            f"intermediate_size {cfg.intermediate_size}, num_hidden_layers {cfg.num_hidden_layers}, vocab_size "
            f"{cfg.vocab_size}, vision_vocab_size {cfg.vision_vocab_size}) gives {want}"
        )


def rope_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(H*hd, D) rows in LWM's pair order (2i, 2i+1) -> rotate-half order (i, i + hd/2) per head."""
    out, D = weight.shape
    hd = out // n_heads
    return weight.reshape(n_heads, hd // 2, 2, D).transpose(1, 2).reshape(out, D)  # (H, hd/2, 2, D) -> (H, 2, hd/2, D)


def _layer_weight(kernel: torch.Tensor, kind: str, cfg: LWMConfig) -> torch.Tensor:
    weight = kernel if kind == "copy" else kernel.T  # (in, out) -> (out, in)
    if kind == "rope":
        weight = rope_rows(weight, cfg.num_attention_heads)
    return weight.clone(memory_format=torch.contiguous_format)  # its own memory: the leaf's bytes are let go


def convert_params(
    leaves: Iterable[tuple[str, torch.Tensor]],
    cfg: LWMConfig,
    dtype: torch.dtype | None = None,
    source: str = "the checkpoint",
) -> tuple[dict[str, torch.Tensor], ModelConfig, list[str]]:
    """LWM's parameter leaves (lwm.interop.lwm_params.read_params) -> (our state dict, its model
    config, notes on what was dropped). Each leaf is converted as it arrives and then let go.
    Errors name `source` (the checkpoint file) and the leaf."""
    L = cfg.num_hidden_layers
    state: dict[str, torch.Tensor] = {}
    top: dict[str, torch.Tensor] = {}
    seen: set[str] = set()
    for name, leaf in leaves:
        where = f"{source}: {name}"
        if name in seen:
            raise ValueError(f"{where}: the leaf appears twice")
        seen.add(name)
        leaf = leaf.to(dtype) if dtype is not None else leaf
        if name in _TOP:
            _check(where, leaf, _top_shape(cfg, _TOP[name]), cfg)
            top[_TOP[name]] = leaf  # kept whole: its record's buffer is exactly its size
            continue
        m = _SCANNED.match(name) or _UNSCANNED.match(name)
        if m is None or m["leaf"] not in _LAYER:
            raise ValueError(
                f"{where}: not a parameter of LWM's LLaMA / VideoLLaMA (expected {sorted(_TOP)} or "
                f"transformer/h/(scan_decoder|<i>)/{{{', '.join(sorted(_LAYER))}}})"
            )
        key, kind = _LAYER[m["leaf"]]
        per_layer = _layer_shape(cfg, m["leaf"])
        if m.groupdict().get("i") is None:  # scanned: the layer axis is param_scan_axis
            if leaf.dim() == len(per_layer) + 1 and cfg.param_scan_axis == 1:
                leaf = leaf.movedim(1, 0)
            _check(where, leaf, (L, *per_layer), cfg)
            for i in range(L):
                state[key.format(i=i)] = _layer_weight(leaf[i], kind, cfg)
        else:
            i = int(m["i"])
            if i >= L:
                raise ValueError(f"{where}: layer {i}, but the config has num_hidden_layers {L}")
            _check(where, leaf, per_layer, cfg)
            state[key.format(i=i)] = _layer_weight(leaf, kind, cfg)
        del leaf
    missing = [k for k in ("wte", "ln_f", "lm_head") if k not in top]
    missing += [key.format(i=i) for i in range(L) for key, _ in _LAYER.values() if key.format(i=i) not in state]
    vision = "vte" in top or "vision_head" in top
    if vision:
        missing += [k for k in ("vte", "vision_head") if k not in top]
    if missing:
        raise ValueError(f"{source} lacks {len(missing)} parameters: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    notes: list[str] = []
    state["norm.weight"] = top["ln_f"]
    text_out = top["lm_head"].T  # (D, V) -> (V, D)
    if not vision:
        state["embed.weight"], state["output.weight"] = top["wte"], text_out.contiguous()
    else:
        if cfg.vision_vocab_size < LWM_VISION_IDS:
            raise ValueError(
                f"{source}: vision_vocab_size {cfg.vision_vocab_size} < {LWM_VISION_IDS} (8192 codes, end of frame, end of video)"
            )
        vocab = Vocab(cfg.vocab_size)

        def rows(text: torch.Tensor, vis: torch.Tensor) -> torch.Tensor:  # (V, D), (Vv, D) -> (Vocab.size, D)
            unused = text.new_zeros(vocab.size - cfg.vocab_size - LWM_VISION_IDS, text.shape[1])
            return torch.cat([text, vis[:LWM_VISION_IDS], unused])

        state["embed.weight"] = rows(top["wte"], top["vte"])  # (V + 8194 + unused, D)
        state["output.weight"] = rows(text_out, top["vision_head"].T)
        notes.append(
            f"LWM's vision rows {LWM_VISION_IDS}..{cfg.vision_vocab_size - 1} (never produced by its "
            f"tokenizer) were dropped; ids {vocab.vision_start} and {vocab.vision_end} (<vision>, </vision>) "
            f"and {vocab.used_size}..{vocab.size - 1} (padding) are zero rows"
        )
    return state, model_config(cfg, vision), notes
