"""Export a stage's weights or any training checkpoint as a Hugging Face LLaMA folder.

    python -m lwm.train.export runs/X/s8k --out runs/X/hf-s8k [--tokenizer data/sample/tokenizer.model | BASE_DIR]
        [--vqgan data/checkpoints/vqgan_tiny.safetensors]

The argument is a stage folder (its final.safetensors, else its checkpoints/last.ckpt), a
final.safetensors, or a Lightning checkpoint (a .ckpt file, or a sharded checkpoint folder).
The model's shape and RoPE theta come from the stage folder's model_config.json. With --vqgan (the
VQGAN that made the run's codes: our safetensors checkpoint or a diffusers folder) the folder gets
it as vqgan/ and an lwm.json (lwm.interop.bundle), so that `lwm-generate --model OUT --video clip.mp4`
and lwm/eval/video_qa/ need nothing else.

The files are written into a folder beside --out and moved in when all are made (lwm.disk.writes.staged_folder),
and lwm_files.json lists them: --out may be absent, empty, or an earlier export (whose files are then
replaced, stale shards and a vqgan/ included); a folder holding other files, or one reached through
a symlink, is refused (exit 2) before anything is read or written. A full disk exits 3, naming --out
and leaving it as it was.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from lwm.data.chat import native_or_template
from lwm.data.text_tokenizer import TextTokenizer
from lwm.disk.weights import read_weights
from lwm.disk.writes import FolderRefused, NoSpaceLeft, check_output_folder, staged_folder
from lwm.interop.bundle import write_bundle_info
from lwm.interop.hf import to_hf
from lwm.interop.stage_outputs import read_model_config, resolve
from lwm.interop.vqgan_sources import load_vqgan, open_vqgan
from lwm.io import records
from lwm.model import ModelConfig, Transformer

EXIT_NO_SPACE = 3  # as train.py and lwm-tokenize: 2 is bad input, 3 a full disk


def codes_vqgan(codes_dir) -> Path | None:
    """The VQGAN that made a code store (lwm-tokenize's manifest records it): its checkpoint or
    diffusers folder, when that still holds the same weights; else None, with the reason printed."""
    manifests = sorted(Path(codes_dir).glob("manifest*.jsonl"))
    first = next((r for m in manifests for _, r in records(m) if isinstance(r, dict) and "tokenizer" in r), None)
    if first is None:
        return None
    made_by = first["tokenizer"]
    source = made_by.get("diffusers") or made_by.get("checkpoint")
    if source is None or not Path(source).exists():
        print(f"export: the codes' VQGAN {made_by} is not on disk; the export has no vqgan/")
        return None
    if open_vqgan(source, made_by.get("preset"))[1]["weights"] != made_by.get("weights"):
        print(f"export: {source} no longer holds the weights that made the codes; the export has no vqgan/")
        return None
    return Path(source)


def export_weights(weights, model_config: ModelConfig, out_dir, tokenizer_model=None, vqgan=None, inside=None) -> Path:
    """weights: a path to a safetensors file or a state dict; vqgan: a VQGAN checkpoint or folder to bundle.
    Both are read before anything is written: a bad one leaves no half-made folder. out_dir is checked
    first (lwm.disk.writes.check_output_folder; symlinks only below `inside`, a folder the caller owns, when given)."""
    out_dir = Path(out_dir)
    check_output_folder(out_dir, inside)
    bundled = load_vqgan(vqgan, preset="tiny") if vqgan is not None else None
    with torch.device("meta"):
        model = Transformer(model_config)
    try:
        model.load_state_dict(read_weights(weights), strict=True, assign=True)
    except RuntimeError as e:  # missing, unexpected or mis-shaped keys: the weights are not this config's model
        name = weights if isinstance(weights, (str, Path)) else "the weights"
        raise ValueError(
            f"{name} do not fit the stage's model_config.json: {str(e).splitlines()[-1].strip()}"
        ) from None
    with staged_folder(out_dir, "lwm.train.export", inside) as stage:
        to_hf(model, stage, tokenizer_model=tokenizer_model)
        # a base's chat template is how its prompts are written (lwm-generate, the evaluations read lwm.json)
        prompt = native_or_template(TextTokenizer(tokenizer_model)) if tokenizer_model is not None else "native"
        if bundled is not None or prompt != "native":
            notes = {"vqgan_source": str(vqgan)} if bundled is not None else {}
            write_bundle_info(stage, prompt, bundled, **notes)
    return out_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Export a training stage or checkpoint as a Hugging Face folder")
    parser.add_argument("source", type=Path, help="stage folder, final.safetensors, or a Lightning checkpoint")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="the run's text tokenizer (sentencepiece model, tokenizer.json or the base's folder), to write a "
        "tokenizer too: the base's own, with the vision tokens added",
    )
    parser.add_argument(
        "--vqgan", type=Path, help="the run's VQGAN (safetensors checkpoint or diffusers folder), bundled as vqgan/"
    )
    args = parser.parse_args(argv)
    for name, path in (("source", args.source), ("--vqgan", args.vqgan), ("--tokenizer", args.tokenizer)):
        if path is not None and not path.exists():
            parser.error(f"{name} {path} does not exist")
    if args.out.exists() and not args.out.is_dir() and not args.out.is_symlink():
        parser.error(f"--out {args.out} is a file; name a folder for the Hugging Face export")
    try:
        check_output_folder(args.out)  # before any weights are read
        weights, stage_dir = resolve(args.source)
        config = read_model_config(stage_dir)
        if args.tokenizer is not None:
            TextTokenizer(args.tokenizer)  # refused here, before any weights are read
        out = export_weights(weights, config, args.out, args.tokenizer, args.vqgan)
    except FolderRefused as e:
        parser.exit(2, f"export: --out {e}\n")
    except (FileNotFoundError, ValueError) as e:
        parser.exit(2, f"export: {e}\n")
    except NoSpaceLeft as e:  # as training's full disk: its own status, --out as it was
        parser.exit(EXIT_NO_SPACE, f"export: {e}; free space and run the export again (--out is unchanged)\n")
    print(f"exported to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
