"""lwm-tokenize: videos -> VQGAN codes on disk, once per video, resumable, split over workers.

    lwm-tokenize videos/ extra.mp4 list.txt --out data/tokens --fps 1 --vqgan lwm --checkpoint vqgan.pt
    lwm-tokenize list.txt --out data/tokens --max-frames 64 --vqgan path/to/diffusers_vqmodel
    lwm-tokenize videos/ --out data/tokens --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT
    (or python -m lwm.video.tokenize ...)

Inputs are video and image files, folders (searched recursively for their extensions; hidden names
are skipped) and list files (.txt/.lst/.list: one path per line, relative to the list's folder; blank
lines and lines starting with # are skipped). An image (.jpg, .png, .webp, ...) is a one-frame video,
as LWM trains images: cropped and resized as frames are, one frame of codes; the sampling options do
not apply to it. In --out it writes:

    tokens/<id>.npy      uint16 (T, 256) codes of one video; <id> is its file stem + a hash of its path
                         (--ids hashed, the default) or the file stem alone (--ids stem)
    manifest.jsonl       one JSON object per finished video: id, source, sampling, frames, timestamps,
                         tokenizer (preset/checkpoint or diffusers folder, and a hash of the weights),
                         sha256 (of the .npy's bytes: a reader refuses a file changed since)
    failures.jsonl       one JSON object per video that failed in the latest run: source, error
    settings.json        the sampling and tokenizer every video of the folder is made with, claimed by the
                         first run (created whole, never replaced): a run with other settings is refused
    lwm-tokenize.lock    while a run works in the folder: its pid, host and command (lwm.disk.folder_lock)

A rerun skips the videos the manifest holds, and retries the failed ones. The .npy is written to a
temporary file and renamed, and the manifest line is appended after that, so a killed run loses at
most the video in flight. With --shard i/n each worker takes every n-th video of the one sorted list
and writes manifest.<i>-of-<n>.jsonl and failures.<i>-of-<n>.jsonl; every worker reads all manifests.
A second run on the same folder is refused while the first runs; each shard has its own lock
(lwm-tokenize.<i>-of-<n>.lock), so the workers of one sharded run work side by side. Shards started
together with different settings cannot both claim the folder: settings.json is created by one atomic
link, and the others compare their settings with it and refuse. A full disk
stops the run: it is no video's fault, so nothing is recorded as failed. Exit statuses: EXIT_STATUS
below (--help prints it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lwm.arg_types import add_options, device_name, from_args, option, positive_float, positive_int, seconds
from lwm.data.code_cache import save_codes
from lwm.data.form import MEDIA_EXTENSIONS
from lwm.data.sampling import Sampling
from lwm.data.sources import check_columns
from lwm.disk.folder_lock import FolderLocked, output_lock
from lwm.disk.writes import NoSpaceLeft, atomic_file, writes_to
from lwm.interop.vqgan_sources import open_vqgan
from lwm.io import append_jsonl, read_jsonl
from lwm.video.codes import encode_media, video_id
from lwm.video.inputs import check_unique_ids, collect_videos, source_media
from lwm.video.reader import VideoError, default_rate
from lwm.vision.vqgan_config import PRESETS

# Codes are stored as uint16.
_MAX_CODES = 1 << 16
EXIT_STATUS = (
    "Exit status: 0 if no video failed, 1 if some did (see failures.jsonl), 2 for a usage error or an output "
    "folder another run holds, 3 when the disk is full (free space and rerun to resume), 130 when interrupted."
)
EXIT_NO_SPACE = 3
SETTINGS = "settings.json"  # what every video of an output folder is made with


# ------------------------------------------------------------------------------------ arguments


def _shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(-?\d+)\s*/\s*(-?\d+)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected i/n with integers 0 <= i < n (e.g. 0/4), got {text!r}")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"expected i/n with 0 <= i < n and n >= 1, got i={i}, n={n}")
    return i, n


@dataclass(kw_only=True)
class TokenizeConfig:
    """lwm-tokenize's options."""

    inputs: list[str] = option(
        "video and image files, folders (recursive) and list files (.txt/.lst/.list)",
        default_factory=list,
        positional=True,
        nargs="*",
    )
    out: Path = option("output folder (tokens/, manifest, failures)", type=Path)
    source: str | None = option(
        "a data source (JSON lines, JSON array, parquet, CSV/TSV): the media files its --media columns name", None
    )
    media: list[str] = option("the source's media columns (paths of videos or images)", default_factory=list, nargs="+")
    media_root: str | None = option("what the media paths are relative to (default: the source's folder)", None)
    fps: float | None = option("frames per second to sample (default 1.0)", None, type=positive_float, exclusive="rate")
    max_frames: int | None = option(
        "sample this many frames uniformly over the clip instead", None, type=positive_int, exclusive="rate"
    )
    start: float | None = option("clip start in seconds (default: the first frame)", None, type=seconds)
    end: float | None = option("clip end in seconds (default: the end of the video)", None, type=seconds)
    vqgan: str = option("a VQGAN preset name (lwm, tiny) or a folder saved by diffusers (VQModel)", "lwm")
    checkpoint: Path | None = option("state dict for the preset (.pt/.pth/.bin or .safetensors)", None, type=Path)
    batch_size: int = option("frames per VQGAN batch; also frames decoded at once", 16, type=positive_int)
    device: str | None = option("cpu, cuda or cuda:N (default: cuda if available, else cpu)", None, type=device_name)
    ids: str = option(
        "video ids: file stem + path hash (default), or the file stem alone (must be unique)",
        "hashed",
        choices=["hashed", "stem"],
    )
    shard: tuple[int, int] = option("take every N-th video, starting at the I-th", (0, 1), type=_shard, metavar="I/N")


