"""LWM's Jax checkpoints, read without jax or flax: the streaming parameter files and the model config.

A checkpoint file is a stream of msgpack objects, one per parameter leaf: `[key, value]`, the key
the leaf's path in the parameter tree (a list of strings), the value the bytes Flax's serializer
writes for one array: msgpack ExtType 1 holding `[shape, dtype name, C-order bytes]`, or, for a
leaf over 1 GiB, a map `{"__msgpack_chunked_array__": true, "shape": {"0": .., ...}, "chunks":
{"0": <ExtType 1>, ...}}` of 1-D chunks. LWM names checkpoints with a load string:

    params::PATH              the parameters alone (what LWM's released checkpoints are)
    trainstate_params::PATH   the parameters inside a saved train state (keys under params/params)
    trainstate::PATH          the same file read as a whole train state; only the parameters are kept

Leaves are read one at a time, each record straight into a buffer of its own, and decoded over
that buffer without copies (lwm.interop.msgpack_view), so memory holds one leaf (plus what the
caller keeps).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from lwm.interop.msgpack_view import Ext, MsgpackError, RecordReader, decode

LOAD_TYPES = ("params", "trainstate_params", "trainstate")
_NDARRAY, _NPSCALAR = 1, 3  # Flax's msgpack extension codes
# The dtypes parameters come in, by the name Flax writes; anything else (complex, ints, a byte
# order numpy would read) is no LLaMA weight.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def parse_load_string(load: str) -> tuple[str, Path]:
    """'params::PATH' -> ('params', PATH); a bare path is read as params."""
    kind, sep, path = str(load).partition("::")
    if not sep:
        kind, path = "params", str(load)
    if kind not in LOAD_TYPES:
        raise ValueError(
            f"checkpoint {load!r}: unknown load type {kind!r}; expected one of {[t + '::PATH' for t in LOAD_TYPES]}"
        )
    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return kind, Path(path)


def _shape(value, where: str) -> list[int]:
    if not (isinstance(value, list) and all(type(d) is int and 0 <= d < 2**31 for d in value)):
        raise ValueError(f"{where}: the array's shape is {value!r}, expected a list of sizes")
    return value


def _array(ext: Ext, where: str) -> torch.Tensor:
    """Flax's ExtType 1 ([shape, dtype name, C-order bytes]) -> a tensor over those bytes (no copy)."""
    fields, _ = decode(ext.data)
    if not (isinstance(fields, list) and len(fields) == 3):
        raise ValueError(
            f"{where}: an array record holds [shape, dtype, bytes], not {type(fields).__name__} {fields!r:.80}"
        )
    shape, name, buffer = _shape(fields[0], where), fields[1], fields[2]
    if name not in DTYPES:  # names carry no byte order: Flax writes dtype.name, bytes in native (little-endian) order
        raise ValueError(f"{where}: dtype {name!r} is not a parameter dtype; expected one of {sorted(DTYPES)}")
    if not isinstance(buffer, memoryview):
        raise ValueError(f"{where}: the array's data is a {type(buffer).__name__}, expected bytes")
    dtype = DTYPES[name]
    size = math.prod(shape) * dtype.itemsize
    if len(buffer) != size:
        raise ValueError(f"{where}: shape {shape} of {name} takes {size} bytes, but the record holds {len(buffer)}")
    flat = torch.frombuffer(buffer, dtype=dtype) if len(buffer) else torch.empty(0, dtype=dtype)
    return flat.reshape(shape)


def _numbered(obj, field: str, where: str) -> list:
    """A chunked array's {"0": .., "1": .., ...} map -> its values in order."""
    if not (isinstance(obj, dict) and obj and set(obj) == {str(i) for i in range(len(obj))}):
        raise ValueError(f"{where}: a chunked array's {field!r} must be a map with keys '0', '1', ...; got {obj!r:.80}")
    return [obj[str(i)] for i in range(len(obj))]


def _chunked(obj: dict, where: str) -> torch.Tensor:
    shape = _shape(_numbered(obj.get("shape"), "shape", where), where)
    chunks = []
    for chunk in _numbered(obj.get("chunks"), "chunks", where):
        if not (isinstance(chunk, Ext) and chunk.code == _NDARRAY):
            raise ValueError(f"{where}: a chunk of a chunked array is a {type(chunk).__name__}, expected an array")
        chunks.append(_array(chunk, where))
    if len({c.dtype for c in chunks}) != 1 or any(c.dim() != 1 for c in chunks):
        raise ValueError(f"{where}: a chunked array's chunks must be 1-D and of one dtype")
    if sum(c.numel() for c in chunks) != math.prod(shape):
        raise ValueError(f"{where}: chunks of {sum(c.numel() for c in chunks)} elements for shape {shape}")
    return torch.cat(chunks).reshape(shape)  # one copy; the record's buffer goes with the chunks


