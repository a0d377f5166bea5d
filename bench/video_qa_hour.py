"""Hour-long video QA end to end: one generated video of 10 and of 60 minutes, at 1 frame per second (600
and 3,600 frames; 154K and 925K prompt tokens), answered by `python -m lwm.eval.video_qa`'s run() with a
random-weight debug model and the bundled tiny VQGAN. Each length runs in a fresh subprocess that times
the stages and takes the peak RSS of each:

  decode   the video read: opened and indexed, decoded forward in chunks, frames resized (lwm.video.reader)
  encode   the tiny VQGAN on each chunk of frames (decode is the video's whole load less this)
  prefill  the prompt into the KV cache (the Generator's chunked prefill)
  answer   the generated letter, token by token after the prefill

Peak RSS per stage: VmHWM reset (/proc/self/clear_refs) at the stage's start and read at its end, less the
RSS at its start (the rise the stage causes). Reading and encoding hold one chunk of frames at a time, so
their peak should not grow with the video (target: 60 min within 1.10x of 10 min); the prefill's holds
the KV cache, which grows with the prompt by design (its size is printed beside it). A third run answers
the 10-minute video from the codes lwm-tokenize wrote for it (--codes): no decode or encode.

    python -m bench.video_qa_hour                 # about 70 min on 2 quiet CPU cores; writes docs/benchmarks.md
    python -m bench.video_qa_hour --no-write --minutes 1 2
    python -m bench.video_qa_hour --minutes 60 --no-cache-run     # one length again; the other rows are kept
    python -m bench.video_qa_hour --report-only   # the section from the rows so far (a stopped run: its progress)
    python -m bench.video_qa_hour --cp 1 2 --minutes 10 60    # per-rank memory of the prefill over 1 and 2 ranks

Rows are kept in the cache folder (rows.json), each with the command that measured it, so that the
section holds every length measured, and a run stopped before its end shows how far it got.

One file for one command (longer than most here for that reason): the measured child, the parent that
starts it (one process, or cp ranks under torchrun) and the two sections made from the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.report import command_line, host_line, publish, reset_peak_rss, status_kib
from bench.vqgan import cached_videos
from lwm.paths import REPO

DEFAULT_CACHE = Path(tempfile.gettempdir()) / "lwm-bench-video-qa"
SPM = REPO / "data" / "sample" / "tokenizer.model"
VQGAN = REPO / "data" / "checkpoints" / "vqgan_tiny.safetensors"
WIDTH, HEIGHT, SOURCE_FPS = 160, 120, 5


# ------------------------------------------------------------------------------------ the child: one run, measured


class Stages:
    """Time and peak RSS rise per stage; a stage may be entered many times (time adds up, the peak is the max)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.peak_mib: dict[str, float] = {}

    def reset_peak(self) -> int:
        return reset_peak_rss()

    def add(self, name: str, seconds: float, base_kib: int | None = None) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        if base_kib is not None:
            rise = (status_kib("VmHWM") - base_kib) / 1024
            self.peak_mib[name] = max(self.peak_mib.get(name, 0.0), rise)


