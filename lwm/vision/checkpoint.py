"""VQGAN weights as safetensors (the VQGAN's state dict) with its config as JSON beside it.

    save_vqgan(model, "data/checkpoints/vqgan_tiny.safetensors", preset="tiny", extra={...})
      -> vqgan_tiny.safetensors, vqgan_tiny.json {"preset", "vqgan": VQGANConfig fields, ...extra}
    model = load_vqgan("data/checkpoints/vqgan_tiny.safetensors")

The state dict is the plain VQGAN's, so `lwm-tokenize --tokenizer tiny --checkpoint
vqgan_tiny.safetensors` loads it as well (when the config is the preset's).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from lwm.vision.vqgan import VQGAN
from lwm.vision.vqgan_config import VQGANConfig


def config_path(weights: str | Path) -> Path:
    return Path(weights).with_suffix(".json")


def save_vqgan(
    model: VQGAN, path: str | Path, preset: str | None = None, extra: dict | None = None
) -> tuple[Path, Path]:
    from safetensors.torch import save_file

    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"VQGAN weights are saved as .safetensors, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"format": "pt"})
    meta = {"preset": preset, "vqgan": dataclasses.asdict(model.config), **(extra or {})}
    config_path(path).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return path, config_path(path)


def load_vqgan(path: str | Path) -> VQGAN:
    from safetensors.torch import load_file

    path = Path(path)
    meta_path = config_path(path)
    if not path.is_file() or not meta_path.is_file():
        raise FileNotFoundError(
            f"a VQGAN checkpoint is {path} and {meta_path}; missing: "
            f"{[str(p) for p in (path, meta_path) if not p.is_file()]}"
        )
    meta = json.loads(meta_path.read_text())
    model = VQGAN(VQGANConfig(**meta["vqgan"]))
    model.load_state_dict(load_file(str(path)))
    return model.eval()
