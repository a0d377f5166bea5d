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
from pathlib import Path

import torch

from lwm.interop.checkpoint import resolve
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