def child(args) -> None:
    """Run video QA on one item with the stages instrumented; print one JSON line of measurements."""
    import lwm.eval.video_qa.videos as videos
    from lwm.eval.video_qa.cli import VideoQAConfig, run
    from lwm.infer.cache import KVCache
    from lwm.infer.generator import Generator
    from lwm.infer.runtime import ModelOptions
    from lwm.vision.vqgan import VQGAN as VQGANModule

    stages = Stages()
    encode, load = VQGANModule.encode, videos.VideoSource.load

    def timed_encode(self, *a, **kw):
        t = time.perf_counter()
        out = encode(self, *a, **kw)
        stages.add("encode", time.perf_counter() - t)
        return out

    rank = int(os.environ.get("RANK", "0"))  # under torchrun (--cp): each rank measures itself

    def progress(**kw) -> None:  # what is done so far, for a run stopped before its end (--report-only reads it)
        if args.progress and rank == 0:
            with open(args.progress, "a") as f:
                f.write(json.dumps({**kw, "rss_mib": status_kib("VmRSS") / 1024}) + "\n")

    def measured_load(self, item):
        base = stages.reset_peak()
        t = time.perf_counter()
        out = load(self, item)
        stages.add("video", time.perf_counter() - t, base)  # decode + encode (+ the VQGAN's first load)
        progress(stage="video", frames=len(out[0]), seconds=dict(stages.seconds), peak_rise_mib=dict(stages.peak_mib))
        return out

    fill, generate, extend = Generator._fill, Generator.generate, Generator._extend
    start_segment = KVCache.start_prefill

    def logged_extend(self, ids, all_logits=False):
        out = extend(self, ids, all_logits)
        if stages.filling is not None:
            stages.filled += int(ids.numel())
            progress(
                stage="prefill", tokens=stages.filled, of=stages.filling, seconds=time.perf_counter() - stages.fill_t
            )
        return out

    def logged_segment(self, n_new):  # a ring prefill's next segment (cp > 1): what is done before it starts
        if stages.filling is not None:
            progress(
                stage="prefill", tokens=stages.filled, of=stages.filling, seconds=time.perf_counter() - stages.fill_t
            )
            stages.filled += n_new
        return start_segment(self, n_new)

    def timed_fill(self, prompt):
        t = time.perf_counter()
        stages.filling, stages.filled, stages.fill_t = int(prompt.numel()), 0, t
        out = fill(self, prompt)
        stages.filling = None
        stages.add("prefill", time.perf_counter() - t, stages.prefill_base)
        stages.prompt_tokens = int(prompt.numel())
        return out

    def timed_generate(self, prompt, config=None):
        stages.prefill_base = stages.reset_peak()
        t = time.perf_counter()
        out = generate(self, prompt, config)
        total = time.perf_counter() - t
        stages.add("answer", total - stages.seconds.get("prefill", 0.0), stages.prefill_base)
        return out

    VQGANModule.encode, videos.VideoSource.load = timed_encode, measured_load
    Generator._fill, Generator.generate, Generator._extend = timed_fill, timed_generate, logged_extend
    KVCache.start_prefill = logged_segment
    stages.filling = None

    config = VideoQAConfig(
        load=ModelOptions(model=args.model, prefill_chunk=args.prefill_chunk),
        data=args.data,
        codes=args.codes,
        vqgan=str(VQGAN),
        fps=1.0,
        methods=["letter"],
        letter_tokens=4,
        out=args.out,
        progress=False,
    )
    started_rss = status_kib("VmRSS") / 1024
    t = time.perf_counter()
    status = run(config)
    total = time.perf_counter() - t
    if "video" in stages.seconds:  # opening and indexing the file, decoding forward, resizing: all but the encoder
        stages.seconds["decode"] = stages.seconds["video"] - stages.seconds.get("encode", 0.0)
    result = json.loads((Path(args.out) / "video_qa.json").read_text())
    rec = result["records"][0]
    print(
        "RESULT "
        + json.dumps(
            {
                "rank": rank,
                "status": status,
                "error": rec["error"],
                "frames": rec.get("frames"),
                "prompt_tokens": getattr(stages, "prompt_tokens", None),
                "codes_from": rec.get("codes_from"),
                "seconds": stages.seconds,
                "peak_rise_mib": stages.peak_mib,
                "total_seconds": total,
                "rss_before_mib": started_rss,
                "peak_rss_mib": status_kib("VmHWM") / 1024,
            }
        ),
        flush=True,
    )


# ------------------------------------------------------------------------------------ the parent


def prepare(cache: Path, minutes: list[float]) -> tuple[Path, list[Path], float]:
    """The debug model as a Hugging Face folder (random weights) and the videos, made once into the cache."""
    from lwm.data.text_tokenizer import TextTokenizer
    from lwm.data.vocab import Vocab
    from lwm.interop.hf import to_hf
    from lwm.model import ModelConfig, Transformer

    hf = cache / "debug_hf"
    if not (hf / "config.json").exists():
        torch.manual_seed(0)
        vocab = Vocab(TextTokenizer(SPM).vocab_size)
        to_hf(Transformer(ModelConfig.from_preset("debug", vocab_size=vocab.size)), hf, tokenizer_model=SPM)
    paths, gen_s = cached_videos(cache, [m * 60 for m in minutes], WIDTH, HEIGHT, SOURCE_FPS)
    return hf, paths, gen_s


