"""lwm-convert-lwm: LWM's released Jax checkpoints -> one Hugging Face folder (language model,
tokenizer, VQGAN and the prompt form), with neither jax nor flax installed.

    lwm-convert-lwm --checkpoint params::LWM-Chat-1M-Jax/params --config 7b --theta 50000000 \\
        --vqgan LWM-Chat-1M-Jax/vqgan --tokenizer LWM-Chat-1M-Jax/tokenizer.model --out lwm-chat-1m

--config is LWM's model config as JSON (what its --load_llama_config json::PATH reads) or one of
its presets (7b, ...); values given as options (--theta, --max-sequence-length) override it.
Shapes are read from the checkpoint and checked against the config. The folder then loads with
transformers' AutoModelForCausalLM, diffusers' VQModel (DIR/vqgan) and `lwm.infer.load_model`,
which writes prompts as LWM does (`lwm-generate --model DIR --video clip.mp4`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from lwm.data.text_tokenizer import TextTokenizer
from lwm.disk.writes import check_output_folder, staged_folder
from lwm.interop.bundle import write_bundle_info
from lwm.interop.hf import to_hf
from lwm.interop.lwm_jax import convert_params
from lwm.interop.lwm_params import load_lwm_config, parse_load_string, read_params
from lwm.interop.lwm_vqgan import from_lwm_vqgan
from lwm.model import Transformer

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def convert_lwm(
    checkpoint: str, config, out_dir, vqgan=None, tokenizer=None, dtype: torch.dtype | None = None, **overrides
) -> Path:
    """Convert an LWM checkpoint (load string 'params::PATH', ...) with its LWM config (preset name,
    JSON path or dict; `overrides` change its fields) into out_dir; `vqgan`: LWM's VQGAN pickle;
    `tokenizer`: LLaMA's sentencepiece model. dtype: None keeps the checkpoint's (bf16 as released)."""
    cfg = dataclasses.replace(load_lwm_config(config), **overrides)
    _, path = parse_load_string(checkpoint)  # a bad path fails before anything is read
    check_output_folder(out_dir)  # another's files there, or a link to another folder: refused before the long part
    if tokenizer is not None:
        text = TextTokenizer(tokenizer).vocab_size
        if text != cfg.vocab_size:
            raise ValueError(f"tokenizer {tokenizer} has {text} ids but the config's vocab_size is {cfg.vocab_size}")
    vq_model = None
    if vqgan is not None:  # small: converted first, so that a bad file fails before the long part
        vq_model = from_lwm_vqgan(vqgan)
    leaves = tqdm(read_params(checkpoint), desc="parameters", unit=" leaves", disable=None)
    state, model_config, notes = convert_params(leaves, cfg, dtype, source=str(path))
    vision = model_config.vocab_size != cfg.vocab_size
    if vq_model is not None and not vision:
        raise ValueError("--vqgan goes with a vision-language checkpoint; this one has no vision embedding (vte)")
    with torch.device("meta"):
        model = Transformer(model_config)
    model.load_state_dict(state, strict=True, assign=True)
    del state
    out_dir = Path(out_dir)
    generation = {}
    if vision:  # LWM samples text from the text head alone
        generation["suppress_tokens"] = list(range(cfg.vocab_size, model_config.vocab_size))
    # written beside out_dir and moved in whole: an earlier conversion's files are replaced, nobody else's
    with staged_folder(out_dir, "lwm-convert-lwm") as stage:
        # 1 GB shards: writing a shard holds a serialized copy of it in memory (safetensors)
        to_hf(model, stage, tokenizer_model=tokenizer, prompt="lwm", generation=generation, max_shard_size="1GB")
        write_bundle_info(
            stage, "lwm", vq_model, source=str(checkpoint), lwm_config=dataclasses.asdict(cfg), notes=notes
        )
    for note in notes:
        print(f"note: {note}")
    return out_dir


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lwm-convert-lwm", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="params::PATH (also trainstate::, trainstate_params::)")
    p.add_argument("--config", required=True, help="LWM's model config: a JSON file or a preset name (7b, ...)")
    p.add_argument("--out", required=True, type=Path, help="the Hugging Face folder to write")
    p.add_argument("--vqgan", type=Path, help="LWM's VQGAN file (a pickle of its Flax parameters)")
    p.add_argument("--tokenizer", type=Path, help="LLaMA's sentencepiece model, to write a tokenizer too")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default: as stored in the checkpoint")
    p.add_argument("--theta", type=float, help="RoPE theta (overrides the config's)")
    p.add_argument("--max-sequence-length", type=int, help="overrides the config's max_sequence_length")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    for option in ("vqgan", "tokenizer"):
        if getattr(args, option) is not None and not getattr(args, option).is_file():
            p.error(f"--{option} {getattr(args, option)} does not exist")
    overrides = {
        k: v for k, v in (("theta", args.theta), ("max_sequence_length", args.max_sequence_length)) if v is not None
    }
    t0 = time.perf_counter()
    try:
        out = convert_lwm(
            args.checkpoint, args.config, args.out, args.vqgan, args.tokenizer, DTYPES.get(args.dtype), **overrides
        )
    except (FileNotFoundError, ValueError) as e:
        print(f"lwm-convert-lwm: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