class UsageError(Exception):
    """A bad option, input or output folder, found before any video is read: exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lwm-tokenize",
        description="Tokenize videos with a VQGAN into uint16 (T, 256) codes, resumably.",
        epilog=EXIT_STATUS,
    )
    return add_options(p, TokenizeConfig)


# ------------------------------------------------------------------------------------ the VQGAN


def _open(args: TokenizeConfig):
    """The VQGAN of --vqgan (a preset, with --checkpoint its weights, or a diffusers folder) and its identity."""
    if Path(args.vqgan).is_dir():
        if args.checkpoint is not None:
            raise ValueError(
                f"--checkpoint is for a preset; {args.vqgan} is a diffusers folder and holds its own weights"
            )
        model, identity = open_vqgan(args.vqgan)
    elif args.vqgan not in PRESETS:
        raise ValueError(f"--vqgan {args.vqgan!r} is neither a folder nor a preset; presets: {sorted(PRESETS)}")
    else:
        model, identity = open_vqgan(args.checkpoint, args.vqgan)
    if model.config.n_codes > _MAX_CODES:
        raise ValueError(f"the VQGAN has {model.config.n_codes} codes; uint16 token files hold at most {_MAX_CODES}")
    return model, identity


# ------------------------------------------------------------------------------------ output


class OutputDir:
    """tokens/, the manifest(s) and the failures file of one output folder, as seen by one worker."""

    def __init__(self, root: Path, shard: tuple[int, int]):
        self.root = root
        self.tokens = root / "tokens"
        self.tokens.mkdir(parents=True, exist_ok=True)
        i, n = shard
        suffix = "" if n == 1 else f".{i}-of-{n}"
        self.manifest = root / f"manifest{suffix}.jsonl"
        self.failures = root / f"failures{suffix}.jsonl"
        self.lock_name = f"lwm-tokenize{suffix}"  # shards of one run work side by side

    def finished(self) -> dict[str, dict]:
        """Records of finished videos by id, from every worker's manifest; a record whose .npy is gone does not count."""
        records = {}
        for path in sorted(self.root.glob("manifest*.jsonl")):
            for record in read_jsonl(path):  # a line cut short by a killed run is skipped: that video is done again
                if isinstance(record, dict) and "id" in record:  # what the checks need, not the timestamps
                    records[record["id"]] = {k: record.get(k) for k in ("id", "sampling", "tokenizer")}
        return {k: r for k, r in records.items() if (self.tokens / f"{k}.npy").is_file()}

    def claim(self, settings: dict) -> dict | None:
        """Claim the folder for `settings` (settings.json, made whole by a temporary file and one link, which
        fails when it exists): None once claimed, by this call or an earlier one with the same settings;
        else the settings that hold it. Atomic across shards started together."""
        path = self.root / SETTINGS
        if path.is_file():  # claimed before: compared, nothing written (a rerun on a full disk gets to its codes)
            return self._compare(path, settings)
        fd, name = tempfile.mkstemp(prefix=f".{SETTINGS}.", dir=self.root)  # one per process and thread
        tmp = Path(name)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(settings, indent=1, sort_keys=True) + "\n")
        try:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError:  # a filesystem without hard links: an exclusive create, then the bytes
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w") as f:
                    f.write(tmp.read_text())
            return None
        except FileExistsError:
            return self._compare(path, settings)
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _compare(path: Path, settings: dict) -> dict | None:
        try:
            held = json.loads(path.read_text())
        except ValueError as e:
            raise ValueError(f"{path} is not the JSON lwm-tokenize writes ({e})") from None
        return None if _same_settings(held, settings) else held

    def start(self) -> None:
        """An empty failures file: it holds this run's failures only (a rerun retries them)."""
        with writes_to(self.failures):
            self.failures.write_text("")

    def write(self, record: dict, codes: np.ndarray) -> None:
        """The codes file, then its manifest record with the file's sha256 (checked when it is read)."""
        # through <id>.npy.tmp, removed if the write fails; one worker owns an id, so the name is safe
        with atomic_file(self.tokens / f"{record['id']}.npy") as f:
            sha256 = save_codes(f, codes)
        append_jsonl(self.manifest, {**record, "sha256": sha256})  # only now is the video done

    def fail(self, record: dict) -> None:
        append_jsonl(self.failures, record)


