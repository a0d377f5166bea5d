"""The one loader for every VQGAN this project reads: our checkpoints (lwm.vision.checkpoint), a
diffusers folder, or a bare state dict for a preset.

    model = load_vqgan("data/checkpoints/vqgan_tiny.safetensors")   # or a diffusers folder, or
    model = load_vqgan("weights.pt", preset="tiny")                 # a bare state dict for a preset
    model, identity = open_vqgan(...)                               # identity: what made a code store
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from lwm.disk.weights import read_weights
from lwm.interop.diffusers import from_diffusers
from lwm.vision.checkpoint import config_path, weights_hash
from lwm.vision.vqgan import VQGAN
from lwm.vision.vqgan_config import VQGANConfig


def open_vqgan(source: str | Path | None = None, preset: str | None = None) -> tuple[VQGAN, dict]:
    """A VQGAN (in eval mode) and its identity, what lwm-tokenize's manifest records. `source`: a
    diffusers folder; a checkpoint with its config beside it (save_vqgan; the config wins over
    `preset`); a bare state dict (.safetensors, .pt, a training checkpoint) for `preset`; or None,
    `preset`'s random weights (seed 0). Raises FileNotFoundError / ValueError naming the source."""
    if source is not None and Path(source).is_dir():
        model, identity = from_diffusers(source), {"diffusers": os.path.abspath(source)}
    elif source is not None and Path(source).is_file() and config_path(source).is_file():
        meta = json.loads(config_path(source).read_text())
        model = VQGAN(VQGANConfig(**meta["vqgan"]))
        model.load_state_dict(read_weights(source))
        identity = {"preset": meta.get("preset"), "checkpoint": os.path.abspath(source)}
    elif source is not None and not Path(source).is_file():
        raise FileNotFoundError(f"VQGAN checkpoint {source} not found")
    else:
        if preset is None:
            raise ValueError(
                f"VQGAN checkpoint {source} has no config beside it ({config_path(source)}); name its preset"
            )
        config = VQGANConfig.from_preset(preset)
        torch.manual_seed(0)  # without a checkpoint the (random) weights are at least reproducible
        model = VQGAN(config)
        if source is not None:
            result = model.load_state_dict(read_weights(source), strict=False)
            if result.missing_keys or result.unexpected_keys:
                raise ValueError(
                    f"checkpoint {source} does not fit preset {preset!r}: missing keys {result.missing_keys[:5]}, "
                    f"unexpected keys {result.unexpected_keys[:5]}"
                )
        identity = {"preset": preset, "checkpoint": None if source is None else os.path.abspath(source)}
    identity["weights"] = weights_hash(model)
    return model.eval(), identity


def load_vqgan(source: str | Path | None, preset: str | None = None) -> VQGAN:
    """open_vqgan's model alone."""
    return open_vqgan(source, preset)[0]
