"""lwm-generate: answer a text prompt, optionally about a video, with any model we can load; or draw an
image or a video from it (--image-out, --video-out: lwm.infer.vision).

    lwm-generate --model runs/X/hf --prompt "What color is the circle?" --video clip.mp4
    lwm-generate --model runs/X/hf --prompt "What is in the picture?" --image photo.jpg   # a one-frame video
    lwm-generate --model runs/X/s8k --tokenizer data/sample/tokenizer.model --prompt "Once upon a time" --raw
    torchrun --nproc_per_node 2 -m lwm.infer.cli --model ... --prompt ... --video long.mp4   # prompt and KV cache split over 2 ranks
    lwm-generate --model runs/X/hf --prompt "Fireworks over the city" --video-out fw.mp4 --frames 8 --cfg-scale 3

The video is read at --fps (at most --max-frames frames) and tokenized with --vqgan, or taken from
cached codes (--codes DIR --video-id ID, the output of lwm-tokenize). Prompts use LWM's chat form
(question before the video) unless --raw, written as the model folder's lwm.json says (LWM's own
form for models converted by lwm-convert-lwm; the tokenizer's chat template for "template"). Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from lwm.arg_types import non_negative_float, positive_float, positive_int, seed_value
from lwm.data.chat import PROMPT_STYLES, chat_prompt
from lwm.data.form import IMAGE_EXTENSIONS, is_image
from lwm.data.vocab import TOKENS_PER_FRAME
from lwm.infer import GenerationConfig
from lwm.infer.generator import length_warning
from lwm.infer.runtime import add_model_args, load_generator, require_paths, start
from lwm.infer.vision import VisionConfig, generate_vision, save_vision, vision_prompts
from lwm.interop.vqgan_sources import load_vqgan
from lwm.paths import TINY_VQGAN
from lwm.ranks import is_rank0
from lwm.video.codes import CodeSource
from lwm.video.reader import VideoError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lwm-generate", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--prompt", required=True, help="the question (chat form) or the raw text (--raw)")
    p.add_argument(
        "--raw", action="store_true", help="no chat form: BOS (if the tokenizer has one) + the prompt's tokens"
    )
    p.add_argument("--video", help="a video file, read and tokenized on the fly")
    p.add_argument("--image", help="an image file, read and tokenized on the fly as a one-frame video")
    p.add_argument("--codes", help="cached codes folder (lwm-tokenize output); use with --video-id")
    p.add_argument("--video-id", help="the video's id in --codes")
    p.add_argument("--fps", type=positive_float, default=1.0)
    p.add_argument("--max-frames", type=positive_int)
    p.add_argument(
        "--vqgan",
        help="VQGAN checkpoint (tiny preset) or diffusers folder (default: the model folder's "
        "vqgan/, else the bundled tiny VQGAN)",
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=positive_int)
    p.add_argument("--restrict", choices=["text", "vision", "none"], default="text")
    p.add_argument(
        "--prompt-style",
        choices=["auto", *PROMPT_STYLES],
        default="auto",
        help="how the chat prompt is written: auto = as the model folder's lwm.json says (native without "
        "one); lwm = LWM's own form, e.g. for LWM-Text-Chat's Hugging Face release; template = the "
        "tokenizer's own chat template (a Llama-3 or Qwen base's)",
    )
    p.add_argument("--seed", type=seed_value, default=0)
    vision = p.add_argument_group(
        "vision generation", "an image or a video from the prompt (and from --image or --video, to go on from)"
    )
    vision.add_argument("--image-out", help="generate an image into this .png (its codes beside it, .codes.npy)")
    vision.add_argument("--video-out", help="generate a video into this .gif or .mp4 (its codes beside it)")
    vision.add_argument(
        "--frames", type=positive_int, help="frames to generate (default: 1 for an image; a video until <eov>)"
    )
    vision.add_argument("--max-new-frames", type=positive_int, default=16, help="at most this many without --frames")
    vision.add_argument(
        "--cfg-scale", type=float, default=1.0, help="classifier-free guidance scale (1: none, as LWM's default)"
    )
    vision.add_argument("--out-fps", type=positive_int, default=4, help="frames a second of the video written")
    return p


def input_codes(args, loaded):
    """The codes (T, 256) of --video, --image or --codes/--video-id, or None."""
    codes = None
    if args.video_id or args.codes:
        if not (args.video_id and args.codes):
            raise ValueError("--codes and --video-id go together")
        n_codes = loaded.vocab.n_vision_codes  # codes outside the vocabulary are refused naming their file
        codes = CodeSource(args.fps, args.max_frames, cache=args.codes, n_codes=n_codes).from_cache(args.video_id).codes
    elif args.video or args.image:
        vqgan = args.vqgan or loaded.vqgan or TINY_VQGAN
        load = lambda: load_vqgan(vqgan, preset="tiny").to(args.device)  # noqa: E731
        source = CodeSource(args.fps, args.max_frames, vqgan=load, n_codes=loaded.vocab.n_vision_codes)
        codes = source.from_video(args.video or args.image).codes
    return codes


def prompt_style(args, loaded) -> str:
    return loaded.prompt if args.prompt_style == "auto" else args.prompt_style


def prompt_ids(args, loaded) -> list[int]:
    codes = input_codes(args, loaded)
    if args.raw:
        if codes is not None:
            raise ValueError("--raw takes text only; a video goes in the chat form")
        return loaded.tokenizer.with_bos(loaded.tokenizer.encode(args.prompt))
    return chat_prompt(loaded.tokenizer, loaded.vocab, args.prompt, codes, style=prompt_style(args, loaded))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every input path checked (exit 2 naming the option) before anything loads."""
    parser = build_parser()
    args = parser.parse_args(argv)
    require_paths(parser, args, "--model", "--tokenizer", "--video", "--image", "--codes")
    if sum(bool(x) for x in (args.video, args.image, args.codes or args.video_id)) > 1:
        parser.error("give one of --video, --image, or --codes with --video-id")
    if args.image and not is_image(args.image):
        parser.error(f"--image {args.image}: expected an image file ({' '.join(sorted(IMAGE_EXTENSIONS))})")
    if (args.video or args.image) and not (args.codes or args.video_id):  # only then is the VQGAN needed
        require_paths(parser, args, "--vqgan")
    out = args.image_out or args.video_out
    if args.image_out and args.video_out:
        parser.error("give one of --image-out and --video-out")
    if args.image_out and not args.image_out.lower().endswith(".png"):
        parser.error(f"--image-out {args.image_out}: expected a .png file")
    if args.video_out and not args.video_out.lower().endswith((".gif", ".mp4")):
        parser.error(f"--video-out {args.video_out}: expected a .gif or .mp4 file")
    if args.image_out and (args.frames or 1) != 1:
        parser.error("--image-out makes one frame; give --video-out for --frames > 1")
    if out and not Path(out).resolve().parent.is_dir():
        parser.error(f"{'--image-out' if args.image_out else '--video-out'} {out}: its folder does not exist")
    if not math.isfinite(args.cfg_scale):
        parser.error(f"--cfg-scale must be a finite number, got {args.cfg_scale}")
    if out:  # the VQGAN decodes what is drawn
        require_paths(parser, args, "--vqgan")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    runtime = start(args.device)
    args.device = runtime.device
    if args.image_out or args.video_out:
        return vision_main(args, runtime)
    try:
        loaded, gen = load_generator(args, runtime)
        ids = prompt_ids(args, loaded)
        config = GenerationConfig(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            stop_tokens=[loaded.tokenizer.eos_id],
            seed=args.seed,
            restrict=None if args.restrict == "none" else args.restrict,
        )
    except (FileNotFoundError, ValueError, VideoError) as e:
        print(f"lwm-generate: {e}", file=sys.stderr)
        return 2
    warning = length_warning(
        len(ids) + config.max_new_tokens,
        loaded.model.config.max_seq_len,
        f"the prompt ({len(ids)} tokens) with up to {config.max_new_tokens} new ones reaches",
    )
    if warning and is_rank0():
        print(warning, file=sys.stderr)
    t0 = time.perf_counter()
    out = gen.generate(ids, config)
    seconds = time.perf_counter() - t0
    runtime.close()
    if is_rank0():
        text = loaded.tokenizer.decode([t for t in out if t < loaded.vocab.text_size])
        n_vision = sum(1 for t in out if t >= loaded.vocab.text_size)
        print(text + (f"  [+{n_vision} vision tokens]" if n_vision else ""))
        print(f"[{len(ids)} prompt tokens, {len(out)} new, {seconds:.2f} s]", file=sys.stderr)
    return 0