# ------------------------------------------------------------------------------------ the run


def _check_compatible(finished: dict[str, dict], sampling: dict, tokenizer: dict) -> str | None:
    for record in finished.values():
        if record.get("sampling") != sampling or record.get("tokenizer", {}).get("weights") != tokenizer["weights"]:
            return (
                f"the output folder already holds tokens made with other settings (video {record.get('id')}: sampling "
                f"{record.get('sampling')}, tokenizer {record.get('tokenizer')}); this run has sampling {sampling}, "
                f"tokenizer {tokenizer}. Use another --out, or the same settings to resume"
            )
    return None


def _same_settings(a: dict, b: dict) -> bool:
    """Whether tokens made with settings `a` and `b` agree: the sampling, and the VQGAN's weights."""
    return a.get("sampling") == b.get("sampling") and (a.get("tokenizer") or {}).get("weights") == (
        b.get("tokenizer") or {}
    ).get("weights")


def _differences(held: dict, mine: dict) -> str:
    """The settings that differ, as `name: held -> mine`."""
    held_s, mine_s = held.get("sampling") or {}, mine.get("sampling") or {}
    out = [
        f"{k} {held_s.get(k)} -> {mine_s.get(k)}"
        for k in sorted(set(held_s) | set(mine_s))
        if held_s.get(k) != mine_s.get(k)
    ]
    held_w, mine_w = (held.get("tokenizer") or {}).get("weights"), (mine.get("tokenizer") or {}).get("weights")
    if held_w != mine_w:
        out.append(f"VQGAN weights {held_w} -> {mine_w}")
    return ", ".join(out)