def question(video: Path, seconds: float, path: Path) -> Path:
    row = {"id": video.stem, "video": str(video), "question": "What color is the moving square?",
           "options": ["Red.", "White.", "Green.", "Blue."], "answer": "White.", "duration": seconds}  # fmt: skip
    path.write_text(json.dumps(row) + "\n")
    return path


def run_child(hf: Path, data: Path, out: Path, prefill_chunk: int, codes: Path | None = None, cp: int = 1) -> dict:
    """One measured run -> rank 0's measurements, with every rank's under "ranks" (cp > 1: under torchrun)."""
    launch = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cp}"]
        if cp > 1
        else [sys.executable]
    )
    cmd = [
        *launch,
        "-m",
        "bench.video_qa_hour",
        "--child",
        "--model",
        str(hf),
        "--data",
        str(data),
        "--out",
        str(out),
        "--prefill-chunk",
        str(prefill_chunk),
        "--progress",
        str(Path(out).with_suffix(".progress.jsonl")),
    ]
    cmd += ["--codes", str(codes)] if codes else []  # fmt: skip
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # freed buffers go back to the OS: RSS follows live memory
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    ranks = sorted(
        (json.loads(x[len("RESULT ") :]) for x in proc.stdout.splitlines() if x.startswith("RESULT ")),
        key=lambda r: r["rank"],
    )
    if proc.returncode != 0 or len(ranks) != cp:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return {**ranks[0], "cp": cp, "ranks": ranks}


def tokenize(video: Path, out: Path) -> float:
    """lwm-tokenize's run on the video at 1 fps with the tiny VQGAN -> seconds."""
    from lwm.video.tokenize import TokenizeConfig
    from lwm.video.tokenize import run as tokenize_run

    t = time.perf_counter()
    status = tokenize_run(
        TokenizeConfig(inputs=[str(video)], out=out, fps=1.0, vqgan="tiny", checkpoint=VQGAN, device="cpu", ids="stem")
    )
    if status != 0:
        raise RuntimeError(f"lwm-tokenize on {video} exited {status}")
    return time.perf_counter() - t


def kv_cache_mib(tokens: int) -> float:
    from lwm.model import ModelConfig

    c = ModelConfig.from_preset("debug")
    return tokens * c.n_layers * 2 * c.n_kv_heads * c.head_dim * 4 / 2**20  # k and v, fp32


def finished(row: dict) -> dict:
    """A row as measured; for a run stopped before its end (`pending`), what its progress file says it did."""
    if not row.get("pending"):
        return row
    progress = (
        [json.loads(x) for x in Path(row["progress"]).read_text().splitlines()]
        if Path(row["progress"]).exists()
        else []
    )
    video = next((x for x in progress if x["stage"] == "video"), None)
    fills = [x for x in progress if x["stage"] == "prefill"]
    out = {**row, "frames": None, "prompt_tokens": None, "seconds": {}, "peak_rise_mib": {}, "total_seconds": None,
           "peak_rss_mib": max((x["rss_mib"] for x in progress), default=None), "codes_from": "video"}  # fmt: skip
    if video:
        out.update(frames=video["frames"], peak_rise_mib=video["peak_rise_mib"], seconds=dict(video["seconds"]))
        out["seconds"]["decode"] = out["seconds"]["video"] - out["seconds"].get("encode", 0.0)
    if fills:
        last = fills[-1]
        out["prompt_tokens"], out["prefill_done"] = last["of"], (last["tokens"], last["seconds"])
    return out


