"""Visual needle in a video haystack (LongVA's V-NIAH idea): can the model find one frame anywhere in
a video? A grid of video lengths (frames) x needle depths, several trials per cell.

    python -m lwm.eval.vniah --model runs/vniah/f24 --frames 2 6 12 24 --depths 0 25 50 75 100 --trials 6 --out results/vniah
    torchrun --nproc_per_node 2 -m lwm.eval.vniah --model ...        # prompt and KV cache split over 2 ranks

Each trial is a video of N frames at 1 fps: N - 1 haystack frames (sample-style scenes) and one
needle, a color card of lwm/synth/make_vniah.py (six colors: chance 1/6), at frame round(depth * (N - 1)).
The frames come from a pool made and encoded with the VQGAN (--vqgan) for this evaluation, from
seeds that lwm/synth/make_vniah.py never trains on. The prompt is the training data's chat form, the
question before the video:

    [BOS] "You are a helpful assistant. USER: What color is the card in the video?" <vision> frames </vision> "ASSISTANT:"

Scored two ways in every trial:
  generated  greedy generation (text only); right when the first color named is the needle's
  ll         the log-likelihood of each of the six answers ("Red.", ...) after the prompt; right
             when the needle's is the most likely

Writes OUT/vniah.json (config; one record per trial in Video-MME's field names where they fit:
video_id, duration, question, options, answer, task_type; accuracy per cell and method) and
OUT/vniah_heatmap.png (generated) and OUT/vniah_heatmap_ll.png: depth rows x frames columns. A trial
that fails (out of memory, say) is recorded with its error and the run goes on; a stopped run keeps
what it did (vniah.json is rewritten at most every 30 s). Exit status: 0, 1 if some trial failed,
2 for bad input. Only rank 0 writes and prints.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from lwm.arg_types import add_options, from_args, option
from lwm.data.chat import chat_prompt
from lwm.eval.plots import grid_table, heatmap
from lwm.eval.trials import Autosave, announce, check_out_dir, finish, run_trials
from lwm.infer import GenerationConfig
from lwm.infer.prompt import DEFAULT_VQGAN
from lwm.infer.runtime import ModelOptions, load_generator, start
from lwm.interop.vqgan_sources import load_vqgan
from lwm.io import write_atomic
from lwm.ranks import is_rank0
from lwm.synth.make_vniah import NEEDLE_COLORS, QUESTION, code_pool

METHODS = ("generated", "ll")
EVAL_SEED = 3 * 10**6  # the frame pools: make_vniah trains on seed 0.. and holds out 10**6..
ANSWERS = [f"{c.capitalize()}." for c in NEEDLE_COLORS]
_COLOR_WORD = re.compile(r"\b(" + "|".join(NEEDLE_COLORS) + r")\b", re.IGNORECASE)


@dataclass(kw_only=True)
class VniahConfig:
    """python -m lwm.eval.vniah: the model, the VQGAN, the grid and where its results go."""

    model: ModelOptions
    vqgan: str = option("the VQGAN that encodes the frames (safetensors)", str(DEFAULT_VQGAN))
    frames: list[int] = option(
        "video lengths in frames (1 fps)", default_factory=lambda: [2, 4, 6], type=int, nargs="+"
    )
    depths: list[float] = option(
        "needle depths, percent", default_factory=lambda: [0.0, 25.0, 50.0, 75.0, 100.0], type=float, nargs="+"
    )
    trials: int = option("trials per cell (another needle and haystack each)", 4)
    methods: list[str] = option(
        "generated: the greedy answer names the color; ll: the color's answer is the most likely",
        default_factory=lambda: list(METHODS),
        nargs="+",
        choices=METHODS,
    )
    pool: int = option("frames per color and of the haystack, encoded once", 20)
    max_new_tokens: int = option("tokens generated per answer", 4)
    seed: int = option("seeds the frame pools and each trial's video", 0)
    out: str = option("results folder", "results/vniah")


def check_grid(frames: Sequence[int], depths: Sequence[float], trials: int, pool: int) -> None:
    if not frames or any(int(n) < 1 for n in frames):
        raise ValueError(f"--frames must be positive frame counts, got {list(frames)}")
    if not depths or any(not 0 <= float(d) <= 100 for d in depths):
        raise ValueError(f"--depths must be percentages in [0, 100], got {list(depths)}")
    if trials < 1:
        raise ValueError(f"--trials must be >= 1, got {trials}")
    if pool < 1:
        raise ValueError(f"--pool must be >= 1, got {pool}")


def first_color(text: str) -> str | None:
    """The first needle color named in `text` (lowercase), or None."""
    m = _COLOR_WORD.search(text)
    return m.group(1).lower() if m else None


def trial_video(
    codes: np.ndarray, labels: np.ndarray, frames: int, depth: float, seed: int, trial: int
) -> tuple[np.ndarray, str, int]:
    """(codes (frames, tokens_per_frame), the needle's color, its frame index) of one trial: the same
    on every rank and every run."""
    rng = np.random.default_rng([seed, frames, int(round(depth * 1000)), trial])
    hay = np.flatnonzero(labels == len(NEEDLE_COLORS))
    needle = int(rng.choice(np.flatnonzero(labels < len(NEEDLE_COLORS))))
    at = int(round(depth / 100 * (frames - 1)))
    order = list(rng.choice(hay, frames - 1, replace=len(hay) < frames - 1))
    order.insert(at, needle)
    return codes[order], NEEDLE_COLORS[labels[needle]], at


def score_trial(
    generator, tokenizer, vocab, codes: np.ndarray, color: str, methods: Sequence[str], max_new_tokens: int
) -> dict:
    """One prompt scored by each method -> {"generated": {...}, "ll": {...}, "prompt_tokens": n}."""

    prompt = chat_prompt(tokenizer, vocab, QUESTION, codes)
    out: dict = {"prompt_tokens": len(prompt)}
    if "generated" in methods:
        ids = generator.generate(
            prompt, GenerationConfig(max_new_tokens=max_new_tokens, stop_tokens=[tokenizer.eos_id], restrict="text")
        )
        text = tokenizer.decode(ids)
        out["generated"] = {"output": text, "predicted": first_color(text), "correct": first_color(text) == color}
    if "ll" in methods:
        scores = generator.score(prompt, [tokenizer.encode(a) for a in ANSWERS])
        best = NEEDLE_COLORS[int(np.argmax(scores))]
        out["ll"] = {"scores": [round(s, 4) for s in scores], "predicted": best, "correct": best == color}
    return out


def summarize(records: list[dict], frames, depths, methods) -> dict:
    """Accuracy per (frames, depth) cell and overall, per method, over the trials that ran."""

    def acc(rs, m):
        ok = [r[m]["correct"] for r in rs if r["error"] is None]
        return float(np.mean(ok)) if ok else None

    cells = []
    for n in frames:
        for d in depths:
            rs = [r for r in records if r["frames"] == n and r["depth"] == d]
            cells.append(
                {
                    "frames": n,
                    "depth": d,
                    "trials": len(rs),
                    "failed": sum(r["error"] is not None for r in rs),
                    **{m: acc(rs, m) for m in methods},
                }
            )
    return {
        "cells": cells,
        "accuracy": {m: acc(records, m) for m in methods},
        "trials_run": len(records),
        "trials_failed": sum(r["error"] is not None for r in records),
    }


def run_vniah(
    generator,
    tokenizer,
    vocab,
    vqgan,
    frames: Sequence[int],
    depths: Sequence[float],
    trials: int = 1,
    *,
    methods: Sequence[str] = METHODS,
    pool: int = 20,
    seed: int = 0,
    max_new_tokens: int = 4,
    progress: bool = False,
    on_trial: Callable[[dict, list[dict]], None] | None = None,
) -> dict:
    """Run the grid frames x depths x trials -> {"config", "trials", "cells", "accuracy", ...}.

    generator: lwm.infer.Generator (every rank of a context-parallel group calls this with the same
    arguments); vqgan encodes the frame pools (`pool` frames per color and of the haystack)."""
    frames, depths = [int(n) for n in frames], [float(d) for d in depths]
    check_grid(frames, depths, trials, pool)
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {list(methods)}")
    vocab.check_tokenizer(tokenizer)
    if vqgan.config.n_codes > vocab.n_vision_codes:
        raise ValueError(
            f"the VQGAN has {vqgan.config.n_codes} codes but the model's vocabulary holds {vocab.n_vision_codes}"
        )
    codes, labels = code_pool(vqgan, pool, EVAL_SEED + seed)  # (N, tokens_per_frame), (N,)
    trial = partial(run_trial, generator, tokenizer, vocab, codes, labels, seed, methods, max_new_tokens)
    grid = [(n, d, t) for n in frames for d in depths for t in range(trials)]
    first = methods[0]  # the progress bar's
    records = run_trials(grid, trial, lambda r: r[first]["correct"], desc="vniah", progress=progress, on_trial=on_trial)
    return {
        "config": {
            "frames": frames,
            "depths": depths,
            "trials": trials,
            "methods": list(methods),
            "pool": pool,
            "seed": seed,
            "max_new_tokens": max_new_tokens,
            "question": QUESTION,
            "answers": ANSWERS,
            "chance": 1 / len(ANSWERS),
        },
        "trials": records,
        **summarize(records, frames, depths, methods),
    }


def run_trial(
    generator, tokenizer, vocab, codes, labels, seed: int, methods, max_new_tokens: int, n: int, d: float, t: int
) -> dict:
    """Trial t of the cell (n frames, needle depth d) -> its record; an error is recorded, not raised."""
    video, color, at = trial_video(codes, labels, n, d, EVAL_SEED + seed, t)
    rec = {
        "video_id": f"vniah_{n}f_{d:g}_{t}",
        "duration": n,
        "frames": n,
        "depth": d,
        "trial": t,
        "needle_frame": at,
        "task_type": "needle color",
        "question": QUESTION,
        "options": ANSWERS,
        "answer": f"{color.capitalize()}.",
        "error": None,
    }
    start = time.perf_counter()
    try:
        rec.update(score_trial(generator, tokenizer, vocab, video, color, methods, max_new_tokens))
    except Exception as e:  # recorded; the grid goes on (an out-of-memory at one length, say)
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["seconds"] = round(time.perf_counter() - start, 3)
    return rec


def accuracy_grid(results: dict, method: str) -> list[list[float | None]]:
    """Accuracy of `method` as depth rows x frames columns."""
    cells = {(c["frames"], c["depth"]): c[method] for c in results["cells"]}
    cfg = results["config"]
    return [[cells.get((n, d)) for n in cfg["frames"]] for d in cfg["depths"]]


def _labels(cfg: dict) -> tuple[list[str], list[str]]:
    """The grid's row (depth) and column (frames) labels."""
    return [f"{d:g}" for d in cfg["depths"]], [str(n) for n in cfg["frames"]]


def write_results(results: dict, out: Path, title: str = "Visual needle in a haystack") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    path = write_atomic(out / "vniah.json", json.dumps(results, indent=1))
    cfg, written = results["config"], [path]
    rows, cols = _labels(cfg)
    for m in cfg["methods"]:
        name = "vniah_heatmap.png" if m == "generated" else f"vniah_heatmap_{m}.png"
        written.append(
            heatmap(
                accuracy_grid(results, m),
                rows,
                cols,
                out / name,
                title=f"{title} ({'generated answer' if m == 'generated' else 'answer log-likelihood'})",
                xlabel="video length (frames, 1 fps)",
                ylabel="needle depth (%)",
            )
        )
    return written


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Visual needle in a video haystack over video lengths x needle depths",
        epilog="Exit status: 0, 1 if some trial failed (recorded in vniah.json), 2 for bad input.",
    )
    return add_options(p, VniahConfig)


