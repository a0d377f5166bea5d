"""The video QA command: options, the checks that need no model, the run, the outputs; the forms of
the data and the outputs are in the package's doc."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from lwm.arg_types import csv_list, positive_float, positive_int
from lwm.eval.video_qa.evaluate import run_video_qa
from lwm.eval.video_qa.items import Item, read_items
from lwm.eval.video_qa.report import RecordLog, markdown, write_outputs
from lwm.eval.video_qa.scoring import METHODS
from lwm.eval.video_qa.summary import Buckets
from lwm.eval.video_qa.videos import VideoSource
from lwm.infer.prompt import DEFAULT_VQGAN
from lwm.infer.runtime import add_model_args, load_generator, start


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="video_qa.py",
        description="Long-video question answering accuracy.",
        epilog="Exit status: 0 if every item was scored, 1 if some were recorded as errors, "
        "2 for a usage error, 130 if interrupted.",
    )
    add_model_args(p)
    p.add_argument("--data", required=True, help="JSON lines of questions (or a .json list); see the module's doc")
    p.add_argument("--video-dir", help="folder of <videoID>.mp4 for Video-MME style items")
    p.add_argument("--codes", help="an lwm-tokenize output folder with cached codes")
    p.add_argument(
        "--ids",
        choices=["auto", "hashed", "stem"],
        default="auto",
        help="how cached codes are named (lwm-tokenize --ids); auto tries both",
    )
    p.add_argument(
        "--vqgan",
        help="VQGAN checkpoint (tiny preset) or diffusers folder for videos not in the cache "
        "(default: the model folder's vqgan/, else the bundled tiny VQGAN)",
    )
    p.add_argument("--fps", type=positive_float, default=1.0, help="frames per second (default 1)")
    p.add_argument("--max-frames", type=positive_int, help="at most this many frames, spread evenly")
    p.add_argument(
        "--methods", type=csv_list, default=list(METHODS), help="multiple-choice scoring: ll, letter or ll,letter"
    )
    p.add_argument(
        "--bucket-edges",
        type=csv_list,
        default=["120", "900"],
        help="duration bucket edges in seconds (default 120,900)",
    )
    p.add_argument(
        "--bucket-names", type=csv_list, help="names of the buckets (one more than edges; default short,medium,long)"
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=32, help="tokens generated for an open question")
    p.add_argument("--letter-tokens", type=positive_int, default=8, help="tokens generated for the letter")
    p.add_argument("--limit", type=positive_int, help="only the first N items")
    p.add_argument(
        "--max-duration",
        type=float,
        help="skip items whose given duration (seconds) is longer, e.g. what a CPU cannot prefill in reasonable time",
    )
    p.add_argument("--out", default="runs/eval", help="output folder (default runs/eval)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _usage_error(parser, message: str):
    if _rank() == 0:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
    sys.exit(2)


def _check_paths(parser, args) -> None:
    if not Path(args.model).exists():
        _usage_error(parser, f"--model {args.model}: no such file or folder")
    if not Path(args.data).is_file():
        _usage_error(parser, f"--data {args.data}: no such file")
    if args.video_dir and not Path(args.video_dir).is_dir():
        _usage_error(parser, f"--video-dir {args.video_dir}: no such folder")
    if args.codes and not (Path(args.codes) / "tokens").is_dir():
        _usage_error(parser, f"--codes {args.codes}: no tokens/ folder (expected the output of lwm-tokenize)")
    if args.vqgan is not None and not Path(args.vqgan).exists():
        _usage_error(parser, f"--vqgan {args.vqgan}: no such file or folder")


def _items(parser, args) -> list[Item]:
    """The items of --data, less those over --max-duration, at most --limit; none is a usage error."""
    try:
        items = read_items(args.data, args.video_dir)
    except OSError as e:
        _usage_error(parser, f"--data {args.data}: {e}")
    if args.max_duration is not None:
        n = len(items)
        items = [it for it in items if not (isinstance(it.duration, (int, float)) and it.duration > args.max_duration)]
        if len(items) < n and _rank() == 0:
            print(
                f"skipping {n - len(items)} items longer than --max-duration {args.max_duration:g} s", file=sys.stderr
            )
    if args.limit:
        items = items[: args.limit]
    if not items:
        _usage_error(parser, f"--data {args.data}: no items")
    if any(it.video_key and not it.video for it in items) and not args.codes:
        _usage_error(
            parser, f"--data {args.data} names videos by videoID: pass --video-dir (folder of <videoID>.mp4) or --codes"
        )
    return items


def validate(parser, args) -> tuple[Buckets, list[Item]]:
    """Every check that needs no model, before one loads; a failure exits 2 naming the option."""
    _check_paths(parser, args)
    bad = [m for m in args.methods if m not in METHODS]
    if bad or not args.methods:
        _usage_error(parser, f"--methods: expected ll, letter or ll,letter, got {','.join(args.methods)!r}")
    try:
        edges = tuple(float(e) for e in args.bucket_edges)
        buckets = Buckets(edges, tuple(args.bucket_names) if args.bucket_names else None)
    except ValueError as e:
        _usage_error(parser, f"--bucket-edges/--bucket-names: {e}")
    items = _items(parser, args)
    if _rank() == 0:
        try:
            Path(args.out).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            _usage_error(parser, f"--out {args.out}: {e}")
    return buckets, items


def _config(args, buckets: Buckets, loaded, runtime) -> dict:
    """The run's settings, as video_qa.json records them."""
    return {
        "model": str(args.model),
        "data": str(args.data),
        "video_dir": args.video_dir,
        "codes": args.codes,
        "vqgan": args.vqgan,
        "fps": args.fps,
        "max_frames": args.max_frames,
        "methods": list(args.methods),
        "bucket_edges": list(buckets.edges),
        "bucket_names": list(buckets.names),
        "max_new_tokens": args.max_new_tokens,
        "letter_tokens": args.letter_tokens,
        "limit": args.limit,
        "max_duration": args.max_duration,
        "world_size": runtime.world,
        "layout": args.layout,
        "device": runtime.device,
        "dtype": str(loaded.model.output.weight.dtype).removeprefix("torch."),
        "model_max_seq_len": loaded.model.config.max_seq_len,
    }


