"""The video QA command, a typed config plus run(config): VideoQAConfig's fields are the options
(lwm.arg_types builds the parser from them), validate checks what needs no model, run loads the model
and evaluates. The forms of the data and the outputs are in the package's doc."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lwm.arg_types import add_options, csv_list, from_args, option, positive_float, positive_int
from lwm.eval.video_qa.evaluate import run_video_qa
from lwm.eval.video_qa.files import FormatError, Reader
from lwm.eval.video_qa.items import DuplicateIdError, Item
from lwm.eval.video_qa.report import RecordLog, markdown, write_outputs
from lwm.eval.video_qa.scoring import METHODS
from lwm.eval.video_qa.summary import Buckets
from lwm.eval.video_qa.videos import VideoSource, probe_seconds
from lwm.infer.generator import length_warning
from lwm.infer.runtime import ModelOptions, load_generator, start
from lwm.paths import TINY_VQGAN
from lwm.ranks import is_rank0


@dataclass(kw_only=True)
class VideoQAConfig:
    """python -m lwm.eval.video_qa's options."""

    load: ModelOptions  # --model, --tokenizer, --device, --dtype, --layout, --prefill-chunk
    data: str = option(
        "the questions: Video-MME's parquet or JSON, LongVideoBench's JSON or parquet, MLVU's task JSON or json/ "
        "folder, or JSON lines; see the module's doc"
    )
    video_dir: str | None = option(
        "the videos: Video-MME's data/ (<videoID>.mp4), LongVideoBench's videos/, MLVU's video/ "
        "(default for the last two: beside the data, as released)",
        None,
    )
    subtitles: str | None = option(
        "the subtitles' folder (Video-MME's subtitle/, LongVideoBench's subtitles/): prompts in the "
        "benchmark's with-subtitles setting",
        None,
    )
    codes: str | None = option("an lwm-tokenize output folder with cached codes", None)
    ids: str = option(
        "how cached codes are named (lwm-tokenize --ids); auto tries both", "auto", choices=["auto", "hashed", "stem"]
    )
    vqgan: str | None = option(
        "VQGAN checkpoint (tiny preset) or diffusers folder for videos not in the cache "
        "(default: the model folder's vqgan/, else the bundled tiny VQGAN)",
        None,
    )
    fps: float = option("frames per second (default 1)", 1.0, type=positive_float)
    max_frames: int | None = option("at most this many frames, spread evenly", None, type=positive_int)
    methods: list[str] = option(
        "multiple-choice scoring: ll, letter or ll,letter", default_factory=lambda: list(METHODS), type=csv_list
    )
    bucket_edges: list[str] = option(
        "duration bucket edges in seconds (default 120,900)", default_factory=lambda: ["120", "900"], type=csv_list
    )
    bucket_names: list[str] | None = option(
        "names of the buckets (one more than edges; default short,medium,long)", None, type=csv_list
    )
    max_new_tokens: int = option("tokens generated for an open question", 32, type=positive_int)
    letter_tokens: int = option("tokens generated for the letter", 8, type=positive_int)
    limit: int | None = option("only the first N items", None, type=positive_int)
    max_duration: float | None = option(
        "skip items whose given duration (seconds) is longer, e.g. what a CPU cannot prefill in reasonable time",
        None,
        type=float,
    )
    out: str = option("output folder (default runs/eval)", "runs/eval")
    progress: bool = option("no progress bar", True, flag="--no-progress", action="store_false")


@dataclass
class Checked:
    """What validate found: the duration buckets and the items to evaluate."""

    buckets: Buckets
    items: list[Item]


