"""Weights files: the one reader and writer of state dicts on disk (a training stage's
final.safetensors, a VQGAN checkpoint, a Lightning checkpoint's weights).

    save_weights(state, "run/a/final.safetensors")    # contiguous CPU copies, parent folders made,
                                                      # final.safetensors.sha256 beside it
    state = read_weights(path_or_state)               # a dict is returned as it is; a file is checked
                                                      # against its .sha256 where it has one

Every safetensors file is checked against its size before it is mapped (check_safetensors): a header
whose tensors lie past the file's end, whose byte spans disagree with dtype x shape, or whose data
is more than this host's memory could map is named (file and tensor), instead of failing in mmap.

A config sidecar, where there is one, is the caller's (model_config.json beside a stage's weights,
<name>.json beside a VQGAN's).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from lwm.disk.checkpoints import UNREADABLE, install, sha256, verify
from lwm.disk.writes import writes_to


class WeightsError(ValueError):
    """A weights file that cannot be read: not weights, cut short or corrupted; the message names it."""


WEIGHTS_ADVICE = "restore it, or rerun what wrote it (a training stage: stage_only=<stage>)"


# Bits per element of safetensors' dtypes (the header's names).
_DTYPE_BITS = {
    **dict.fromkeys(("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0"), 8),
    **dict.fromkeys(("U16", "I16", "F16", "BF16"), 16),
    **dict.fromkeys(("U32", "I32", "F32"), 32),
    **dict.fromkeys(("U64", "I64", "F64", "C64"), 64),
    "F4": 4,
    **dict.fromkeys(("F6_E2M3", "F6_E3M2"), 6),
}
_MAX_HEADER = 100_000_000  # safetensors' own limit


def host_memory() -> int:
    """Bytes this host could map privately at most: its memory plus swap (what Linux's overcommit
    heuristic allows one mapping); the physical memory where /proc/meminfo is missing."""
    try:
        fields = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines() if ":" in line)
        return sum(int(fields[k].split()[0]) * 1024 for k in ("MemTotal", "SwapTotal"))
    except (OSError, KeyError, ValueError, IndexError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_safetensors(path: str | Path) -> None:
    """A safetensors file's header against the file, before safetensors maps it (a header that asks
    for more than the file or the host holds ends there as an uncaught "unable to mmap"): each
    tensor's offsets inside the file's data, its byte span dtype x shape, and the data no more than
    host_memory(). Raises WeightsError naming the file and the tensor. A header that is not JSON is
    left to safetensors' own error."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if n is None or n > min(size - 8, _MAX_HEADER):
            raise WeightsError(
                f"{path} is not a readable safetensors file: {size} bytes, "
                + (f"its header claims {n} bytes" if n is not None else "too short for a header")
            )
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            return  # safetensors names it
    if not isinstance(header, dict):
        return
    data = size - 8 - n
    for key, info in header.items():
        if key == "__metadata__":
            continue
        where = f"{path} is not a readable safetensors file: tensor {key!r:.200}"
        if not isinstance(info, dict):
            raise WeightsError(f"{where} has no dtype, shape and data_offsets")
        shape, span, bits = info.get("shape"), info.get("data_offsets"), _DTYPE_BITS.get(info.get("dtype"))
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise WeightsError(f"{where} has shape {shape!r:.80}, expected a list of sizes")
        if not (isinstance(span, list) and len(span) == 2 and all(type(o) is int and o >= 0 for o in span)):
            raise WeightsError(f"{where} has data_offsets {span!r:.80}, expected [begin, end]")
        begin, end = span
        if end > data or begin > end:
            raise WeightsError(
                f"{where} lies at bytes {begin}..{end} of the data, but the file holds {data} bytes of data "
                "(cut short, or the header is wrong)"
            )
        if bits is not None and (math.prod(shape) * bits + 7) // 8 != end - begin:
            raise WeightsError(
                f"{where} is {info['dtype']} of shape {tuple(shape)}, {(math.prod(shape) * bits + 7) // 8} bytes, "
                f"but its data_offsets span {end - begin}"
            )
    if data > host_memory():
        tensors = [k for k in header if k != "__metadata__"]
        largest = max(tensors, key=lambda k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0], default=None)
        raise WeightsError(
            f"{path} holds {data:,} bytes of tensor data (the largest tensor {largest!r:.200}), more than this "
            f"host's {host_memory():,} bytes of memory and swap can map: a file that is mostly holes (sparse) "
            "or damaged, or a model for a bigger machine"
        )


def save_weights(state: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"weights are saved as .safetensors, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # beside it: the rename is atomic, a kill leaves the old file
    try:
        with writes_to(path):  # a full disk: NoSpaceLeft naming the weights
            save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(tmp), metadata=metadata)
            install(tmp, path, sha256(tmp))  # with its checksum, which readers verify
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_weights(source: str | Path | dict) -> dict[str, torch.Tensor]:
    """A state dict from a .safetensors file, or from a torch file holding one (a training
    checkpoint's "state_dict" is taken out); a dict is passed through."""
    if isinstance(source, dict):
        return source
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        check_safetensors(path)  # before its checksum too: a sparse file of terabytes is not read through
    verify(path, advice=WEIGHTS_ADVICE)
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except SafetensorError as e:
            raise WeightsError(
                f"{path} is not a readable safetensors file ({e}): cut short, corrupted or another format"
            ) from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise WeightsError(
            f"{path} is not a weights file: it is no torch file or it holds objects other than tensors, which "
            f"would run code when unpickled ({str(e).splitlines()[-1] if str(e).strip() else e})"
        ) from None
    except UNREADABLE as e:
        raise WeightsError(f"{path} is cut short or corrupted and cannot be read ({type(e).__name__}: {e})") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise WeightsError(f"{path} holds a {type(state).__name__}, expected a state dict")
    return state
