"""A Hugging Face model folder (LLaMA, Qwen2, Qwen3) read as untrusted input, before any weight is loaded or any model
built: config.json's fields, the shard files model.safetensors.index.json names (files inside the
folder only), and each weight's shape and dtype from the safetensors headers (no data read).

    hf_config = read_hf_config(folder)                # fields checked, then transformers' AutoConfig
    state = read_hf_weights(folder, check)            # check({key: (shape, file)}) runs first
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import torch
from safetensors import SafetensorError, safe_open

from lwm.disk.weights import check_safetensors, read_weights
from lwm.interop.hf_families import family_named

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
# Fields that size the model: a wrong type or a zero fails here, named, instead of inside transformers.
_POSITIVE_INTS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
)
_FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")  # safetensors' names

Shapes = dict[str, tuple[tuple[int, ...], str]]  # Hugging Face key -> (shape, the file holding it)


def read_json_object(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds a JSON {type(raw).__name__}, expected an object")
    return raw


def _is_positive(value, integer: bool) -> bool:
    kinds = (int,) if integer else (int, float)
    return type(value) in kinds and 0 < value < math.inf


def check_config_fields(raw: dict, path: Path) -> None:
    """The fields of a config.json that shape the model: a model_type of lwm.interop.hf_families, positive
    integers (a missing one takes transformers' default; num_key_value_heads and head_dim may be null),
    positive eps and theta."""
    family_named(raw.get("model_type"), str(path))
    for name in _POSITIVE_INTS:
        if raw.get(name) is not None and not _is_positive(raw[name], integer=True):
            raise ValueError(f"{path}: {name} must be a positive integer, got {raw[name]!r:.80}")
    heads, kv_heads, hidden = raw.get("num_attention_heads"), raw.get("num_key_value_heads"), raw.get("hidden_size")
    if heads is not None and hidden is not None and hidden % heads:
        raise ValueError(f"{path}: num_attention_heads {heads} must divide hidden_size {hidden}")
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise ValueError(f"{path}: num_key_value_heads {kv_heads} must divide num_attention_heads {heads}")
    for name in ("rope_parameters", "rope_scaling"):  # rope_scaling: the older name transformers reads too
        value = raw.get(name)
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{path}: {name} must be an object (or null), got {value!r:.80}")
        kind = (value or {}).get("rope_type", (value or {}).get("type", "default"))
        if not isinstance(kind, str):
            raise ValueError(f"{path}: {name}'s rope_type must be a string, got {kind!r:.80}")
    rope = raw.get("rope_parameters") or {}
    for name, value in (
        ("rms_norm_eps", raw.get("rms_norm_eps")),
        ("rope_theta", rope.get("rope_theta", raw.get("rope_theta"))),
    ):
        if value is not None and not _is_positive(value, integer=False):
            raise ValueError(f"{path}: {name} must be a positive number, got {value!r:.80}")


def read_hf_config(folder: Path):
    """transformers' config of a model folder, its fields checked first."""
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a Hugging Face model folder (no config.json)")
    check_config_fields(read_json_object(path), path)
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder)
    except (TypeError, ValueError, StrictDataclassError) as e:  # transformers' own field checks
        raise ValueError(f"{path}: {' '.join(str(e).split())}") from None


def stays_inside(name) -> bool:
    """A name of a file in a model folder that stays in the folder: relative, without '..' (symlinks
    in the folder are its owner's: a Hugging Face cache snapshot is made of them)."""
    if not isinstance(name, str) or not name or "\0" in name:
        return False
    parts = PurePosixPath(name)
    return not parts.is_absolute() and ".." not in parts.parts and "\\" not in name


def shard_files(folder: Path) -> list[Path]:
    """The weights files of a folder: the index's shards, model.safetensors or pytorch_model*.bin."""
    index = folder / INDEX
    if index.exists():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no 'weight_map' (an object of tensor name -> shard file)")
        for key, shard in weight_map.items():
            if not (stays_inside(shard) and shard.endswith(".safetensors")):
                raise ValueError(
                    f"{index}: weight_map entry {key!r:.200} names {shard!r:.200}; a shard is a .safetensors "
                    f"file inside {folder}, named relative to it"
                )
        files = [folder / shard for shard in sorted(set(weight_map.values()))]
    elif (folder / "model.safetensors").exists():
        files = [folder / "model.safetensors"]
    else:
        files = sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"no model.safetensors(.index.json) or pytorch_model*.bin in {folder}")
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"{index} names the shard {file.name}, which is not a file in {folder}")
    return files


def _add(shapes: Shapes, key: str, shape, float_dtype: bool, file: Path) -> None:
    if key in shapes:
        raise ValueError(f"weight {key!r} is in both {shapes[key][1]} and {file}")
    if not float_dtype:
        raise ValueError(f"{file}: weight {key!r} is not a floating-point tensor")
    shapes[key] = (tuple(shape), str(file))


def header_shapes(files: list[Path]) -> Shapes:
    """Every weight's shape, from the safetensors headers alone."""
    shapes: Shapes = {}
    for file in files:
        check_safetensors(file)  # its header against its size, before safetensors maps it
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    info = f.get_slice(key)
                    _add(shapes, key, info.get_shape(), info.get_dtype() in _FLOAT_DTYPES, file)
        except SafetensorError as e:
            raise ValueError(f"{file} is not a readable safetensors file ({e})") from None
    return shapes


def read_hf_weights(folder: Path, check: Callable[[Shapes], None]) -> dict[str, torch.Tensor]:
    """The folder's weights, `check`ed on their keys and shapes first: before any data is read for
    safetensors shards, after loading for pytorch_model*.bin (whose shapes live in the pickle)."""
    files = shard_files(Path(folder))
    if all(file.suffix == ".safetensors" for file in files):
        check(header_shapes(files))
        return {k: v for file in files for k, v in read_weights(file).items()}
    state: dict[str, torch.Tensor] = {}
    shapes: Shapes = {}
    for file in files:
        for key, value in read_weights(file).items():
            _add(shapes, key, value.shape, value.is_floating_point(), file)
            state[key] = value
    check(shapes)
    return state
