"""Export a stage's weights or any training checkpoint as a Hugging Face LLaMA folder.

    python -m lwm.train.export runs/X/s8k --out runs/X/hf-s8k [--tokenizer data/sample/tokenizer.model]

The argument is a stage folder (its final.safetensors, else its checkpoints/last.ckpt), a
final.safetensors, or a Lightning checkpoint (a .ckpt file, or a sharded checkpoint folder).
The model's shape and RoPE theta come from the stage folder's model_config.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from lwm.interop.hf import to_hf
from lwm.model import ModelConfig, Transformer


def export_weights(weights, model_config: ModelConfig, out_dir, tokenizer_model=None) -> Path:
    """weights: a path to a safetensors file or a state dict."""
    if not isinstance(weights, dict):
        from safetensors.torch import load_file

        weights = load_file(weights)
    with torch.device("meta"):
        model = Transformer(model_config)
    model.load_state_dict(weights, strict=True, assign=True)
    return to_hf(model, out_dir, tokenizer_model=tokenizer_model)


def checkpoint_weights(path: Path) -> dict[str, torch.Tensor]:
    """The model's full state dict from a Lightning checkpoint (file or sharded folder)."""
    if path.is_dir():  # distributed checkpoint: gather it into one file first
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(path, Path(tmp) / "full.pt")
            state = torch.load(Path(tmp) / "full.pt", map_location="cpu", weights_only=False)
        state = state.get("state_dict", state)
    else:
        state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    prefix = "model."
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


def resolve(source: Path) -> tuple[dict | Path, Path]:
    """(weights, stage folder) for a stage folder, a final.safetensors or a checkpoint."""
    if source.is_dir() and (source / "model_config.json").exists():
        final = source / "final.safetensors"
        return (final if final.exists() else checkpoint_weights(source / "checkpoints" / "last.ckpt")), source
    stage_dir = source.parent if source.suffix == ".safetensors" else source.parent.parent
    if not (stage_dir / "model_config.json").exists():
        raise FileNotFoundError(f"no model_config.json next to {source}; give the stage folder of a training run")
    return (source if source.suffix == ".safetensors" else checkpoint_weights(source)), stage_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Export a training stage or checkpoint as a Hugging Face folder")
    parser.add_argument("source", type=Path, help="stage folder, final.safetensors, or a Lightning checkpoint")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, help="the sentencepiece model, to write a tokenizer too")
    args = parser.parse_args(argv)
    if not args.source.exists():
        parser.error(f"{args.source} does not exist")
    weights, stage_dir = resolve(args.source)
    config = ModelConfig(**json.loads((stage_dir / "model_config.json").read_text()))
    print(f"exported to {export_weights(weights, config, args.out, args.tokenizer)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
