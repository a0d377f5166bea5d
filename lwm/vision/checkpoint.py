"""VQGAN checkpoints as this project writes them: the VQGAN's state dict as safetensors with its
config as JSON beside it, and the hash that identifies a VQGAN's weights. Reading any VQGAN (ours,
a diffusers folder, a bare state dict) is lwm.interop.vqgan_sources.

    save_vqgan(model, "data/checkpoints/vqgan_tiny.safetensors", preset="tiny", extra={...})
      -> vqgan_tiny.safetensors, vqgan_tiny.json {"preset", "vqgan": VQGANConfig fields, ...extra}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch

from lwm.disk.weights import save_weights
from lwm.vision.vqgan import VQGAN


def config_path(weights: str | Path) -> Path:
    return Path(weights).with_suffix(".json")


def save_vqgan(
    model: VQGAN, path: str | Path, preset: str | None = None, extra: dict | None = None
) -> tuple[Path, Path]:
    path = save_weights(model.state_dict(), path, metadata={"format": "pt"})
    meta = {"preset": preset, "vqgan": dataclasses.asdict(model.config), **(extra or {})}
    config_path(path).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return path, config_path(path)


def weights_hash(model: torch.nn.Module) -> str:
    """Short sha256 over the state dict (names, dtypes, shapes, bytes): identifies the weights that made the codes."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