def report(rows: list[dict], args, loads: tuple) -> tuple[str, str]:
    """The section of the runs at cp 1 from the video and the codes, and the section of the cp runs."""

    def f(x, spec=".1f"):
        return "—" if x is None else format(x, spec)

    rows = [finished(r) for r in rows]
    is_cp = lambda r: r.get("cp_run") or ", cp " in r["name"]  # noqa: E731 (a pending cp row is named so)
    cp_rows = [r for r in rows if is_cp(r)]
    rows = [r for r in rows if not is_cp(r)]
    commands = list(dict.fromkeys(r["command"] for r in rows))
    shared = max(loads) > (os.cpu_count() or 1)
    lines = [
        "Commands: " + "; ".join(f"`{c}`" for c in commands) + "  ",
        f"Host: {host_line()}  ",
        f"1-minute load average {loads[0]:.1f} at the start of the last command and {loads[1]:.1f} now on "
        f"{os.cpu_count()} CPUs"
        + (
            " (above the CPU count: the 2 cores were shared with other work, and the times are inflated)."
            if shared
            else "."
        ),
        "",
        f"One multiple-choice question per generated {WIDTH}x{HEIGHT} {SOURCE_FPS} fps H.264 video (the scene of "
        "bench/vqgan.py; the 10-minute video is the first 10 minutes of the hour), answered by "
        "`lwm.eval.video_qa`'s run(): frames at 1 fps read forward in chunks, encoded by the bundled tiny VQGAN "
        "(64x64 -> 256 codes), LWM's chat prompt, prefilled by the random-weight `debug` model (2 layers, dim 64, "
        f"fp32) in chunks of {args.prefill_chunk} tokens on one process, then the letter generated (4 tokens at most; "
        "the letter method only). Each run in a fresh process with MALLOC_MMAP_THRESHOLD_=65536. Peak rise: the "
        "stage's peak RSS (VmHWM, reset at its start) less its RSS at its start. Decode: the video's whole load "
        "(opening and indexing the file, decoding forward, resizing) less the encoder's time.",
        "",
        "| run | frames | prompt tokens | decode (s) | encode (s) | prefill (s) | answer (s) | end to end (s) "
        "| decode+encode peak rise (MiB) | prefill+answer peak rise (MiB) | KV cache (MiB) | process peak RSS (MiB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        s, p = r["seconds"], r["peak_rise_mib"]
        prefill = f(s.get("prefill"))
        if r.get("prefill_done"):
            done, secs = r["prefill_done"]
            prefill = f"unfinished: {done:,} tokens in {secs:.0f}"
        tokens = r["prompt_tokens"]
        lines.append(
            f"| {r['name']} | {f(r['frames'], 'd')} | {f(tokens, ',')} | {f(s.get('decode'), '.2f')} | "
            f"{f(s.get('encode'), '.2f')} | {prefill} | {f(s.get('answer'), '.2f')} | "
            f"{f(r['total_seconds'])} | {f(p.get('video'))} | {f(p.get('answer'))} | "
            f"{f(None if tokens is None else kv_cache_mib(tokens))} | {f(r['peak_rss_mib'], '.0f')} |"
        )
    video_rows = [r for r in rows if r.get("codes_from") == "video" and r["peak_rise_mib"].get("video")]
    if len(video_rows) >= 2:
        a, b = video_rows[0], video_rows[-1]
        ratio = b["peak_rise_mib"]["video"] / max(a["peak_rise_mib"]["video"], 1e-9)
        per_frame = (b["seconds"]["decode"] + b["seconds"]["encode"]) / b["frames"]
        per_frame_a = (a["seconds"]["decode"] + a["seconds"]["encode"]) / a["frames"]
        lines += [
            "",
            f"Targets, {a['name']} -> {b['name']}:",
            f"- reading and encoding in bounded memory (peak rise flat within 10%): "
            f"**{'met' if ratio <= 1.10 else 'not met'}**: {ratio:.3f}x.",
            f"- decode + encode time per frame: {per_frame_a * 1000:.1f} ms -> {per_frame * 1000:.1f} ms "
            f"({per_frame / per_frame_a:.3f}x).",
        ]
        if b["seconds"].get("prefill"):
            lines.append(
                f"- prefill + answer peak rise {a['peak_rise_mib']['answer']:.0f} -> "
                f"{b['peak_rise_mib']['answer']:.0f} MiB: the KV cache, which holds every prompt token by design (its "
                f"size in the table), and the prompt; prefill time {a['seconds']['prefill']:.0f} -> "
                f"{b['seconds']['prefill']:.0f} s ({b['seconds']['prefill'] / a['seconds']['prefill']:.1f}x for "
                f"{b['prompt_tokens'] / a['prompt_tokens']:.1f}x the tokens: attention is quadratic in the prompt)."
            )
        elif b.get("prefill_done"):
            done, secs = b["prefill_done"]
            lines.append(
                f"- {b['name']}: the prefill had not finished when this section was written (stopped, or still "
                f"running): {done:,} of {b['prompt_tokens']:,} tokens in {secs:.0f} s, the process's RSS "
                f"{b['peak_rss_mib']:.0f} MiB at most so far; not answered yet."
            )
    cached = [r for r in rows if r.get("codes_from") == "cache"]
    if cached:
        r = cached[0]
        lines.append(
            f"- from lwm-tokenize's cache (`--codes`, tokenized in {r['tokenize_seconds']:.1f} s): no decode or "
            f"encode in the run, the same {r['prompt_tokens']:,} prompt tokens, end to end {r['total_seconds']:.1f} s."
        )
    return "\n".join(lines) if rows else "", "\n".join(cp_table(cp_rows, loads))


SHARED = " (above the CPU count: other work shared the cores, and the times are inflated; the memory is not)."


def cp_table(rows: list[dict], loads: tuple) -> list[str]:
    """Per-rank memory of the prefill over cp ranks (torchrun, gloo), against cp 1 of the same length."""
    if not rows:
        return []
    commands = list(dict.fromkeys(r["command"] for r in rows))
    lines = [
        "Commands: " + "; ".join(f"`{c}`" for c in commands) + "  ",
        f"Host: {host_line()}  ",
        f"1-minute load average {loads[0]:.1f} at the start of the last command and {loads[1]:.1f} now on "
        f"{os.cpu_count()} CPUs" + (SHARED if max(loads) > (os.cpu_count() or 1) else "."),
        "",
        "The question above answered from lwm-tokenize's codes (no decode or encode), the "
        "prompt prefilled over cp ranks (`torchrun`, gloo; ring attention, the striped layout; each rank one "
        "thread, cp 1 two) in chunks of the same size per rank. Per rank: the largest over the ranks.",
        "",
        "| video | cp | prompt tokens | prefill (s) | prefill+answer peak rise per rank (MiB) | of cp 1 | KV cache "
        "per rank (MiB) | process peak RSS per rank (MiB) | of cp 1 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    one = {r["minutes"]: r for r in rows if r.get("cp") == 1 and not r.get("pending")}
    for r in sorted(rows, key=lambda r: (r["minutes"], r.get("cp", 0))):
        if r.get("pending") or "ranks" not in r:  # stopped or still running: what rank 0's progress says
            cp = int(r["name"].split("cp ")[-1])
            done = r.get("prefill_done")
            fill = f"unfinished: {done[0]:,} tokens in {done[1]:.0f}" if done else "not finished"
            tokens = r.get("prompt_tokens")
            kv = f"{kv_cache_mib(tokens) / cp:.1f}" if tokens else ""
            rss = r.get("peak_rss_mib")
            rss = f"rank 0 so far: {rss:.0f}" if rss else ""
            lines.append(
                f"| {r['minutes']:g} min | {cp} | {f'{tokens:,}' if tokens else ''} | {fill} | | | {kv} | {rss} | |"
            )
            continue
        rise = max(x["peak_rise_mib"].get("answer", 0.0) for x in r["ranks"])
        peak = max(x["peak_rss_mib"] for x in r["ranks"])
        base = one.get(r["minutes"])
        base_rise = base and max(x["peak_rise_mib"].get("answer", 0.0) for x in base["ranks"])
        base_peak = base and max(x["peak_rss_mib"] for x in base["ranks"])
        when = " (an earlier run)" if r.get("restored") else ""  # a row kept from an earlier report
        lines.append(
            f"| {r['minutes']:g} min{when} | {r['cp']} | {r['prompt_tokens']:,} | {r['seconds'].get('prefill', 0):.1f} | "
            f"{rise:.1f} | {f'{rise / base_rise:.2f}x' if base else ''} | {kv_cache_mib(r['prompt_tokens']) / r['cp']:.1f} | "
            f"{peak:.0f} | {f'{peak / base_peak:.2f}x' if base else ''} |"
        )
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, nargs="+", default=[10, 60])
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="videos, the model, and the rows measured so far")
    p.add_argument("--prefill-chunk", type=int, default=8192)
    p.add_argument("--no-cache-run", action="store_true", help="skip the run from lwm-tokenize's codes")
    p.add_argument(
        "--cp", type=int, nargs="+", help="instead: each length from its codes on this many ranks (torchrun, gloo)"
    )
    p.add_argument("--report-only", action="store_true", help="write the section from the rows measured so far")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--codes", help=argparse.SUPPRESS)
    p.add_argument("--progress", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    load0 = os.getloadavg()[0]
    args.cache.mkdir(parents=True, exist_ok=True)
    saved_file = args.cache / "rows.json"  # rows by run name; a later command replaces its own rows only
    saved = json.loads(saved_file.read_text()) if saved_file.exists() else {}

    def write() -> None:
        rows = sorted(saved.values(), key=lambda r: (r.get("minutes", 0), "codes" in r["name"]))
        md, cp_md = report(rows, args, (load0, os.getloadavg()[0]))
        if md:
            publish("video-qa-hour", "## Hour-long video QA end to end (CPU)\n\n" + md, write=not args.no_write)
        if cp_md:
            title = "### Hour-long video QA over context-parallel ranks (CPU)\n\n"
            publish("video-qa-hour-cp", title + cp_md, write=not args.no_write)

    if args.report_only:
        return write()
    hf, videos, gen_s = prepare(args.cache, args.minutes)
    print(f"videos ready ({gen_s:.0f} s generating)", flush=True)
    work = Path(tempfile.mkdtemp(prefix="video-qa-hour-"))

    def measure(
        name: str, minutes: float, out: Path, fn
    ) -> None:  # saved before it starts: a stopped run shows its progress
        saved[name] = {"name": name, "minutes": minutes, "command": command_line(), "pending": True,
                       "progress": str(out.with_suffix(".progress.jsonl"))}  # fmt: skip
        saved_file.write_text(json.dumps(saved, indent=1))
        row = {"name": name, "minutes": minutes, "command": command_line(), **fn()}
        saved[name] = row
        saved_file.write_text(json.dumps(saved, indent=1))
        print(f"{name}: {json.dumps(row)}", flush=True)
        write()

    if args.cp:
        for minutes, video in zip(args.minutes, videos):
            codes = args.cache / f"codes_{minutes:g}min"
            if not (codes / "done").exists():  # tokenized once: these runs measure the prefill over the ranks
                tokenize(video, codes)
                (codes / "done").write_text("")
            data = question(video, minutes * 60, work / f"cp_{minutes:g}.jsonl")
            for cp in args.cp:
                out = work / f"out_{minutes:g}_cp{cp}"
                run = lambda cp=cp, data=data, out=out, codes=codes: {  # noqa: E731
                    "cp_run": True,
                    **run_child(hf, data, out, args.prefill_chunk, codes, cp),
                }
                measure(f"{minutes:g} min, cp {cp}", minutes, out, run)
        return
    for k, (minutes, video) in enumerate(zip(args.minutes, videos)):
        data = question(video, minutes * 60, work / f"{minutes:g}.jsonl")
        out = work / f"out_{minutes:g}"
        measure(f"{minutes:g} min", minutes, out, lambda: run_child(hf, data, out, args.prefill_chunk))
        if k == 0 and not args.no_cache_run:  # the shortest again, from lwm-tokenize's codes

            def cached(video=video, minutes=minutes):
                codes = work / "codes"
                tok_s = tokenize(video, codes)
                data = question(video, minutes * 60, work / "cached.jsonl")
                return {
                    "tokenize_seconds": tok_s,
                    **run_child(hf, data, work / "out_cached", args.prefill_chunk, codes),
                }

            measure(f"{minutes:g} min, from --codes", minutes, work / "out_cached", cached)


if __name__ == "__main__":
    main()