@dataclass
class Job:
    """A checked lwm-tokenize command: the VQGAN on its device, the output folder, what is left."""

    model: torch.nn.Module
    tokenizer: dict  # the VQGAN's identity, recorded with every video
    sampling: Sampling
    out: OutputDir
    finished: dict[str, dict]  # id -> manifest record of the videos already done
    videos: list[str]  # this shard's videos
    ids: str
    batch_size: int
    shard: tuple[int, int]


def _inputs(args: TokenizeConfig) -> list[str]:
    """The media files of the inputs and the source, sorted; UsageError when they name none."""
    if bool(args.source) != bool(args.media):
        raise UsageError("--source and --media go together: a data source and its media columns")
    if not args.inputs and not args.source:
        raise UsageError(
            "nothing to tokenize: give video or image files, folders, list files, or --source with --media"
        )
    named, problems = [], []
    if args.source:
        if not Path(args.source).is_file():
            raise UsageError(f"--source {args.source} does not exist")
        try:
            check_columns(args.source, args.media)
            named, problems = source_media(args.source, args.media, args.media_root)
        except (OSError, ValueError) as e:
            raise UsageError(f"--source {args.source}: {e}")
    found = sorted(set(collect_videos(args.inputs, problems)) | set(named))
    for problem in problems[:3]:
        print(f"warning: {problem}", file=sys.stderr)
    if len(problems) > 3:
        print(f"warning: and {len(problems) - 3} more such problems", file=sys.stderr)
    if not found:  # folders without media, an empty list file: nothing would be done, and nothing said
        where = ", ".join([*args.inputs, *([f"the {args.media} columns of {args.source}"] if args.source else [])])
        raise UsageError(
            f"no video or image in {where} (folders are searched for "
            f"{' '.join(sorted(MEDIA_EXTENSIONS))}; list files name one path a line)"
        )
    return found


def validate(args: TokenizeConfig, held: ExitStack) -> Job:
    """Everything checked before any video is read; a problem raises UsageError (NoSpaceLeft for a full
    disk). The output folder's lock is entered into `held`, which the caller keeps open while the job runs."""
    all_videos = _inputs(args)
    try:
        sampling = default_rate(args.fps, args.max_frames, args.start, args.end)
    except ValueError as e:
        raise UsageError(str(e))
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        raise UsageError(f"--device {args.device!r}: {e}")
    try:
        model, tokenizer = _open(args)
        model.to(device)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise UsageError(str(e))
    if args.checkpoint is None and "preset" in tokenizer:
        print(f"warning: no --checkpoint; preset {args.vqgan!r} has random weights (seed 0)", file=sys.stderr)
    try:
        with writes_to(args.out):
            out = OutputDir(args.out, args.shard)
        held.enter_context(output_lock(out.root, out.lock_name))  # before reading what is done
        finished = out.finished()
    except FolderLocked as e:
        raise UsageError(f"--out: {e}")
    except NoSpaceLeft:
        raise
    except (OSError, ValueError) as e:  # ValueError: a manifest line that is not JSON (JsonlError)
        raise UsageError(f"--out {args.out}: {e}")
    problem = _check_compatible(finished, sampling.to_dict(), tokenizer)
    if problem:
        raise UsageError(problem)
    settings = {"sampling": sampling.to_dict(), "tokenizer": tokenizer}
    try:
        with writes_to(out.root):
            held_by = out.claim(settings)
    except NoSpaceLeft:
        raise
    except (OSError, ValueError) as e:
        raise UsageError(f"--out {args.out}: {e}")
    if held_by is not None:  # another shard or run claimed it first, maybe still running
        raise UsageError(
            f"--out {out.root} is claimed for other settings ({out.root / SETTINGS}): {_differences(held_by, settings)} "
            "(its setting -> this run's). Use its settings, or another --out"
        )
    clash = check_unique_ids(all_videos, args.ids)
    if clash:
        raise UsageError(clash)
    shard_i, shard_n = args.shard
    videos = all_videos[shard_i::shard_n]
    return Job(model, tokenizer, sampling, out, finished, videos, args.ids, args.batch_size, args.shard)


