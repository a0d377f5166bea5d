"""VQGAN tokenization: encode throughput, decoding vs encoding time, and streaming an hour of video at 1 fps.

Part 1 (encode): the `lwm` preset (random weights) encodes 256x256 frames at a few batch sizes; the
throughput is compared with batch 1, measured in alternating rounds in this process (median per
batch size). Then a short generated 256x256 video is tokenized end to end the way lwm-tokenize does
it (stream_video chunks -> VQGAN.encode), timing decoding and the encoder separately. On CPU the
model runs in fp32; `--device cuda` runs it in bf16 with channels_last weights (frames are moved to
the GPU inside the timed encode of the end-to-end run, and are already there in the throughput run).

Part 2 (stream): a low-resolution 60-minute video and a 10-minute one (the same first 10 minutes)
are generated once into a cache folder; each is then streamed at 1 fps, resized to 256, in chunks
(no encoding) in a fresh subprocess that reports its wall time and the rise of its peak RSS
(VmHWM) over the RSS after imports. Targets: peak memory flat from 10 to 60 minutes (within 10%)
and time linear in the number of sampled frames (time per sampled frame at 60 minutes at most
1.1x that at 10 minutes).

    python -m bench.vqgan      # both parts; 3-8 min on 2 CPU cores (quiet - shared); writes docs/benchmarks.md
    python -m bench.vqgan --no-write --parts stream --minutes 2 12
    python -m bench.vqgan --no-write --parts encode --batch-sizes 1 8 --rounds 1
    python -m bench.vqgan --device cuda --batch-sizes 8 32 64 --frames-per-round 64   # bf16 + channels_last

One file for one command (longer than most here for that reason): both parts share the generated
videos, the child processes that measure memory and the section they are reported in.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench.report import command_line, host_line, reset_peak_rss, status_kib, write_section
from lwm.paths import REPO
from lwm.video.reader import stream_video
from lwm.vision.vqgan import VQGAN
from lwm.vision.vqgan_config import VQGANConfig

DEFAULT_CACHE = Path(tempfile.gettempdir()) / "lwm-bench-vqgan"
# Video files are made with libx264 at this quality; "ultrafast" keeps generating an hour quick.
X264_OPTIONS = {"preset": "ultrafast", "crf": "30"}


# ------------------------------------------------------------------------------------ test videos


class Scene:
    """Cheap, compressible, ever-changing frames: a smooth random texture panning back and forth,
    with a square that moves and changes colour every frame (so no two frames are the same)."""

    PAD = 64  # the texture is this much larger than the frame on every side

    def __init__(self, width: int, height: int, seed: int = 0):
        self.width, self.height = width, height
        rng = np.random.default_rng(seed)
        th, tw = height + 2 * self.PAD, width + 2 * self.PAD
        coarse = torch.from_numpy(rng.integers(0, 256, (3, th // 16 + 2, tw // 16 + 2)).astype(np.float32))
        smooth = F.interpolate(coarse[None], scale_factor=16, mode="bilinear", align_corners=False)[0]  # (3, ~th, ~tw)
        self.texture = smooth[:, :th, :tw].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).contiguous().numpy()

    @staticmethod
    def _triangle(i: int, span: int) -> int:
        i %= 2 * span
        return i if i < span else 2 * span - i

    def frame(self, i: int) -> np.ndarray:
        """(height, width, 3) uint8."""
        dx, dy = self._triangle(i, 2 * self.PAD), self._triangle(i // 3, 2 * self.PAD)
        img = self.texture[dy : dy + self.height, dx : dx + self.width].copy()
        side = max(4, self.height // 6)
        x, y = (3 * i) % (self.width - side), (2 * i) % (self.height - side)
        img[y : y + side, x : x + side] = (255, 255 - i % 256, (7 * i) % 256)
        return img


def write_videos(outputs: list[tuple[Path, int]], width: int, height: int, fps: int) -> None:
    """Write the videos in one pass: output k holds the first n_k frames of the same scene.
    Each is written to a temporary name and renamed when complete, so the cache never holds half a file."""
    import av

    scene = Scene(width, height)
    open_ = []
    for path, n in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.stem + ".partial" + path.suffix)
        container = av.open(str(tmp), "w")
        stream = container.add_stream("libx264", rate=fps, options=dict(X264_OPTIONS))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        open_.append([container, stream, n, tmp, path])
    for i in range(max(n for _, n in outputs)):
        frame = av.VideoFrame.from_ndarray(scene.frame(i), format="rgb24")
        for entry in open_:
            container, stream, n, tmp, path = entry
            if container is None or i >= n:
                continue
            container.mux(stream.encode(frame))
            if i == n - 1:
                container.mux(stream.encode())
                container.close()
                tmp.rename(path)
                entry[0] = None


def cached_videos(cache: Path, lengths_s: list[float], width: int, height: int, fps: int) -> tuple[list[Path], float]:
    """Paths of the videos (one per length), generating those not in the cache; and the seconds spent generating."""
    paths = [cache / f"scene_{width}x{height}_{fps}fps_{s:g}s.mp4" for s in lengths_s]
    missing = [(p, round(s * fps)) for p, s in zip(paths, lengths_s) if not p.exists()]
    start = time.perf_counter()
    if missing:
        print(f"generating {', '.join(p.name for p, _ in missing)} in {cache} ...", flush=True)
        write_videos(missing, width, height, fps)
    return paths, time.perf_counter() - start


# ------------------------------------------------------------------------------------ part 1: encode


def build_model(preset: str, device: str):
    torch.manual_seed(0)
    model = VQGAN(VQGANConfig.from_preset(preset)).eval()
    if device == "cuda":
        # bf16 weights in channels_last: cuDNN then runs every conv channels_last (it follows the weight's
        # format even though VQGAN._to_input hands it plain NCHW input). The quantizer's distances stay fp32.
        model = model.to(device="cuda", dtype=torch.bfloat16, memory_format=torch.channels_last)
        torch.backends.cudnn.benchmark = True  # fixed shapes per batch size: let cuDNN pick its kernels once
    return model


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def encode_throughput(
    model, device: str, batch_sizes: list[int], frames_per_round: int, rounds: int
) -> dict[int, float]:
    """Median seconds to encode `frames_per_round` frames, per batch size (alternating rounds after a warm-up)."""
    r = model.config.resolution
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (frames_per_round, r, r, 3), dtype=torch.uint8, generator=g).to(device)
    model.encode(frames[:1], batch_size=1)  # warm-up; the alternating rounds spread any later one-off cost
    _sync(device)
    times: dict[int, list[float]] = {bs: [] for bs in batch_sizes}
    for _ in range(rounds):
        for bs in batch_sizes:
            gc.collect()
            start = time.perf_counter()
            model.encode(frames, batch_size=bs)
            _sync(device)
            times[bs].append(time.perf_counter() - start)
    return {bs: statistics.median(t) for bs, t in times.items()}


def tokenize_video(model, device: str, path: Path, fps: float, batch_size: int) -> dict:
    """Tokenize one video as lwm-tokenize does (chunks of batch_size frames), timing decoding and encoding apart."""
    chunks = stream_video(path, fps=fps, resolution=model.config.resolution, chunk_size=batch_size)
    t_decode = t_encode = 0.0
    n = 0
    while True:
        start = time.perf_counter()
        chunk = next(chunks, None)  # opening the file (decord's index) and decoding (PyAV), resizing and cropping
        t_decode += time.perf_counter() - start
        if chunk is None:
            break
        frames, _ = chunk
        start = time.perf_counter()
        codes = model.encode(torch.from_numpy(frames).to(device), batch_size=batch_size)
        _sync(device)
        t_encode += time.perf_counter() - start
        assert codes.shape == (len(frames), model.config.tokens_per_frame)
        n += len(frames)
    return dict(frames=n, decode_s=t_decode, encode_s=t_encode)


# ------------------------------------------------------------------------------------ part 2: stream


def _bytes_read() -> int:
    """Bytes this process has read through read() and friends, from the page cache or the disk."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("rchar not in /proc/self/io")


