"""Text to video, scored: a video generated for each caption ("a red circle moving left", lwm.synth.make_t2v's
heldout.jsonl), decoded by the VQGAN and read by lwm.eval.scene_check for its color, shape and motion.

    python -m lwm.eval.t2v --model runs/t2v_demo/hf --prompts data/t2v/heldout.jsonl --out runs/t2v_demo/t2v

Each prompt is [BOS] caption <vision>, as a "[caption],vision" example trains; its frames are drawn by
lwm.infer.vision (--frames of 256 codes, --cfg-scale, --temperature, --top-k; --samples videos a prompt, seeds
--seed on). Two references are read the same way for the same prompts: the prompt's real clip (rendered by
lwm.synth.make_t2v, encoded and decoded by the VQGAN: what a perfect model would draw) and random codes
(decoded: what a model that learned nothing draws). With the real clips' codes it measures how far the VQGAN's
codes move with the shape (the share of a frame's codes equal to the frame before's moved one cell).

Writes OUT/t2v.json (config; one record per video: caption, truth, reading, right per attribute; the
references' records; the rates), OUT/videos/<n>.gif with its codes beside it (<n>.codes.npy), and
OUT/t2v_frames.png: a row per prompt, the generated frames then the real clip's. A video that fails is recorded
with its error and the run goes on; a stopped run keeps what it did (t2v.json rewritten at most every 30 s).
Exit status: 0, 1 if some video failed, 2 for bad input. Only rank 0 writes and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from lwm.arg_types import add_options, option
from lwm.eval.scene_check import Reading, read_video
from lwm.eval.trials import Autosave, check_out_dir, checked_main, finish, run_trials
from lwm.infer.runtime import ModelOptions, load_generator, start
from lwm.infer.vision import VisionConfig, decode_frames, generate_vision, vision_prompts, write_vision
from lwm.interop.vqgan_sources import load_vqgan
from lwm.paths import TINY_VQGAN
from lwm.ranks import is_rank0
from lwm.synth import make_t2v
from lwm.synth.scene import DIRECTIONS, render

ATTRIBUTES = ("color", "shape", "motion")
FIELDS = ("caption", *ATTRIBUTES)


@dataclass(kw_only=True)
class T2VConfig:
    """python -m lwm.eval.t2v: the model, the prompts, how frames are drawn and where the results go."""

    model: ModelOptions
    prompts: str = option("JSON lines with caption, color, shape and motion (make_t2v's heldout.jsonl)")
    vqgan: str | None = option("the VQGAN that decodes (default: the model folder's, else the bundled tiny one)", None)
    frames: int = option("frames a video", 4)
    samples: int = option("videos a prompt (seeds --seed, --seed + 1, ...)", 1)
    cfg_scale: float = option("classifier-free guidance; 1: the caption's logits alone", 1.0)
    temperature: float = option("0: greedy (the start of the shape is a draw: greedy may draw background only)", 1.0)
    top_k: int | None = option("draw among the k likeliest codes (8192: all of a VQGAN's)", 10, type=int)
    seed: int = option("seeds the first video of each prompt and the references", 0)
    out: str = option("results folder", "results/t2v")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Videos generated from captions, read for their color, shape and motion",
        epilog="Exit status: 0, 1 if some video failed (recorded in t2v.json), 2 for bad input.",
    )
    return add_options(p, T2VConfig)


def read_prompts(path: Path) -> list[dict]:
    """The prompts file's records, each with FIELDS; a ValueError naming the file and line otherwise."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"--prompts {path} line {i} is not JSON: {e}") from None
        missing = [f for f in FIELDS if not isinstance(row, dict) or not isinstance(row.get(f), str)]
        if missing:
            raise ValueError(f"--prompts {path} line {i} lacks {', '.join(missing)} (text), as make_t2v writes")
        cells = row.get("cells", make_t2v.CELLS)
        if not isinstance(cells, int) or isinstance(cells, bool) or cells < 1:
            raise ValueError(f"--prompts {path} line {i}: cells must be a whole number >= 1, got {cells!r}")
        rows.append({**{f: row[f] for f in FIELDS}, "cells": cells})
    if not rows:
        raise ValueError(f"--prompts {path} holds no prompts")
    return rows