def manifest_record(job: Job, vid: str, path: str, codes: np.ndarray, video, timestamps) -> dict:
    return {
        "id": vid,
        "source": path,
        "tokens": f"tokens/{vid}.npy",
        "frames": len(codes),
        "shape": list(codes.shape),
        "timestamps": [round(float(t), 6) for t in timestamps],
        "sampling": job.sampling.to_dict(),
        "resolution": job.model.config.resolution,
        "video": {
            "width": int(video.width),
            "height": int(video.height),
            "num_frames": int(video.num_frames),
            "duration": round(video.duration, 6),
        },
        "tokenizer": job.tokenizer,
    }


def tokenize(job: Job) -> int:
    """Tokenize the videos not in the manifest yet; a video that fails is recorded and the run goes on.
    Exit status 0, 1 when some video failed, 3 when the disk is full, 130 when interrupted (a rerun
    resumes)."""
    from tqdm import tqdm  # lwm.video.reader keeps decord's and ffmpeg's own messages out of the bar

    done = skipped = failed = frames = 0
    started = time.perf_counter()
    progress = tqdm(total=0, unit="frame", desc="tokenize", dynamic_ncols=True, mininterval=1.0)
    try:
        job.out.start()
        with torch.inference_mode():
            for path in job.videos:
                vid = video_id(path, job.ids)
                progress.set_postfix_str(f"videos {done + skipped + failed}/{len(job.videos)}, failed {failed}")
                if vid in job.finished:
                    skipped += 1
                    continue
                try:
                    codes, timestamps, video = encode_media(
                        path, job.model, job.sampling, job.batch_size, np.uint16, progress
                    )
                    job.out.write(manifest_record(job, vid, path, codes, video, timestamps), codes)
                    done += 1
                    frames += len(codes)
                except NoSpaceLeft:
                    raise  # not the video's fault, and no failure could be recorded
                except Exception as e:  # one bad video must not stop the run
                    failed += 1
                    error = str(e) if isinstance(e, VideoError) else f"{path}: {type(e).__name__}: {e}"
                    job.out.fail({"id": vid, "source": path, "error": error, "type": type(e).__name__})
                    progress.write(f"failed: {error}")
    except KeyboardInterrupt:
        progress.close()
        print(f"interrupted: {done} done, {skipped} skipped, {failed} failed; rerun to resume", file=sys.stderr)
        return 130
    except NoSpaceLeft as e:
        progress.close()
        print(
            f"lwm-tokenize: {e}: stopped with {done} done, {skipped} skipped, {failed} failed; "
            "free space and rerun with the same --out to resume",
            file=sys.stderr,
        )
        return EXIT_NO_SPACE
    progress.close()
    elapsed = time.perf_counter() - started
    shard_i, shard_n = job.shard
    shard = "" if shard_n == 1 else f" (shard {shard_i}/{shard_n})"
    print(
        f"{len(job.videos)} videos{shard}: {done} done ({frames} frames, {frames / max(elapsed, 1e-9):.1f} frames/s), "
        f"{skipped} skipped (already in the manifest), {failed} failed"
        + (f" (see {job.out.failures})" if failed else "")
    )
    return 1 if failed else 0


def run(config: TokenizeConfig) -> int:
    """Check the config, hold the output folder and tokenize -> exit status (tokenize's). Raises UsageError,
    or NoSpaceLeft when the disk is full before the run starts."""
    with ExitStack() as held:  # the output folder's lock, until the run ends
        return tokenize(validate(config, held))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    config = from_args(TokenizeConfig, parser.parse_args(argv))
    try:
        return run(config)
    except UsageError as e:
        parser.error(str(e))
    except NoSpaceLeft as e:
        parser.exit(EXIT_NO_SPACE, f"lwm-tokenize: {e}; free space and rerun\n")


if __name__ == "__main__":
    sys.exit(main())