def check(config: VniahConfig) -> None:
    """Every check that needs no weights, before they load; raises FileNotFoundError or ValueError
    naming the option."""
    paths = {"--model": config.model.model, "--tokenizer": config.model.tokenizer, "--vqgan": config.vqgan}
    for flag, value in paths.items():
        if value is not None and not Path(value).exists():
            raise FileNotFoundError(f"{flag} {value} does not exist")
    check_grid(config.frames, config.depths, config.trials, config.pool)
    if config.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {config.max_new_tokens}")
    check_out_dir(Path(config.out))


def _report(results: dict, out: Path) -> list[str]:
    """Writes vniah.json and the heatmaps -> a table per method and the accuracy line."""
    written = write_results(results, out)
    cfg, lines = results["config"], []
    rows, cols = _labels(cfg)
    for m in cfg["methods"]:
        lines += [f"{m}:", grid_table(accuracy_grid(results, m), rows, cols, corner="depth \\ frames")]
    accs = ", ".join(f"{m} {'n/a' if a is None else f'{a:.3f}'}" for m, a in results["accuracy"].items())
    lines.append(
        f"accuracy {accs} (chance {1 / len(ANSWERS):.3f}) over {results['trials_run']} trials "
        f"({results['trials_failed']} failed); wrote {', '.join(str(p) for p in written)}"
    )
    return lines