def stream_here(path: str, fps: float, resolution: int, chunk_size: int) -> dict:
    """Stream all sampled frames of one video (run in a fresh process): wall time and memory, in MiB."""
    import av  # noqa: F401  the decoders' libraries count as imports, not as memory the streaming holds
    import decord  # noqa: F401

    gc.collect()
    base = reset_peak_rss()
    read0 = _bytes_read()
    start = time.perf_counter()
    first_s = None
    frames = 0
    rss_first = rss_last = base
    for chunk, _ in stream_video(path, fps=fps, resolution=resolution, chunk_size=chunk_size):
        assert chunk.shape[1:] == (resolution, resolution, 3), chunk.shape
        frames += len(chunk)
        rss_last = status_kib("VmRSS")
        if first_s is None:
            first_s, rss_first = time.perf_counter() - start, rss_last
    total = time.perf_counter() - start
    return dict(
        frames=frames,
        total_s=total,
        first_s=first_s,
        base_mib=base / 1024,
        read_x=(_bytes_read() - read0) / os.path.getsize(path),
        peak_rise_mib=(status_kib("VmHWM") - base) / 1024,
        drift_mib=(rss_last - rss_first) / 1024,
    )


def stream_in_subprocess(path: Path, fps: float, resolution: int, chunk_size: int) -> dict:
    # glibc returns a freed block to the OS only if it was mmapped, and by default it raises its mmap
    # threshold (up to 32 MiB) after such a block is freed, so later chunk-sized buffers come from the
    # heap and stay resident after they are freed: RSS would then track allocation history, not live
    # memory. Setting the threshold fixes it (no dynamic adjustment): every block of 64 KiB or more is
    # mmapped and unmapped on free, so peak RSS measures what the streaming really holds at once.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [
        sys.executable,
        "-m",
        "bench.vqgan",
        "--stream-child",
        str(path),
        "--sample-fps",
        str(fps),
        "--resolution",
        str(resolution),
        "--chunk-size",
        str(chunk_size),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=REPO).stdout
    return json.loads(out.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------ report


def _verdict(ratio: float, limit: float, what: str) -> str:
    if ratio <= limit:
        return f"**met**: {what} {ratio:.3f}x (limit {limit:.2f}x, {100 * (limit - ratio):.1f} points to spare)"
    return f"**missed**: {what} {ratio:.3f}x, {100 * (ratio - limit):.1f} points over the {limit:.2f}x limit"


def part_encode(args) -> list[str]:
    model = build_model(args.preset, args.device)
    cfg = model.config
    n_params = sum(p.numel() for p in model.encoder.parameters()) + sum(p.numel() for p in model.quantizer.parameters())
    n_all = sum(p.numel() for p in model.parameters())
    dtype = "bf16, channels_last" if args.device == "cuda" else "fp32"
    print(f"encode: preset {args.preset} on {args.device} ({dtype}), batch sizes {args.batch_sizes}", flush=True)
    times = encode_throughput(model, args.device, args.batch_sizes, args.frames_per_round, args.rounds)
    base = times[args.batch_sizes[0]]
    rows = [
        f"| batch size | time for {args.frames_per_round} frames (s) | frames/s | throughput vs batch {args.batch_sizes[0]} |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for bs, t in times.items():
        rows.append(f"| {bs} | {t:.2f} | {args.frames_per_round / t:.2f} | {base / t:.3f} |")
        print(
            f"  batch {bs:3d}: {args.frames_per_round / t:.2f} frames/s  ({base / t:.3f}x batch {args.batch_sizes[0]})",
            flush=True,
        )

    best_bs = min(times, key=times.get)
    best_fps = args.frames_per_round / times[best_bs]
    where = "within it" if 1 <= best_fps <= 2 else ("above it" if best_fps > 2 else f"{best_fps:.2f}x of its low end")
    ref = (
        f"the project's planning estimate is about 1-2 frames/s on 2 CPU cores for this model; the best here, "
        f"{best_fps:.2f} frames/s at batch {best_bs}, is {where}."
        if args.device == "cpu"
        else f"target on an H200 (preset `lwm`, bf16): >= 2000 frames/s; the best here is {best_fps:.0f} frames/s at batch {best_bs}."
    )
    not_run = (
        "The GPU path (`--device cuda`: bf16 weights, channels_last convolutions) is implemented but was "
        "not run: this host has no GPU."
        if args.device == "cpu"
        else "Run on CUDA: bf16 weights, channels_last convolutions."
    )
    lines = [
        "### Part 1: encode throughput and where tokenization time goes",
        "",
        f"Preset `{args.preset}` ({cfg.resolution}x{cfg.resolution} -> {cfg.tokens_per_frame} codes, "
        f"{n_params / 1e6:.1f}M encoder+quantizer parameters of {n_all / 1e6:.1f}M, random weights), {args.device}, {dtype}, no grad. "
        f"Time: median of {args.rounds} alternating rounds of encoding the same {args.frames_per_round} frames "
        f"(uint8, already on the device), after a one-frame warm-up. {not_run}",
        "",
        *rows,
        "",
        f"Reference: {ref}",
        "",
    ]
    if args.e2e_seconds > 0:
        lines += end_to_end(model, args)
    return lines


def end_to_end(model, args) -> list[str]:
    cfg = model.config
    (video,), gen_s = cached_videos(args.cache, [args.e2e_seconds], cfg.resolution, cfg.resolution, args.e2e_fps)
    e2e_bs = max(args.batch_sizes)
    e = tokenize_video(model, args.device, video, args.sample_fps, e2e_bs)
    total = e["decode_s"] + e["encode_s"]
    print(f"  end to end: {e['frames']} frames, decode {e['decode_s']:.2f}s, encode {e['encode_s']:.2f}s", flush=True)
    return [
        f"End to end: a generated {cfg.resolution}x{cfg.resolution} {args.e2e_fps} fps H.264 video of "
        f"{args.e2e_seconds:g} s, sampled at {args.sample_fps:g} fps with `stream_video` (decord's index, PyAV "
        f"decoding) in chunks of {e2e_bs} "
        f"and encoded with batch size {e2e_bs}, as lwm-tokenize does. Decoding includes opening the file; encoding "
        f"includes moving the frames to the device.",
        "",
        "| sampled frames | decode (s) | encode (s) | decode share | encode share | decoding alone (frames/s) | end to end (frames/s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {e['frames']} | {e['decode_s']:.2f} | {e['encode_s']:.2f} | {100 * e['decode_s'] / total:.1f}% | "
        f"{100 * e['encode_s'] / total:.1f}% | {e['frames'] / e['decode_s']:.1f} | {e['frames'] / total:.2f} |",
    ]


def part_stream(args) -> list[str]:
    width, height = args.long_size
    lengths = sorted(args.minutes)
    paths, gen_s = cached_videos(args.cache, [60 * m for m in lengths], width, height, args.long_fps)
    if gen_s > 0.5:
        print(f"  generated in {gen_s:.0f}s", flush=True)
    runs: dict[float, list[dict]] = {m: [] for m in lengths}
    for rep in range(args.repeats):  # alternate lengths, so load from elsewhere hits both alike
        for m, path in zip(lengths, paths):
            r = stream_in_subprocess(path, args.sample_fps, args.resolution, args.chunk_size)
            runs[m].append(r)
            print(
                f"  stream {m:g} min (run {rep + 1}): {r['frames']} frames in {r['total_s']:.2f}s "
                f"({1000 * r['total_s'] / r['frames']:.2f} ms/frame), peak rise {r['peak_rise_mib']:.1f} MiB, "
                f"drift {r['drift_mib']:+.1f} MiB, read {r['read_x']:.1f}x the file",
                flush=True,
            )

    def summary(m):
        rs = runs[m]
        return dict(
            frames=rs[0]["frames"],
            total_s=min(r["total_s"] for r in rs),
            first_s=min(r["first_s"] for r in rs),
            peak=max(r["peak_rise_mib"] for r in rs),
            base=statistics.median(r["base_mib"] for r in rs),
            drift=max(r["drift_mib"] for r in rs),
            read_x=rs[0]["read_x"],
        )

    s = {m: summary(m) for m in lengths}
    b = s[lengths[0]]
    rows = [
        "| video | file size (MiB) | source frames | sampled frames | time to first chunk (s) | total time (s) | "
        "ms per sampled frame | per-frame time vs first | peak RSS rise (MiB) | peak vs first | RSS end - after first chunk (MiB) | "
        "bytes read / file size |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m, path in zip(lengths, paths):
        r = s[m]
        per = r["total_s"] / r["frames"]
        rows.append(
            f"| {m:g} min | {path.stat().st_size / 2**20:.1f} | {round(60 * m * args.long_fps)} | {r['frames']} | "
            f"{r['first_s']:.2f} | {r['total_s']:.2f} | {1000 * per:.2f} | {per / (b['total_s'] / b['frames']):.3f} | "
            f"{r['peak']:.1f} | {r['peak'] / b['peak']:.3f} | {r['drift']:+.1f} | {r['read_x']:.1f} |"
        )
    last = s[lengths[-1]]
    mem_ratio = last["peak"] / b["peak"]
    time_ratio = (last["total_s"] / last["frames"]) / (b["total_s"] / b["frames"])
    lo, hi = f"{lengths[0]:g}", f"{lengths[-1]:g}"
    return [
        f"### Part 2: streaming {hi} minutes at {args.sample_fps:g} fps",
        "",
        f"Generated {width}x{height} {args.long_fps} fps H.264 videos (libx264 {X264_OPTIONS['preset']}, "
        f"crf {X264_OPTIONS['crf']}, x264's default keyframe interval of 250 frames; the shorter is the first minutes "
        f"of the longer), cached in `{args.cache}`. "
        f"Each is streamed with `stream_video(fps={args.sample_fps:g}, resolution={args.resolution}, "
        f"chunk_size={args.chunk_size})`, no encoding, in a fresh subprocess with MALLOC_MMAP_THRESHOLD_=65536 "
        f"(freed buffers go back to the OS, so RSS follows live memory). Peak RSS rise: VmHWM minus the RSS after "
        f"imports (torch, numpy, decord, av, lwm.video.reader; about {b['base']:.0f} MiB). "
        f"{args.repeats} runs per video, alternating; the table shows the fastest time and the highest peak. "
        f"Bytes read (/proc/self/io rchar, opening included) over the file size: decord reads the file whole to index "
        f"it when `Video` opens it, and `stream_video` decodes it forward once with PyAV, so about 2 (a little more for "
        f"the smaller file: headers and buffers); more would mean parts of it are read again.",
        "",
        *rows,
        "",
        f"Targets, {lo} -> {hi} minutes:",
        f"- peak memory flat (within 10%): {_verdict(mem_ratio, 1.10, 'peak RSS rise')}.",
        f"- time linear in sampled frames (time per sampled frame within 1.1x): {_verdict(time_ratio, 1.10, 'time per frame')}.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=["encode", "stream"], default=["encode", "stream"])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--preset", default="lwm")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--frames-per-round", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--e2e-seconds", type=float, default=16.0, help="length of the end-to-end test video (0: skip it)"
    )
    parser.add_argument("--e2e-fps", type=int, default=24, help="frame rate of the end-to-end test video")
    parser.add_argument("--sample-fps", type=float, default=1.0, help="sampling rate for tokenizing and streaming")
    parser.add_argument(
        "--minutes", type=float, nargs="+", default=[10, 60], help="streamed video lengths; the first is the baseline"
    )
    parser.add_argument(
        "--long-size",
        type=lambda s: tuple(int(v) for v in s.split("x")),
        default=(320, 240),
        help="WIDTHxHEIGHT of the streamed videos",
    )
    parser.add_argument("--long-fps", type=int, default=5, help="frame rate of the streamed videos")
    parser.add_argument("--resolution", type=int, default=256, help="streamed frames are resized and cropped to this")
    parser.add_argument("--chunk-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="fresh-process streaming runs per video")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="folder for the generated videos (reused)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not update docs/benchmarks.md")
    parser.add_argument("--stream-child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.stream_child:
        print(json.dumps(stream_here(args.stream_child, args.sample_fps, args.resolution, args.chunk_size)))
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")

    start = time.perf_counter()
    load_start = os.getloadavg()[0]
    sections = []
    if "encode" in args.parts:
        sections += ["", *part_encode(args)]
    if "stream" in args.parts:
        sections += ["", *part_stream(args)]
    total = time.perf_counter() - start
    markdown = "\n".join(
        [
            f"Command: `{command_line()}`  ",
            f"Host: {host_line()}  ",
            f"Total run time: {total / 60:.1f} min (including generating any videos not yet cached); 1-minute load "
            f"average {load_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end on {os.cpu_count()} CPUs "
            f"(above the CPU count, other work shared the host and the times are inflated).",
            *sections,
        ]
    )
    print()
    print(markdown)
    if args.no_write:
        return
    if args.device != "cpu":  # a GPU run has its own section, whichever parts ran
        write_section(f"vqgan-{args.device}", markdown)
        return
    if set(args.parts) != {"encode", "stream"}:
        print("\nnot writing docs/benchmarks.md: the section holds both parts, and only", " ".join(args.parts), "ran")
        return
    write_section("vqgan", markdown)


if __name__ == "__main__":
    main()