def vision_main(args, runtime) -> int:
    """--image-out / --video-out: frames generated from the prompt (after --image or --video's frames),
    decoded by the model folder's VQGAN (or --vqgan) into the file, the codes beside it."""
    try:
        loaded, gen = load_generator(args, runtime)
        given = input_codes(args, loaded)
        cond, uncond = vision_prompts(
            loaded.tokenizer,
            loaded.vocab,
            args.prompt,
            style=prompt_style(args, loaded),
            video=bool(args.video_out),
            codes=given,
            raw=args.raw,
        )
        frames = args.frames or (1 if args.image_out else None)
        config = VisionConfig(
            frames=frames,
            max_frames=args.max_new_frames,
            cfg_scale=args.cfg_scale,
            temperature=args.temperature,
            top_k=args.top_k,
            seed=args.seed,
        )
        vqgan = load_vqgan(args.vqgan or loaded.vqgan or TINY_VQGAN, preset="tiny").to(args.device)
    except (FileNotFoundError, ValueError, VideoError) as e:
        print(f"lwm-generate: {e}", file=sys.stderr)
        return 2
    new = config.n_frames * (TOKENS_PER_FRAME + 1)
    warning = length_warning(
        len(cond) + new,
        loaded.model.config.max_seq_len,
        f"the prompt ({len(cond)} tokens) with up to {new} codes reaches",
    )
    if warning and is_rank0():
        print(warning, file=sys.stderr)
    t0 = time.perf_counter()
    codes = generate_vision(gen, cond, config, uncond=None if args.cfg_scale == 1 else uncond)
    seconds = time.perf_counter() - t0
    runtime.close()
    if is_rank0():
        if given is not None:  # the video written goes on from the frames it was given
            codes = torch.cat([torch.as_tensor(given, dtype=torch.long), codes])
        out, codes_path = save_vision(codes, vqgan, args.image_out or args.video_out, fps=args.out_fps)
        print(f"{out} ({len(codes)} frame{'s' if len(codes) > 1 else ''}; codes in {codes_path})")
        print(f"[{len(cond)} prompt tokens, {len(codes)} frames, {seconds:.2f} s]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
