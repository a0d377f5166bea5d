"""Our own training outputs as weights + model config: a stage folder (final.safetensors, else
checkpoints/last.ckpt), a final.safetensors, or a Lightning checkpoint (file or sharded folder).
The model's shape and RoPE theta come from the stage folder's model_config.json (lwm.disk.stage_folder: the
layout)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from lwm.configs import from_dict
from lwm.disk.checkpoints import CheckpointError, check_sharded, load_verified, verify_folder
from lwm.disk.stage_folder import StageFolder
from lwm.disk.weights import read_weights
from lwm.model import ModelConfig


def checkpoint_weights(path: Path) -> dict[str, torch.Tensor]:
    """The model's full state dict from a Lightning checkpoint (file or sharded folder), read
    without unpickling anything but tensors and plain data (lwm.disk.checkpoints)."""
    if path.is_dir():  # distributed checkpoint: checked, then gathered into one file
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        verify_folder(path)  # its SHA256SUMS, as a resume verifies them
        check_sharded(path)
        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(path, Path(tmp) / "full.pt")
            state = load_verified(Path(tmp) / "full.pt")
        state = state.get("state_dict", state)
    else:
        state = load_verified(path)
        if "state_dict" not in state:
            raise CheckpointError(f"{path} has no state_dict: not a Lightning checkpoint of a training stage")
        state = state["state_dict"]
    prefix = "model."
    return {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in state.items()}


def resolve(source: Path) -> tuple[dict | Path, Path]:
    """(weights, stage folder) for a stage folder, a final.safetensors or a checkpoint."""
    if source.is_dir() and StageFolder(source).is_stage():
        folder = StageFolder(source)
        return (folder.final if folder.final.exists() else checkpoint_weights(folder.last)), source
    stage_dir = source.parent if source.suffix == ".safetensors" else source.parent.parent
    if not StageFolder(stage_dir).is_stage():
        raise FileNotFoundError(f"no model_config.json next to {source}; give the stage folder of a training run")
    return (source if source.suffix == ".safetensors" else checkpoint_weights(source)), stage_dir


def read_model_config(stage_dir: Path) -> ModelConfig:
    """A stage folder's model_config.json, or a ValueError naming the file and what is wrong."""
    path = StageFolder(Path(stage_dir)).model_config
    try:
        fields = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist; give the stage folder of a training run") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{path} holds a {type(fields).__name__}, expected an object of ModelConfig fields")
    try:
        return from_dict(ModelConfig, fields, str(path))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def load_stage(source) -> tuple[dict[str, torch.Tensor], ModelConfig]:
    """(state dict, model config) of a stage folder, final.safetensors or checkpoint."""
    weights, stage_dir = resolve(Path(source))
    return read_weights(weights), read_model_config(stage_dir)
