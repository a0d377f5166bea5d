"""The needle grid itself, on any generator: lengths x depths x trials, each trial's needles, prompt,
answer and score, the accuracy per cell, and needle.json with its heatmap. The command that loads a
model and runs it is lwm/eval/needle.py (its docstring describes the needle, the prompt and the
scoring)."""

from __future__ import annotations

import json
import random
import re
import time
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from lwm.disk.writes import write_atomic
from lwm.eval.plots import heatmap, human_count
from lwm.eval.trials import group_of, run_trials
from lwm.infer import GenerationConfig
from lwm.parallel.comm import run_agreed
from lwm.synth.needle_prompts import (
    CITIES,
    INSTRUCTION,
    NEEDLE,
    QUESTION,
    QUESTION_MANY,
    Haystack,
    build_prompt,
    haystack_path,
    make_needles,
    min_length,
    number_range,
    question_for,
)


def found_in(number: int, answer: str) -> bool:
    """The number appears in the answer, not as part of a longer run of digits ("1,234,567" counts)."""
    digits = re.sub(r"(?<=\d)[,\s_'](?=\d)", "", answer)
    return re.search(rf"(?<!\d){number}(?!\d)", digits) is not None


def check_grid(lengths, depths, trials: int, needles: int, ask: int | None) -> None:
    """Each message names its field; lengths None is not checked (training's evaluate.lengths=null)."""
    if lengths is not None and not lengths:
        raise ValueError("lengths: give at least one context length")
    if not depths:
        raise ValueError("depths: give at least one depth")
    bad = [d for d in depths if not 0 <= d <= 100]
    if bad:
        raise ValueError(f"depths must lie in 0..100 (percent of the context), got {bad}")
    bad = [n for n in lengths or () if n < 1]
    if bad:
        raise ValueError(f"lengths must be positive token counts, got {bad}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if not 1 <= needles <= len(CITIES):
        raise ValueError(f"needles must lie in 1..{len(CITIES)}, got {needles}")
    if ask is not None and not 1 <= ask <= needles:
        raise ValueError(f"ask must lie in 1..needles ({needles}), got {ask}")


def check_lengths(tokenizer, lengths, needles: int, ask: int | None) -> None:
    shortest = min_length(tokenizer, needles, ask)
    bad = [n for n in lengths if n < shortest]
    if bad:
        raise ValueError(
            f"lengths {bad} are shorter than the needle(s) and question with the chat template "
            f"({shortest} tokens for {needles} needle(s), {ask or needles} asked); use at least {shortest}"
        )


def trial_rng(seed: int, length: int, depth: float, trial: int) -> random.Random:
    """The same cities and numbers for a (length, depth, trial) on every rank and every run."""
    return random.Random(f"needle/{seed}/{length}/{depth:g}/{trial}")


def summarize(records: list[dict], lengths, depths) -> dict:
    """Accuracy per (length, depth) cell and overall, over the trials that ran (failures are counted apart)."""
    cells = []
    for length in lengths:
        for depth in depths:
            rs = [r for r in records if r["length"] == length and r["depth"] == depth]
            ok = [r for r in rs if r["error"] is None]
            cells.append(
                {
                    "length": length,
                    "depth": depth,
                    "trials": len(rs),
                    "failed": len(rs) - len(ok),
                    "accuracy": float(np.mean([r["score"] for r in ok])) if ok else None,
                    "all_found": float(np.mean([r["correct"] for r in ok])) if ok else None,
                }
            )
    ok = [r for r in records if r["error"] is None]
    return {
        "cells": cells,
        "accuracy": float(np.mean([r["score"] for r in ok])) if ok else None,
        "trials_run": len(records),
        "trials_failed": len(records) - len(ok),
    }


def run_needle(
    generator,
    tokenizer,
    vocab,
    lengths: Sequence[int],
    depths: Sequence[float],
    trials: int = 1,
    *,
    needles: int = 1,
    ask: int | None = None,
    haystack=None,
    max_new_tokens: int = 16,
    seed: int = 0,
    digits: int = 7,
    instruction: str = INSTRUCTION,
    progress: bool = False,
    on_trial: Callable[[dict, list[dict]], None] | None = None,
) -> dict:
    """Run the grid lengths x depths x trials and return {"config", "trials", "cells", "accuracy", ...}.

    generator: anything with generate(prompt_ids, GenerationConfig) -> new ids (lwm.infer.Generator);
    every rank of a context-parallel group calls this with the same arguments. haystack: a path, a
    Haystack, or None for the bundled sample. on_trial(record, records so far) is called after each
    trial. A trial that raises on any rank is recorded as failed (score None) on every rank and the
    run goes on.
    instruction: what follows the question ("" leaves LWM's instruction out, as a curriculum's first
    step trains)."""

    lengths, depths = [int(n) for n in lengths], [float(d) for d in depths]
    check_grid(lengths, depths, trials, needles, ask)
    if needles > len(number_range(digits)):
        raise ValueError(f"{needles} needles need distinct numbers; {digits} digit(s) give {len(number_range(digits))}")
    ask = needles if ask is None else ask
    vocab.check_tokenizer(tokenizer)
    check_lengths(tokenizer, lengths, needles, ask)
    haystack = _haystack(haystack, tokenizer, max(lengths))
    config = GenerationConfig(max_new_tokens=max_new_tokens, stop_tokens=[tokenizer.eos_id], restrict="text")
    trial = partial(run_trial, generator, tokenizer, vocab, haystack, config)
    trial = partial(trial, needles=needles, ask=ask, seed=seed, digits=digits, instruction=instruction)
    grid = [(n, d, t) for n in lengths for d in depths for t in range(trials)]
    records = run_trials(grid, trial, lambda r: r["score"], desc="needle", progress=progress, on_trial=on_trial)
    return {
        "config": {
            "lengths": lengths,
            "depths": depths,
            "trials": trials,
            "needles": needles,
            "ask": ask,
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "digits": digits,
            "haystack": haystack.name,
            "needle": NEEDLE,
            "question": QUESTION if ask == 1 else QUESTION_MANY,
            "instruction": instruction,
        },
        "trials": records,
        **summarize(records, lengths, depths),
    }


def _haystack(haystack, tokenizer, longest: int) -> Haystack:
    """A Haystack as given, or read from a path (None: the bundled sample), long enough for `longest`."""
    if not isinstance(haystack, Haystack):
        haystack = Haystack.from_file(tokenizer, haystack_path(haystack), longest + 4096)
    if len(haystack) <= longest:
        raise ValueError(f"haystack {haystack.name} has {len(haystack)} tokens; the longest length needs {longest + 1}")
    return haystack


def run_trial(
    generator,
    tokenizer,
    vocab,
    haystack: Haystack,
    config,
    length: int,
    depth: float,
    trial: int,
    *,
    needles: int,
    ask: int,
    seed: int,
    digits: int,
    instruction: str,
) -> dict:
    """One trial -> its record: the needles (the same on every rank and every run), the prompt of
    `length` ids, the answer generated with `config` and its score. An error is recorded, not raised,
    and agreed by the generator's group: a rank failing alone fails the trial on every rank, so all
    go on to the next trial together (lwm.parallel.comm.run_agreed)."""
    rng = trial_rng(seed, length, depth, trial)
    items = make_needles(rng, depth, needles, ask, digits)
    order = list(range(needles))
    rng.shuffle(order)  # the order the asked cities are named in the question
    question = question_for(items, order)
    record = {"length": length, "depth": depth, "trial": trial, "question": question, "prompt_tokens": None}
    if needles == 1:
        record.update(city=items[0].city, number=items[0].number)
    start = time.perf_counter()
    ask = partial(_answer, generator, tokenizer, vocab, haystack, config, length, items, question, instruction, record)
    answer, error = run_agreed(ask, *group_of(generator))
    if error is None:
        for item in items:
            item.found = found_in(item.number, answer) if item.asked else None
        hits = [item.found for item in items if item.asked]
        record.update(answer=answer, score=sum(hits) / len(hits), correct=all(hits), error=None)
    else:  # recorded alike on every rank; the grid goes on (an out-of-memory at one length, say)
        record.update(answer=None, score=None, correct=None, error=f"{type(error).__name__}: {error}")
        _free_memory()
    record["seconds"] = round(time.perf_counter() - start, 3)
    record["needles"] = [item.record() for item in items]
    return record


def _answer(generator, tokenizer, vocab, haystack, config, length, items, question, instruction, record) -> str:
    """The trial's prompt (its length into record) and the generated answer's text."""
    prompt = build_prompt(tokenizer, haystack, length, items, question, instruction=instruction)
    record["prompt_tokens"] = len(prompt.ids)
    out = generator.generate(prompt.ids, config)
    return tokenizer.decode([t for t in out if t < vocab.text_size])


def _free_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# The outputs.


def accuracy_grid(results: dict) -> list[list[float | None]]:
    """Accuracy as depth rows x length columns."""
    cells = {(c["length"], c["depth"]): c["accuracy"] for c in results["cells"]}
    cfg = results["config"]
    return [[cells.get((n, d)) for n in cfg["lengths"]] for d in cfg["depths"]]


def grid_labels(cfg: dict) -> tuple[list[str], list[str]]:
    """The grid's row (depth) and column (length) labels."""
    return [f"{d:g}" for d in cfg["depths"]], [human_count(n) for n in cfg["lengths"]]


def write_results(results: dict, out: Path, title: str = "Needle in a haystack") -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    path = write_atomic(out / "needle.json", json.dumps(results, indent=1))
    rows, cols = grid_labels(results["config"])
    png = heatmap(
        accuracy_grid(results),
        rows,
        cols,
        out / "needle_heatmap.png",
        title=title,
        xlabel="context length (tokens)",
        ylabel="depth (%)",
    )
    return path, png
