"""Weights files: the one reader and writer of state dicts on disk (a training stage's
final.safetensors, a VQGAN checkpoint, a Lightning checkpoint's weights).

    save_weights(state, "run/a/final.safetensors")    # contiguous CPU copies, parent folders made,
                                                      # final.safetensors.sha256 beside it
    state = read_weights(path_or_state)               # a dict is returned as it is; a file is checked
                                                      # against its .sha256 where it has one

A config sidecar, where there is one, is the caller's (model_config.json beside a stage's weights,
<name>.json beside a VQGAN's).
"""

from __future__ import annotations

import errno
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from lwm.checkpoint_io import UNREADABLE, install, sha256, verify
from lwm.io import NoSpaceLeft


class WeightsError(ValueError):
    """A weights file that cannot be read: not weights, cut short or corrupted; the message names it."""


WEIGHTS_ADVICE = "restore it, or rerun what wrote it (a training stage: stage_only=<stage>)"


def save_weights(state: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"weights are saved as .safetensors, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # beside it: the rename is atomic, a kill leaves the old file
    try:
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(tmp), metadata=metadata)
        install(tmp, path, sha256(tmp))  # with its checksum, which readers verify
    except SafetensorError as e:
        for code in (errno.ENOSPC, errno.EDQUOT):  # the Rust writer's error names only the OS error
            if f"os error {code})" in str(e):
                raise NoSpaceLeft(path, OSError(code, str(e))) from None
        raise
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
