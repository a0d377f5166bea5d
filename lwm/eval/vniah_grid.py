"""The V-NIAH grid itself, on any generator: frames x depths x trials, each trial's video (haystack
frames and one needle card, from pools encoded with the VQGAN), its prompt and both scores, the
accuracy per cell and method, and vniah.json with its heatmaps. The command that loads a model and
runs it is lwm/eval/vniah.py (its docstring describes the task and the scoring)."""

from __future__ import annotations

import json
import re
import time
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from lwm.data.chat import chat_prompt
from lwm.disk.writes import write_atomic
from lwm.eval.plots import heatmap
from lwm.eval.trials import group_of, run_trials
from lwm.infer import GenerationConfig
from lwm.parallel.comm import run_agreed
from lwm.synth.make_vniah import NEEDLE_COLORS, QUESTION, code_pool

METHODS = ("generated", "ll")
EVAL_SEED = 3 * 10**6  # the frame pools: make_vniah trains on seed 0.. and holds out 10**6..
ANSWERS = [f"{c.capitalize()}." for c in NEEDLE_COLORS]
_COLOR_WORD = re.compile(r"\b(" + "|".join(NEEDLE_COLORS) + r")\b", re.IGNORECASE)


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
    generator,
    tokenizer,
    vocab,
    codes: np.ndarray,
    color: str,
    methods: Sequence[str],
    max_new_tokens: int,
    prompt_style: str = "native",
) -> dict:
    """One prompt (chat_prompt in the model's style) scored by each method -> {"generated": {...}, "ll": {...},
    "prompt_tokens": n}."""

    prompt = chat_prompt(tokenizer, vocab, QUESTION, codes, style=prompt_style)
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
    prompt_style: str = "native",
) -> dict:
    """Run the grid frames x depths x trials -> {"config", "trials", "cells", "accuracy", ...}.

    generator: lwm.infer.Generator (every rank of a context-parallel group calls this with the same
    arguments); vqgan encodes the frame pools (`pool` frames per color and of the haystack); prompt_style:
    the model's (lwm.interop.bundle), how its questions are written."""
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
    trial = partial(run_trial, generator, tokenizer, vocab, codes, labels, seed, methods, max_new_tokens, prompt_style)
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
    generator,
    tokenizer,
    vocab,
    codes,
    labels,
    seed: int,
    methods,
    max_new_tokens: int,
    prompt_style: str,
    n: int,
    d: float,
    t: int,
) -> dict:
    """Trial t of the cell (n frames, needle depth d) -> its record. An error is recorded, not raised,
    and agreed by the generator's group: a rank failing alone fails the trial on every rank, so all go
    on to the next trial together (lwm.parallel.comm.run_agreed)."""
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
    score = partial(score_trial, generator, tokenizer, vocab, video, color, methods, max_new_tokens, prompt_style)
    scores, error = run_agreed(score, *group_of(generator))
    if error is None:
        rec.update(scores)
    else:  # recorded alike on every rank; the grid goes on (an out-of-memory at one length, say)
        rec["error"] = f"{type(error).__name__}: {error}"
    rec["seconds"] = round(time.perf_counter() - start, 3)
    return rec


def accuracy_grid(results: dict, method: str) -> list[list[float | None]]:
    """Accuracy of `method` as depth rows x frames columns."""
    cells = {(c["frames"], c["depth"]): c[method] for c in results["cells"]}
    cfg = results["config"]
    return [[cells.get((n, d)) for n in cfg["frames"]] for d in cfg["depths"]]


def grid_labels(cfg: dict) -> tuple[list[str], list[str]]:
    """The grid's row (depth) and column (frames) labels."""
    return [f"{d:g}" for d in cfg["depths"]], [str(n) for n in cfg["frames"]]


def write_results(results: dict, out: Path, title: str = "Visual needle in a haystack") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    path = write_atomic(out / "vniah.json", json.dumps(results, indent=1))
    cfg, written = results["config"], [path]
    rows, cols = grid_labels(cfg)
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
