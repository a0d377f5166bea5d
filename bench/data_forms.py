"""Data as people have it, on CPU: each source reader against the JSON-lines reader on the same examples, and
lwm-tokenize's images per second against its video frames per second with the bundled VQGAN.

Readers: N caption records ({"clip": a video path, "caption": 8-40 words}) written as JSON lines (the
baseline), one JSON array, CSV, TSV, parquet and a webdataset shard (per sample a .txt caption and a 2 KiB
.jpg member), measured in the same run: the scan that finds every example (what making an index costs beyond
encoding), reading every example in order, and reading 2,000 at random by one seek each (what a rank does
with an index); examples per second and the ratio to JSON lines.

Tokenization: the same number of frames as images (PNG, 256 x 192, read with Pillow) and as mp4 frames (8 s
at 8 fps, 256 x 192, read with PyAV, every frame taken: --fps 8), through lwm-tokenize's main with the tiny
VQGAN's bundled weights (data/checkpoints/vqgan_tiny.safetensors) on CPU, each after a warm-up run.

    python -m bench.data_forms                   # writes docs/benchmarks.md
    python -m bench.data_forms --examples 2000 --no-write
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.report import command_line, host_line, publish
from lwm.data.sources import open_source
from lwm.video.writer import write_mp4

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the a red green blue circle square triangle moves left right up down appears turns stops".split()
FORMS = ("jsonl", "json", "csv", "tsv", "parquet", "tar")
RANDOM_READS = 2000


def records(n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {"clip": f"clips/c{i % 50}.mp4", "caption": " ".join(rng.choice(WORDS, int(rng.integers(8, 41))))}
        for i in range(n)
    ]


def write_forms(root: Path, rows: list[dict]) -> dict[str, Path]:
    """The same records in each form."""
    paths = {form: root / f"caps.{form}" for form in FORMS}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["json"].write_text(json.dumps(rows, indent=1))
    for form, dialect in (("csv", "excel"), ("tsv", "excel-tab")):
        with open(paths[form], "w", newline="") as f:
            writer = csv.DictWriter(f, ["clip", "caption"], dialect=dialect)
            writer.writeheader()
            writer.writerows(rows)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), paths["parquet"], row_group_size=1000)
    jpg = bytes(2048)
    with tarfile.open(paths["tar"], "w") as tar:
        for i, r in enumerate(rows):
            for ext, data in (("jpg", jpg), ("txt", r["caption"].encode())):
                info = tarfile.TarInfo(f"{i:08d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return paths


def read_rates(path: Path, n: int) -> tuple[float, float, float]:
    """(seconds to scan, examples/s read in order, examples/s read at random) of one source."""
    reader = open_source(path)
    start = time.perf_counter()
    reader.scan()
    scan = time.perf_counter() - start
    assert len(reader) == n, (path, len(reader))
    start = time.perf_counter()
    got = sum(1 for _, ex in reader.examples(0, n) if isinstance(ex, dict))
    ordered = n / (time.perf_counter() - start)
    assert got == n, (path, got)
    picks = np.random.default_rng(1).integers(0, n, RANDOM_READS)
    start = time.perf_counter()
    for i in picks:
        reader.example(int(i))
    return scan, ordered, RANDOM_READS / (time.perf_counter() - start)


def reader_rows(root: Path, n: int) -> list[str]:
    paths = write_forms(root, records(n))
    rates = {form: read_rates(paths[form], n) for form in FORMS}
    base = rates["jsonl"]
    rows = []
    for form in FORMS:
        scan, ordered, random = rates[form]
        rows.append(
            f"| {form} | {paths[form].stat().st_size / n:.0f} | {scan:.3f} | {n / scan:,.0f} | {scan / base[0]:.2f} | "
            f"{ordered:,.0f} | {ordered / base[1]:.2f} | {random:,.0f} | {random / base[2]:.2f} |"
        )
    return rows


def tokenize_rate(inputs: list[str], out: Path, extra: list[str]) -> float:
    """Seconds of one lwm-tokenize run (its output silenced)."""
    from lwm.video.tokenize import main as tokenize

    checkpoint = ROOT / "data" / "checkpoints" / "vqgan_tiny.safetensors"
    argv = [*inputs, "--out", str(out), "--vqgan", "tiny", "--checkpoint", str(checkpoint), "--device", "cpu", *extra]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        start = time.perf_counter()
        assert tokenize(argv) == 0
        return time.perf_counter() - start


def tokenize_rows(root: Path, frames: int) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    images, videos = root / "images", root / "videos"
    images.mkdir()
    videos.mkdir()
    for i in range(frames):
        Image.fromarray(rng.integers(0, 256, (192, 256, 3), dtype=np.uint8)).save(images / f"i{i}.png")
    per_video = 64  # 8 s at 8 fps
    for v in range(frames // per_video):
        write_mp4(videos / f"v{v}.mp4", rng.integers(0, 256, (per_video, 192, 256, 3), dtype=np.uint8), fps=8)
    tokenize_rate([str(images)], root / "warm-images", [])
    tokenize_rate([str(videos)], root / "warm-videos", ["--fps", "8"])
    image_s = tokenize_rate([str(images)], root / "out-images", [])
    video_s = tokenize_rate([str(videos)], root / "out-videos", ["--fps", "8"])
    n_video = frames // per_video * per_video
    return [
        f"| images (PNG) | {frames} | {image_s:.2f} | {frames / image_s:.1f} | {(frames / image_s) / (n_video / video_s):.2f} |",
        f"| video frames (mp4) | {n_video} | {video_s:.2f} | {n_video / video_s:.1f} | 1.00 |",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--frames", type=int, default=256, help="images, and frames of video (a multiple of 64)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        readers = reader_rows(Path(tmp), args.examples)
    with tempfile.TemporaryDirectory() as tmp:
        tokenized = tokenize_rows(Path(tmp), args.frames)
    lines = [
        f"Command: `{command_line()}`  ",
        f"Host: {host_line()}  ",
        f"{args.examples:,} caption records in each form (lwm.data.sources, lwm.data.shards): the scan that finds "
        f"every example, reading all in order, and {RANDOM_READS:,} at random by one seek each (a rank's reads "
        "with an index); the ratio is to JSON lines, measured in the same run.",
        "",
        "| form | bytes per example | scan (s) | scanned examples/s | scan / JSON lines | in order, examples/s | "
        "of JSON lines | at random, examples/s | of JSON lines |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *readers,
        "",
        f"lwm-tokenize with the tiny VQGAN's bundled weights on CPU, {args.frames} images against as many mp4 frames "
        "(256 x 192, every frame taken), each after a warm-up run; the ratio is images/s over frames/s.",
        "",
        "| input | frames | seconds | frames/s | of video frames/s |",
        "| --- | ---: | ---: | ---: | ---: |",
        *tokenized,
    ]
    publish("data-forms", "\n".join(lines), write=not args.no_write)


if __name__ == "__main__":
    main()