def _so_far(run_info: dict, records: list[dict]) -> dict:
    """vniah.json while the grid runs."""
    return {"config": {**run_info, "complete": False}, "trials": records}


def _trial_name(r: dict) -> str:
    return f"{r['frames']} frames depth {r['depth']:g} trial {r['trial']}"


def run(config: VniahConfig) -> int:
    """The command: checks (raising for bad input), the model and VQGAN, the grid; rank 0 saves as
    it goes, writes and prints -> exit status (0, 1 if some trial failed, 2 if loading failed)."""
    check(config)
    runtime = start(config.model.device)
    try:
        vqgan = load_vqgan(config.vqgan).eval()
        loaded, gen = load_generator(config.model, runtime)
    except (FileNotFoundError, ValueError) as e:
        print(f"vniah: {e}", file=sys.stderr)
        return 2
    out = Path(config.out)
    run_info = {
        "model": str(config.model.model),
        "tokenizer": str(loaded.tokenizer.path),
        "vqgan": str(config.vqgan),
        "device": runtime.device,
        "world_size": runtime.world,
        "layout": config.model.layout,
        "dtype": str(next(loaded.model.parameters()).dtype).replace("torch.", ""),
    }
    announce(runtime, "vniah", len(config.frames), len(config.depths), config.trials)
    results = run_vniah(
        gen,
        loaded.tokenizer,
        loaded.vocab,
        vqgan,
        config.frames,
        config.depths,
        config.trials,
        methods=config.methods,
        pool=config.pool,
        seed=config.seed,
        max_new_tokens=config.max_new_tokens,
        progress=is_rank0(),
        on_trial=Autosave(out / "vniah.json", partial(_so_far, run_info)),
    )
    results["config"] = {**run_info, **results["config"], "complete": True}
    return finish(runtime, results, lambda: _report(results, out), _trial_name)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    config = from_args(VniahConfig, parser.parse_args(argv))
    try:  # bad input exits 2 with the usage, before anything loads
        check(config)
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