def check(config: T2VConfig) -> list[dict]:
    """Every check that needs no weights, before they load -> the prompts; raises FileNotFoundError or
    ValueError naming the option."""
    paths = {"--model": config.model.model, "--tokenizer": config.model.tokenizer, "--vqgan": config.vqgan}
    for flag, value in (*paths.items(), ("--prompts", config.prompts)):
        if value is not None and not Path(value).exists():
            raise FileNotFoundError(f"{flag} {value} does not exist")
    for flag, value in (("--frames", config.frames), ("--samples", config.samples)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    vision_config(config, 0)  # the scale, temperature and top-k, as generation checks them
    check_out_dir(Path(config.out))
    return read_prompts(Path(config.prompts))


def vision_config(config: T2VConfig, sample: int) -> VisionConfig:
    return VisionConfig(
        frames=config.frames,
        cfg_scale=config.cfg_scale,
        temperature=config.temperature,
        top_k=config.top_k,
        seed=config.seed + sample,
    )


def scored(reading: Reading | None, prompt: dict) -> dict:
    """What was read against the prompt: right per attribute and on all three."""
    right = reading.matches(*(prompt[a] for a in ATTRIBUTES)) if reading else dict.fromkeys(ATTRIBUTES, False)
    seen = None if reading is None else {a: getattr(reading, a) for a in ATTRIBUTES}
    return {"reading": seen, "right": right, "all": all(right.values())}


def references(prompts: list[dict], vqgan, frames: int, seed: int) -> tuple[list[dict], list[np.ndarray]]:
    """The real clips (rendered, through the VQGAN) and random codes, read for each prompt -> (records, the
    real clips' decoded frames)."""
    rng, g = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    records, real_frames = [], []
    for p in prompts:
        clip = render(make_t2v.scene("real", *(p[a] for a in ATTRIBUTES), rng, p["cells"]))[:frames]  # (T, 64, 64, 3)
        with torch.no_grad():
            codes = vqgan.encode(torch.from_numpy(clip))  # (T, 64, 64, 3) -> (T, 256)
        real = decode_frames(vqgan, codes)
        noise = decode_frames(vqgan, torch.randint(0, vqgan.config.n_codes, (frames, 256), generator=g))
        real_frames.append(real)
        kept = shift_kept(codes.cpu().numpy(), p["motion"], p["cells"])
        records.append(
            {
                "caption": p["caption"],
                "real": {**scored(read_video(real), p), "codes_kept_by_the_move": kept},
                "random": scored(read_video(noise), p),
            }
        )
    return records, real_frames


def shift_kept(codes: np.ndarray, motion: str, cells: int = 1) -> float | None:
    """codes (T, 256) of a clip whose shape moves `cells` code cells a frame -> the fraction of the later
    frames' codes equal to the frame before's moved that way: 1 when codes say what a patch shows wherever it
    is, so that a model can carry a frame's codes along; None for one frame."""
    if len(codes) < 2:
        return None
    side = round(len(codes[0]) ** 0.5)
    grid = np.asarray(codes).reshape(len(codes), side, side)  # (T, 256) -> (T, 16, 16)
    dx, dy = DIRECTIONS[motion]
    # the background that wraps in is the background's code
    moved = np.roll(grid[:-1], (dy * cells, dx * cells), axis=(1, 2))
    return float((moved == grid[1:]).mean())


def rates(records: list[dict]) -> dict:
    """Fraction right per attribute and on all three, over the records without an error."""
    done = [r for r in records if r.get("error") is None]
    if not done:
        return {k: None for k in (*ATTRIBUTES, "all")}
    out = {a: float(np.mean([r["right"][a] for r in done])) for a in ATTRIBUTES}
    return {**out, "all": float(np.mean([r["all"] for r in done]))}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def frames_sheet(rows: list[tuple[str, np.ndarray, np.ndarray]], path: Path) -> Path:
    """A PNG with a row per prompt: its generated frames, a gap, the real clip's frames; the caption above."""
    from PIL import Image, ImageDraw

    size, gap, label = 64, 12, 14
    n = max(len(g) + len(r) for _, g, r in rows)
    sheet = Image.new("RGB", (n * size + gap, len(rows) * (size + label)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for i, (caption, generated, real) in enumerate(rows):
        y = i * (size + label)
        draw.text((2, y), caption, fill=(0, 0, 0))
        for j, frame in enumerate(generated):
            sheet.paste(Image.fromarray(frame), (j * size, y + label))
        for j, frame in enumerate(real):
            sheet.paste(Image.fromarray(frame), ((len(generated) + j) * size + gap, y + label))
    sheet.save(path)
    return path


def _so_far(run_info: dict, records: list[dict]) -> dict:
    return {"config": {**run_info, "complete": False}, "trials": records}


def _trial_name(r: dict) -> str:
    return f"{r['caption']!r} sample {r['sample']}"


def _report(results: dict, out: Path, sheet_rows: list) -> list[str]:
    (out / "t2v.json").write_text(json.dumps(results, indent=1))
    written = [out / "t2v.json"]
    if sheet_rows:
        written.append(frames_sheet(sheet_rows, out / "t2v_frames.png"))
    lines = ["| | color | shape | motion | all three |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, r in results["rates"].items():
        cells = ["n/a" if r[k] is None else f"{100 * r[k]:.0f}%" for k in (*ATTRIBUTES, "all")]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    kept = results["real_codes_kept_by_the_move"]
    if kept is not None:
        lines.append(f"the real clips' codes kept by the shape's move: {100 * kept:.1f}%")
    n = len(results["trials"])
    lines.append(f"{n} videos ({results['trials_failed']} failed); wrote {', '.join(str(p) for p in written)}")
    return lines


def run(config: T2VConfig) -> int:
    """The command: checks (raising for bad input), the model and VQGAN, a video per prompt and sample; rank 0
    saves as it goes, writes and prints -> exit status (0, 1 if some video failed, 2 if loading failed)."""
    prompts = check(config)
    runtime = start(config.model.device)
    try:
        loaded, gen = load_generator(config.model, runtime)
        vqgan = load_vqgan(config.vqgan or loaded.vqgan or TINY_VQGAN, preset="tiny").to(runtime.device).eval()
    except (FileNotFoundError, ValueError) as e:
        print(f"t2v: {e}", file=sys.stderr)
        return 2
    out = Path(config.out)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    run_info = {
        "model": str(config.model.model),
        "vqgan": str(config.vqgan or loaded.vqgan or TINY_VQGAN),
        "prompts": str(config.prompts),
        **{k: getattr(config, k) for k in ("frames", "samples", "cfg_scale", "temperature", "top_k", "seed")},
        "device": runtime.device,
        "world_size": runtime.world,
    }
    generated: dict[int, np.ndarray] = {}

    def trial(i: int, sample: int) -> dict:
        p = prompts[i]
        record = {"caption": p["caption"], "sample": sample, "truth": {a: p[a] for a in ATTRIBUTES}, "error": None}
        try:
            cond, uncond = vision_prompts(loaded.tokenizer, loaded.vocab, p["caption"], video=True, raw=True)
            codes = generate_vision(gen, cond, vision_config(config, sample), None if config.cfg_scale == 1 else uncond)
            if is_rank0():
                frames = decode_frames(vqgan, codes)  # (T, 256) -> (T, H, W, 3)
                video, _ = write_vision(codes, frames, out / "videos" / f"{i:03d}_{sample}.gif", fps=make_t2v.FPS)
                generated.setdefault(i, frames)
                record.update(scored(read_video(frames), p), video=str(video.relative_to(out)))
        except (RuntimeError, ValueError) as e:  # out of memory, say: recorded, the run goes on
            record["error"] = f"{type(e).__name__}: {e}"
        return record

    grid = [(i, s) for i in range(len(prompts)) for s in range(config.samples)]
    records = run_trials(
        grid,
        trial,
        lambda r: float(r.get("all", False)),
        desc="t2v",
        progress=is_rank0(),
        on_trial=Autosave(out / "t2v.json", partial(_so_far, run_info)),
    )
    refs, real = references(prompts, vqgan, config.frames, config.seed) if is_rank0() else ([], [])
    results = {
        "config": {**run_info, "complete": True},
        "trials": records,
        "trials_failed": sum(r["error"] is not None for r in records),
        "references": refs,
        "rates": {
            "generated": rates(records),
            "real clips (VQGAN)": rates([r["real"] for r in refs]),
            "random codes": rates([r["random"] for r in refs]),
        },
        "real_codes_kept_by_the_move": _mean(r["real"]["codes_kept_by_the_move"] for r in refs),
    }
    sheet = [(prompts[i]["caption"], generated[i], real[i]) for i in sorted(generated)]
    return finish(runtime, results, lambda: _report(results, out, sheet), _trial_name)


def main(argv: list[str] | None = None) -> int:
    return checked_main(argv, build_parser(), T2VConfig, check, run)


if __name__ == "__main__":
    sys.exit(main())
