"""Long-video question answering: accuracy of a model on questions about videos, overall and by
video duration.

    python -m lwm.eval.video_qa --model runs/X/hf --data qa.jsonl --out runs/X/eval
    python -m lwm.eval.video_qa --model M --data videomme.jsonl --video-dir videomme/data --codes codes/ --fps 1 --max-frames 512
    torchrun --nproc_per_node 2 -m lwm.eval.video_qa --model M --data qa.jsonl     # prompts split over 2 ranks (context parallel)

Data: JSON lines, one question each,

    {"video": "clips/a.mp4", "question": "What color is the circle?", "options": ["Red.", "Cyan."],
     "answer": "Cyan.", "duration": 95}

(`video` relative to the file's folder or absolute; `options` optional; `answer` an option's text or
its letter; `duration` in seconds or a bucket name; `id` optional), or Video-MME's field names:
`videoID` (the file is --video-dir/<videoID>.mp4), `question_id`, `options` like ["A. ...", "B. ..."],
`answer` a letter, `duration` "short"/"medium"/"long" (a line may also hold a video with a list of
`questions`; a .json file may hold a list of such objects). `vision` (a video id, as in the sample
data) is read like `videoID`.

Video: frames at --fps (1 by default), at most --max-frames spread evenly; codes come from the
lwm-tokenize cache (--codes) when the video is there (id: its path's hashed or stem id, or its
videoID), else the file is read and tokenized with the VQGAN (--vqgan). The prompt is LWM's chat
form, the question before the video:

    [BOS] "You are a helpful assistant. USER: {question}" <vision> frames </vision> "ASSISTANT:"

Multiple choice is scored two ways:
  LL      the log-likelihood of each option's text ("Cyan.") after the prompt of the bare question;
          the most likely option is the answer (the primary metric; the per-token mean is kept too)
  letter  the question lists the options and asks for the letter, as in training
          ("What color ...? A. Red. B. Cyan. Answer with the letter."); greedy generation restricted
          to text; the first standalone option letter in the output is the answer
Open questions (no options): greedy generation, normalized exact match (lowercase; punctuation,
articles and extra whitespace removed).

A question already written in the letter form (the sample data's multiple-choice rows) is cut back
to the bare question. Outputs in --out: video_qa.json (config, summary, one record per item),
video_qa.md (a table by duration bucket, and one by task where items have `task_type` or `kind`),
video_qa.records.jsonl (records appended as items finish, so a killed run keeps them). A bad item
(malformed line, missing or unreadable video, answer not among the options) is recorded with its
reason and the run goes on. Under torchrun every rank takes part in each prompt;
rank 0 reads the videos, writes and prints. Exit status: 0 if every item was scored, 1 if some
were recorded as errors, 2 for a usage error, 130 if interrupted (what was done is written).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from lwm.arg_types import csv_list, positive_float, positive_int
from lwm.eval.qa_items import Item, expand, read_items
from lwm.eval.qa_report import RecordLog, markdown, write_outputs
from lwm.eval.qa_scoring import METHODS, evaluate_item
from lwm.eval.qa_summary import Buckets, summarize
from lwm.eval.qa_videos import VideoSource
from lwm.infer.prompt import DEFAULT_VQGAN
from lwm.infer.runtime import add_model_args, load_generator, start
from lwm.parallel.comm import group_size_and_rank


def run_video_qa(
    generator,
    tokenizer,
    vocab,
    items: list[Item],
    source=None,
    *,
    methods=METHODS,
    buckets: Buckets = Buckets(),
    max_new_tokens: int = 32,
    letter_tokens: int = 8,
    prompt_style: str = "native",
    on_record=None,
    progress: bool = True,
    config: dict | None = None,
) -> dict:
    """Evaluate the items -> {"config", "summary", "records", "complete"}. generator: a
    lwm.infer.Generator (or anything with .score/.generate and .group); source: a VideoSource (or
    anything with .load(item) -> (codes, info)), used on the group's first rank only; on_record(record)
    is called on that rank as each item finishes. Items may also be JSON objects (parsed here, paths
    relative to the working directory). Ctrl-C stops early with what was done."""
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {list(methods)}")

    _, rank = group_size_and_rank(getattr(generator, "group", None))
    items = [
        x
        for k, it in enumerate(items)
        for x in ([it] if isinstance(it, Item) else expand(it, f"item {k + 1}", Path.cwd(), None))
    ]
    records, complete = [], True
    bar = tqdm(items, desc="video QA", unit="q", disable=not progress or rank != 0, dynamic_ncols=True, mininterval=1.0)
    try:
        for item in bar:
            rec = evaluate_item(
                item, generator, tokenizer, vocab, source, methods, buckets, max_new_tokens, letter_tokens, prompt_style
            )
            records.append(rec)
            if rank == 0:
                if on_record is not None:
                    on_record(rec)
                done = [r["correct"] for r in records if r["correct"] is not None]
                bar.set_postfix_str(f"acc {np.mean(done):.3f}" if done else "", refresh=False)
                if rec["error"] is not None:
                    bar.write(f"{rec['id']}: {rec['error_kind']}: {rec['error']}")
    except KeyboardInterrupt:
        complete = False
    finally:
        bar.close()
    return {"config": config or {}, "summary": summarize(records, buckets), "records": records, "complete": complete}


# ------------------------------------------------------------------------------------ command line


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