class UsageError(Exception):
    """A bad option or input, before anything is evaluated: exit status 2, the message naming the option."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lwm.eval.video_qa",
        description="Long-video question answering accuracy.",
        epilog="Exit status: 0 if every item was scored, 1 if some were recorded as errors, "
        "2 for a usage error, 130 if interrupted.",
    )
    return add_options(p, VideoQAConfig)


def _check_paths(args: VideoQAConfig) -> None:
    if not Path(args.load.model).exists():
        raise UsageError(f"--model {args.load.model}: no such file or folder")
    if not Path(args.data).exists():
        raise UsageError(f"--data {args.data}: no such file")
    if args.video_dir and not Path(args.video_dir).is_dir():
        raise UsageError(f"--video-dir {args.video_dir}: no such folder")
    if args.subtitles and not Path(args.subtitles).is_dir():
        raise UsageError(f"--subtitles {args.subtitles}: no such folder")
    if args.codes and not (Path(args.codes) / "tokens").is_dir():
        raise UsageError(f"--codes {args.codes}: no tokens/ folder (expected the output of lwm-tokenize)")
    if args.vqgan is not None and not Path(args.vqgan).exists():
        raise UsageError(f"--vqgan {args.vqgan}: no such file or folder")


def _seconds(item: Item, probed: dict) -> float | None:
    """The item's length in seconds: as given, or for a named duration ("long") the file's, read from its header."""
    if isinstance(item.duration, (int, float)):
        return float(item.duration)
    if item.video is None or item.error is not None:  # a failed item's file is never opened
        return None
    if item.video not in probed:
        probed[item.video] = probe_seconds(item.video)
    return probed[item.video]


def _items(args: VideoQAConfig) -> list[Item]:
    """The items of --data, less those over --max-duration, at most --limit; none is a usage error, and so
    is a file in no known format (FormatError names the formats)."""
    reader = Reader(args.video_dir, args.subtitles)
    try:
        items = reader.read(args.data)
    except (FormatError, DuplicateIdError) as e:
        raise UsageError(f"--data {e}")
    except OSError as e:
        raise UsageError(f"--data {args.data}: {e}")
    for why, n in reader.skipped.items():
        if is_rank0():
            print(f"skipping {n} items: {why}", file=sys.stderr)
    if args.max_duration is not None:
        n, probed = len(items), {}
        items = [it for it in items if not ((_seconds(it, probed) or 0) > args.max_duration)]
        if len(items) < n and is_rank0():
            print(
                f"skipping {n - len(items)} items longer than --max-duration {args.max_duration:g} s", file=sys.stderr
            )
    if args.limit:
        items = items[: args.limit]
    if not items:
        raise UsageError(f"--data {args.data}: no items")
    if any(it.video_key and not it.video for it in items) and not args.codes:
        raise UsageError(
            f"--data {args.data} names videos by videoID: pass --video-dir (folder of <videoID>.mp4) or --codes"
        )
    return items


def validate(args: VideoQAConfig) -> Checked:
    """Every check that needs no model, before one loads; a failure exits 2 naming the option."""
    _check_paths(args)
    bad = [m for m in args.methods if m not in METHODS]
    if bad or not args.methods:
        raise UsageError(f"--methods: expected ll, letter or ll,letter, got {','.join(args.methods)!r}")
    try:
        edges = tuple(float(e) for e in args.bucket_edges)
        buckets = Buckets(edges, tuple(args.bucket_names) if args.bucket_names else None)
    except ValueError as e:
        raise UsageError(f"--bucket-edges/--bucket-names: {e}")
    items = _items(args)
    if is_rank0():
        try:
            Path(args.out).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--out {args.out}: {e}")
    return Checked(buckets, items)


def _config(args: VideoQAConfig, buckets: Buckets, loaded, runtime) -> dict:
    """The run's settings, as video_qa.json records them."""
    return {
        "model": str(args.load.model),
        "data": str(args.data),
        "video_dir": args.video_dir,
        "subtitles": args.subtitles,
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
        "layout": args.load.layout,
        "device": runtime.device,
        "dtype": str(loaded.model.head_weight.dtype).removeprefix("torch."),
        "model_max_seq_len": loaded.model.config.max_seq_len,
    }


def _report(result: dict, out: Path, max_seq_len: int) -> None:
    js, md, *others = write_outputs(result, out)
    print(markdown(result))
    for path in others:
        print(f"wrote {path}")
    warning = length_warning(result["summary"]["max_prompt_tokens"], max_seq_len, "prompts up to")
    if warning:
        print(warning, file=sys.stderr)
    print(f"wrote {js} and {md}")


def run(config: VideoQAConfig, checked: Checked | None = None) -> int:
    """Load the model, evaluate the items (rank 0 reads the videos, logs, writes and prints) -> exit status.
    Raises UsageError for a bad option or a model that cannot load."""
    checked = checked or validate(config)
    runtime = start(config.load.device)
    try:
        loaded, generator = load_generator(config.load, runtime)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(str(e)) from e
    args = dataclasses.replace(config, vqgan=str(config.vqgan or loaded.vqgan or TINY_VQGAN))
    first, device = is_rank0(), runtime.device
    source = (
        VideoSource(
            args.codes,
            args.vqgan,
            fps=args.fps,
            max_frames=args.max_frames,
            ids=args.ids,
            device=device,
            n_codes=loaded.vocab.n_vision_codes,
        )
        if first
        else None
    )
    log = RecordLog(Path(args.out) / "video_qa.records.jsonl") if first else None
    started = time.perf_counter()
    try:
        result = run_video_qa(
            generator,
            loaded.tokenizer,
            loaded.vocab,
            checked.items,
            source,
            methods=tuple(args.methods),
            buckets=checked.buckets,
            max_new_tokens=args.max_new_tokens,
            letter_tokens=args.letter_tokens,
            prompt_style=loaded.prompt,
            on_record=log,
            progress=args.progress,
            config=_config(args, checked.buckets, loaded, runtime),
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
    config = from_args(VideoQAConfig, parser.parse_args(argv))
    try:
        return run(config, validate(config))
    except UsageError as e:
        if is_rank0():  # every rank stops; one says why
            parser.print_usage(sys.stderr)
            print(f"{parser.prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
