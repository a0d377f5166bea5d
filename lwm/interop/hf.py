"""Hugging Face LLaMA, Qwen2 and Qwen3 <-> lwm Transformer.

Our RoPE uses the same "rotate half" layout as transformers' LLaMA, so weights map one to one
through the key map below; no q/k permutation is needed.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import Vocab
from lwm.interop.hf_families import family_named, family_of, unsupported_options
from lwm.interop.hf_files import CONFIG, Shapes, header_shapes, read_hf_config, read_hf_weights, shard_files
from lwm.interop.hf_tokenizer import TokenIds, vision_text_size, write_tokenizer
from lwm.interop.keymap import KeyMap
from lwm.model import ModelConfig, RopeScaling, Transformer


def _keys(config: ModelConfig) -> KeyMap:
    return family_of(config).keys


def to_hf_state_dict(state_dict: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    return _keys(config).to_theirs(state_dict)


def from_hf_state_dict(state_dict: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    # Older checkpoints carry non-persistent RoPE buffers (derived, not weights); a tied checkpoint may
    # carry lm_head.weight, the embedding's copy.
    dropped = ("lm_head.weight",) if config.tie_embeddings else ()
    kept = {k: v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq") and k not in dropped}
    return _keys(config).to_ours(kept)


# ---------------------------------------------------------------------------------------- config


_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope(hf_config) -> tuple[float, RopeScaling | None]:
    """(rope_theta, rope_scaling) of a transformers config: plain RoPE ("default") or Llama 3.1's
    frequency scaling ("llama3"); transformers 5 reads an older config.json's rope_scaling into
    rope_parameters."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", "llama3"):
        raise ValueError(
            f"RoPE type {rope_type!r} is not supported; expected 'default' (plain theta) or 'llama3' (Llama 3.1's scaling)"
        )
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ValueError("the Hugging Face config has no rope_theta (in rope_parameters or at the top level)")
    if rope_type == "default":
        return float(theta), None
    missing = [k for k in _LLAMA3_KEYS if params.get(k) is None]
    if missing:
        raise ValueError(f"RoPE type 'llama3' needs {list(_LLAMA3_KEYS)} in rope_parameters; missing {missing}")
    scaling = RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_seq_len=params["original_max_position_embeddings"],
    )
    return float(theta), scaling


def _rope_parameters(config: ModelConfig) -> dict:
    """transformers' rope_parameters of `config`: the inverse of _rope."""
    theta = float(config.rope_theta)
    scaling = config.rope_scaling
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    return {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": scaling.factor,
        "low_freq_factor": scaling.low_freq_factor,
        "high_freq_factor": scaling.high_freq_factor,
        "original_max_position_embeddings": scaling.original_max_seq_len,
    }