def _report(result: dict, out: Path, max_seq_len: int) -> None:
    js, md = write_outputs(result, out)
    print(markdown(result))
    longest = result["summary"]["max_prompt_tokens"]
    if longest > max_seq_len:
        print(
            f"warning: prompts up to {longest} tokens, longer than the model's max_seq_len {max_seq_len}",
            file=sys.stderr,
        )
    print(f"wrote {js} and {md}")


def run(parser, args, buckets: Buckets, items: list[Item]) -> int:
    """Load the model, evaluate the items (rank 0 reads the videos, logs, writes and prints) -> exit status."""
    runtime = start(args.device)
    try:
        loaded, generator = load_generator(args, runtime)
    except (FileNotFoundError, ValueError) as e:
        _usage_error(parser, str(e))
    args.vqgan = str(args.vqgan or loaded.vqgan or DEFAULT_VQGAN)
    first, device = _rank() == 0, runtime.device
    source = (
        VideoSource(args.codes, args.vqgan, fps=args.fps, max_frames=args.max_frames, ids=args.ids, device=device)
        if first
        else None
    )
    config = _config(args, buckets, loaded, runtime)
    log = RecordLog(Path(args.out) / "video_qa.records.jsonl") if first else None
    started = time.perf_counter()
    try:
        result = run_video_qa(
            generator,
            loaded.tokenizer,
            loaded.vocab,
            items,
            source,
            methods=tuple(args.methods),
            buckets=buckets,
            max_new_tokens=args.max_new_tokens,
            letter_tokens=args.letter_tokens,
            prompt_style=loaded.prompt,
            on_record=log,
            progress=not args.no_progress,
            config=config,
        )
    finally:
        if log is not None:
            log.close()
    result["config"]["seconds"] = round(time.perf_counter() - started, 3)
    if first:
        _report(result, Path(args.out), loaded.model.config.max_seq_len)
    runtime.close()
    if not result["complete"]:
        return 130
    return 1 if result["summary"]["errors"]["total"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    buckets, items = validate(parser, args)
    return run(parser, args, buckets, items)


if __name__ == "__main__":
    sys.exit(main())