def _leaf(value: memoryview, where: str) -> torch.Tensor | None:
    """A leaf's serialized bytes -> its tensor (None for what is not an array, e.g. a step counter)."""
    try:
        obj, _ = decode(value)
        if isinstance(obj, Ext):
            return _array(obj, where) if obj.code in (_NDARRAY, _NPSCALAR) else None
        if isinstance(obj, dict) and obj.get("__msgpack_chunked_array__"):
            return _chunked(obj, where)
    except (MsgpackError, IndexError) as e:
        raise ValueError(f"{where}: the leaf's bytes are no array ({e})") from None
    return None


def read_params(load: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ('transformer/wte/embedding', tensor), ... for each parameter leaf of an LWM checkpoint,
    in file order, as stored (bf16 stays bf16). A leaf's tensor sits on its record's own buffer,
    read from the file with no further copy."""
    kind, path = parse_load_string(load)
    prefix = () if kind == "params" else ("params", "params")
    with open(path, "rb") as f:
        try:
            for key, value in RecordReader(f):
                if not (isinstance(key, list) and all(isinstance(k, str) for k in key)):
                    raise ValueError(
                        f"{path} is not an LWM streaming checkpoint: a record's key is not a list of names"
                    )
                if tuple(key[: len(prefix)]) != prefix:
                    continue  # optimizer state and step of a train state
                name = "/".join(key[len(prefix) :])
                tensor = _leaf(value, f"{path}: {name}") if isinstance(value, memoryview) else None
                value = None  # only the tensor keeps the record's buffer alive
                if tensor is not None:
                    yield name, tensor
        except (MsgpackError, IndexError) as e:
            raise ValueError(f"{path} is not an LWM streaming checkpoint ({type(e).__name__}: {e})") from e


# ---------------------------------------------------------------------------------------- config

# LWM's named model shapes (its lwm/llama.py), all LLaMA with a 32000-id text vocabulary.
_SHAPES = {  # hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, max_sequence_length, rms_norm_eps
    "200m": (1024, 2048, 14, 8, 2048, 1e-6),
    "1b": (2048, 5504, 22, 16, 2048, 1e-6),
    "3b": (3200, 8640, 26, 32, 2048, 1e-6),
    "7b": (4096, 11008, 32, 32, 4096, 1e-6),
    "13b": (5120, 13824, 40, 40, 2048, 1e-6),
    "30b": (6656, 17920, 60, 52, 2048, 1e-6),
    "65b": (8192, 22016, 80, 64, 2048, 1e-5),
    "debug": (256, 256, 2, 2, 2048, 1e-6),
}
PRESETS = {
    name: dict(
        hidden_size=d,
        intermediate_size=f,
        num_hidden_layers=n,
        num_attention_heads=h,
        max_sequence_length=s,
        rms_norm_eps=eps,
        vocab_size=32000,
    )
    for name, (d, f, n, h, s, eps) in _SHAPES.items()
}


_POSITIVE_INTS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "vision_vocab_size",
    "max_sequence_length",
)


@dataclass(frozen=True)
class LWMConfig:
    """The fields of LWM's model config that shape the weights and the forward pass."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    vocab_size: int = 32000
    vision_vocab_size: int = 8448
    max_sequence_length: int = 4096
    rms_norm_eps: float = 1e-6
    theta: float = 10000.0
    param_scan_axis: int = 0
    tie_word_embeddings: bool = False
    tie_vision_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("rms_norm_eps", "theta"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.hidden_size % self.num_attention_heads or self.head_dim % 2:
            raise ValueError(
                f"hidden_size {self.hidden_size} / num_attention_heads {self.num_attention_heads} must be an even "
                f"head size (RoPE rotates pairs)"
            )
        if self.tie_word_embeddings or self.tie_vision_embeddings:
            raise ValueError("tied embeddings are not supported (LWM's released models untie them)")
        if self.param_scan_axis not in (0, 1) or type(self.param_scan_axis) is not int:
            raise ValueError(f"param_scan_axis must be 0 or 1, got {self.param_scan_axis!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def load_lwm_config(config: str | Path | dict) -> LWMConfig:
    """LWM's model config: a preset name ('7b', ...), a JSON file (what LWM's --load_llama_config
    json::PATH reads; 'json::' may be given) or a dict. Fields LWM has that do not change the
    weights or the forward pass (remat, scan chunk sizes, dropout, ...) are ignored."""
    if isinstance(config, dict):
        raw, where = dict(config), "config"
    elif str(config) in PRESETS:
        raw, where = dict(PRESETS[str(config)]), f"preset {config}"
    else:
        path = Path(str(config).removeprefix("json::"))
        if not path.is_file():
            raise FileNotFoundError(
                f"--config {config}: neither one of LWM's presets {sorted(PRESETS)} nor a JSON file"
            )
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"--config {path} is not JSON: {e}") from e
        where = str(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{where} holds a JSON {type(raw).__name__}, expected an object of LWM's config fields")
    required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [k for k in required if k not in raw]
    if missing:
        raise ValueError(f"{where} lacks {missing}, which LWM's model config needs")
    try:
        return LWMConfig(**{k: raw[k] for k in LWMConfig.__dataclass_fields__ if k in raw})
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