def config_from_hf(hf_config, **overrides) -> ModelConfig:
    family = family_named(getattr(hf_config, "model_type", None), "the Hugging Face config")
    bad = unsupported_options(hf_config)
    if bad:
        raise ValueError(
            f"unsupported {family.model_type} options {bad}; the Transformer has no o_proj or MLP bias and "
            "attends to the whole context in every layer"
        )
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act must be 'silu', got {hf_config.hidden_act!r}")
    hidden, heads = hf_config.hidden_size, hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    theta, scaling = _rope(hf_config)
    fields = dict(
        dim=hidden,
        n_layers=hf_config.num_hidden_layers,
        n_heads=heads,
        n_kv_heads=hf_config.num_key_value_heads or heads,
        ffn_dim=hf_config.intermediate_size,
        vocab_size=hf_config.vocab_size,
        norm_eps=hf_config.rms_norm_eps,
        rope_theta=theta,
        rope_scaling=scaling,
        max_seq_len=hf_config.max_position_embeddings,
        qkv_bias=family.qkv_bias,
        qk_norm=family.qk_norm,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        head_dim_override=0 if head_dim * heads == hidden else head_dim,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def _config_named(hf_config, where: str, **overrides) -> ModelConfig:
    try:
        return config_from_hf(hf_config, **overrides)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def config_to_hf(config: ModelConfig, dtype: torch.dtype = torch.float32, ids: TokenIds = TokenIds(bos=1, eos=2)):
    """transformers' config of `config`'s family (lwm.interop.hf_families.family_of)."""
    from transformers import AutoConfig

    family = family_of(config)
    options = {"mlp_bias": False} if family.model_type == "llama" else {"use_sliding_window": False}
    if family.model_type != "qwen2":  # Qwen2's q/k/v bias is fixed by its family
        options["attention_bias"] = False
    return AutoConfig.for_model(
        family.model_type,
        vocab_size=config.vocab_size,
        hidden_size=config.dim,
        intermediate_size=config.ffn_dim,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads,
        head_dim=config.head_dim,
        hidden_act="silu",
        rms_norm_eps=config.norm_eps,
        max_position_embeddings=config.max_seq_len,
        rope_parameters=_rope_parameters(config),
        tie_word_embeddings=config.tie_embeddings,
        bos_token_id=ids.bos,
        eos_token_id=ids.eos,
        pad_token_id=ids.pad,
        dtype=dtype,
        architectures=[family.architecture],
        **options,
    )


# ---------------------------------------------------------------------------------------- import


def _layers(keys) -> list[int]:
    return sorted({int(m.group(1)) for k in keys if (m := re.match(r"layers\.(\d+)\.", k))})


def _expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our state dict's shapes for `config`, from a one-layer model on the meta device."""
    with torch.device("meta"):
        one = Transformer(config.replace(n_layers=1)).state_dict()
    shapes = {k: tuple(v.shape) for k, v in one.items() if not k.startswith("layers.0.")}
    layer = {k.removeprefix("layers.0."): tuple(v.shape) for k, v in one.items() if k.startswith("layers.0.")}
    return shapes | {f"layers.{i}.{k}": shape for i in range(config.n_layers) for k, shape in layer.items()}


def check_weights(shapes: Shapes, config: ModelConfig, where: str) -> None:
    """Refuse weights (Hugging Face key -> (shape, file)) that do not fit the checkpoint's own config,
    before a model is built: a config.json that claims 10^6 layers must not cost a 10^6-layer model."""
    ours, unexpected, keys = {}, [], _keys(config)
    for key, (shape, file) in shapes.items():
        if key.endswith("rotary_emb.inv_freq"):  # derived RoPE buffers some checkpoints carry
            continue
        if config.tie_embeddings and key == "lm_head.weight":  # a tied checkpoint's copy of the embedding
            continue
        try:
            ours[keys.our_key(key)] = (key, shape, file)
        except KeyError:
            unexpected.append(f"{key} ({file})")
    layers = _layers(ours)
    if layers != list(range(config.n_layers)):
        held = f"{len(layers)} layers ({', '.join(map(str, layers[:4]))}{', ...' if len(layers) > 4 else ''})"
        raise ValueError(
            f"{where}: num_hidden_layers {config.n_layers}, but the weights hold {held if layers else 'none'}"
        )
    expected = _expected_shapes(config)
    missing = [keys.their_key(k) for k in expected if k not in ours]
    unexpected += [f"{hf} ({file})" for k, (hf, _, file) in ours.items() if k not in expected]
    wrong = [
        f"{hf} in {file} is {shape}, expected {expected[k]}"
        for k, (hf, shape, file) in ours.items()
        if k in expected and shape != expected[k]
    ]
    problems = [f"missing {_few(missing)}"] * bool(missing) + [f"unexpected {_few(unexpected)}"] * bool(unexpected)
    problems += [_few(wrong, sep="; ")] * bool(wrong)
    if problems:
        raise ValueError(
            f"the weights do not match {where} (hidden_size {config.dim}, intermediate_size {config.ffn_dim}, "
            f"num_attention_heads {config.n_heads}, num_key_value_heads {config.n_kv_heads}, vocab_size "
            f"{config.vocab_size}): {'; '.join(problems)}"
        )


def check_hf_folder(folder) -> tuple[object, ModelConfig]:
    """A Hugging Face LLaMA folder checked as from_hf checks it, with nothing loaded or built: its
    config.json's fields, then its weights against that config (the shapes in the safetensors
    headers; pytorch_model*.bin files, whose shapes live in their pickles, by their size: each
    parameter takes at least 2 bytes). Returns transformers' config and ours. A config.json that
    claims 10^9 vocabulary rows beside small weights is refused here, before a caller that builds
    the model from the config alone (a training run's first stage) allocates them."""
    folder = Path(folder)
    hf_config, where = read_hf_config(folder), str(folder / CONFIG)
    config = _config_named(hf_config, where)
    files = shard_files(folder)
    if all(file.suffix == ".safetensors" for file in files):
        check_weights(header_shapes(files), config, where)
    else:
        params = sum(math.prod(shape) for shape in _expected_shapes(config).values())
        held = sum(file.stat().st_size for file in files)
        if 2 * params > held:
            raise ValueError(
                f"{where} describes {params:,} parameters (hidden_size {config.dim}, intermediate_size "
                f"{config.ffn_dim}, num_hidden_layers {config.n_layers}, vocab_size {config.vocab_size}), at "
                f"least {2 * params:,} bytes, but its weights files ({_few([f.name for f in files])}) hold {held:,}"
            )
    return hf_config, config


def folder_text_size(folder, rows: int) -> int:
    """How many of a text-only folder's `rows` embedding rows are text ids: its tokenizer's size when it
    has one (a base pads its embedding past the tokenizer: Qwen2.5's 152064 rows hold 151665 ids), else
    all of them."""
    folder = Path(folder)
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
        return rows
    text = TextTokenizer(folder).vocab_size
    if text > rows:
        raise ValueError(f"the tokenizer of {folder} has {text} ids, but {folder / CONFIG} has vocab_size {rows}")
    return text


def start_config(folder) -> tuple[ModelConfig, int | None]:
    """A Hugging Face folder as a training run's start, checked with nothing loaded: our config with the
    vocabulary a run trains (LWM's layout: text ids, vision codes, specials, padding), and the text ids
    from_hf keeps before it adds the vision rows (a text-only folder), or None: the folder has the rows."""
    hf_config, stored = check_hf_folder(folder)
    text = vision_text_size(folder)
    if text is None:
        text = folder_text_size(folder, hf_config.vocab_size)
        return stored.replace(vocab_size=Vocab(text).size), text
    if Vocab(text).size != hf_config.vocab_size:
        raise ValueError(
            f"{Path(folder) / CONFIG} has vocab_size {hf_config.vocab_size}, but its tokenizer's vision codes "
            f"start at id {text}, which makes {Vocab(text).size} rows"
        )
    return stored, None


def _few(items: list[str], limit: int = 4, sep: str = ", ") -> str:
    return sep.join(items[:limit]) + (f"{sep}and {len(items) - limit} more" if len(items) > limit else "")


def extend_vocab_rows(weight: torch.Tensor, new_rows: int, noise: float = 0.01, generator=None) -> torch.Tensor:
    """(V, D) -> (V + new_rows, D): new rows are the mean of the old ones plus small noise
    (noise x the per-dimension std of the old rows)."""
    w = weight.float()
    mean, std = w.mean(0), w.std(0)
    fresh = mean + noise * std * torch.randn(new_rows, w.shape[1], generator=generator, dtype=torch.float32)
    return torch.cat([w, fresh]).to(weight.dtype)


def from_hf(
    path_or_model,
    *,
    extend_vocab: bool = False,
    text_size: int | None = None,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    **overrides,
) -> Transformer:
    """A Transformer from a Hugging Face folder or a transformers model of a family in
    lwm.interop.hf_families (LLaMA, Qwen2, Qwen3).

    extend_vocab: the checkpoint's vocabulary is text only (LLaMA-2, 32000 ids); keep its first
    `text_size` rows (default: all; a base that pads its embedding past its tokenizer keeps the
    tokenizer's ids), then grow the embedding and output to lwm.data.Vocab(text_size).size, the vision
    and special rows starting at the mean of the text rows plus small noise. overrides change config
    fields (e.g. rope_theta for the next context stage).
    """
    if isinstance(path_or_model, (str, Path)):
        folder = Path(path_or_model)
        hf_config, where = read_hf_config(folder), str(folder / CONFIG)
        stored = _config_named(hf_config, where)  # the config the weights were saved with
        state = read_hf_weights(folder, lambda shapes: check_weights(shapes, stored, where))
    else:
        hf_config, state, where = path_or_model.config, path_or_model.state_dict(), "the model's config"
        stored = _config_named(hf_config, where)
        check_weights({k: (tuple(v.shape), "the model") for k, v in state.items()}, stored, where)
    state = from_hf_state_dict(state, stored)
    if extend_vocab:
        text_size = hf_config.vocab_size if text_size is None else text_size
        if not 0 < text_size <= hf_config.vocab_size:
            raise ValueError(f"text_size {text_size} must be in [1, {hf_config.vocab_size}] (the checkpoint's rows)")
        vocab = Vocab(text_size)
        overrides.setdefault("vocab_size", vocab.size)
        g = torch.Generator().manual_seed(seed)
        for key in ("embed.weight", "output.weight"):
            if key in state:  # a tied head has no weight of its own
                state[key] = extend_vocab_rows(state[key][:text_size], vocab.size - text_size, generator=g)
    config = _config_named(hf_config, where, **overrides)
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    with torch.device("meta"):
        model = Transformer(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model


# ---------------------------------------------------------------------------------------- export


def to_hf(
    model: Transformer,
    out_dir,
    tokenizer_model=None,
    dtype: torch.dtype | None = None,
    max_shard_size: str = "5GB",
    prompt: str = "native",
    generation: dict | None = None,
) -> Path:
    """Write `model` as a Hugging Face LlamaForCausalLM folder (config, safetensors shards,
    generation config with `generation`'s extra fields; with a sentencepiece `tokenizer_model`, a
    tokenizer whose added tokens are the vision codes and special tokens at the ids of
    lwm.data.Vocab, as `prompt` style writes them)."""
    from huggingface_hub import save_torch_state_dict
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype) if dtype is not None else v.detach() for k, v in model.state_dict().items()}
    dtype = dtype or next(iter(state.values())).dtype
    ids = TokenIds(bos=1, eos=2)  # LLaMA-2's, for a folder without a tokenizer
    if tokenizer_model is not None:
        ids = write_tokenizer(Path(tokenizer_model), model.config.vocab_size, out_dir, prompt)
    hf_config = config_to_hf(model.config, dtype=dtype, ids=ids)
    hf_config.save_pretrained(out_dir)
    GenerationConfig(
        bos_token_id=ids.bos, eos_token_id=ids.eos, pad_token_id=ids.pad, **(generation or {})
    ).save_pretrained(out_dir)
    save_torch_state_dict(to_hf_state_dict(state, model.config), out_dir, max_shard_size=max_shard_size)
    return out_dir
