"""Needle in a haystack, in LWM's form: can the model find one sentence anywhere in a long context?

    python -m lwm.eval.needle --model runs/X/hf --lengths 1024 2048 --depths 0 25 50 75 100 --trials 2 --out results/needle
    python -m lwm.eval.needle --model ... --needles 4 --ask 2              # multi-needle: 4 inserted, 2 asked for
    torchrun --nproc_per_node 2 -m lwm.eval.needle --model ...             # prompt and KV cache split over 2 ranks

The needle "The special magic {city} number is: {number}." (a random city and 7-digit number per
trial, seeded; `--digits` for shorter ones) goes into a haystack of real text (any text file, or JSON lines with a "text" field
like PG19; default the bundled data/sample/text.jsonl, repeated if short) at a depth from 0% (the
start) to 100% (the end), moved back to the sentence break before that point. The model sees LWM's
chat prompt with the whole context and the question in the user turn:

    [BOS] "You are a helpful assistant. USER: {context} What is the special magic {city} number?
    Don't give information outside the document or repeat your findings. Keep your response short
    and direct." "ASSISTANT:"

and an answer is right when the needle's number appears in it (digits not run into other digits;
"1,234,567" counts). With N needles, needle k goes at depth d + k (100 - d) / N and R of them are
asked for in one question; a trial scores the fraction of asked numbers found.

Length: a context length is the length of the whole prompt in the model's own tokens, exact (how
the prompt is put together from token ids: lwm/synth/needle_prompts.py).

Writes OUT/needle.json (the configuration, every trial, accuracy per cell; also written during the
run, at most every 30 s, so a stopped run keeps what it did) and OUT/needle_heatmap.png (depth rows
x length columns). A trial that fails (e.g. out of memory) is recorded with its error and the run
goes on. Exit status: 0, 1 if some trial failed, 2 for bad input. Only rank 0 writes and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from lwm.arg_types import add_options, from_args, option
from lwm.data.text_tokenizer import TextTokenizer
from lwm.eval.plots import grid_table, heatmap, human_count
from lwm.eval.trials import Autosave, announce, check_out_dir, finish, run_trials
from lwm.infer import GenerationConfig
from lwm.infer.load import find_tokenizer
from lwm.infer.runtime import ModelOptions, load_generator, start
from lwm.io import write_atomic
from lwm.paths import REPO
from lwm.ranks import is_rank0
from lwm.synth.make_sample import ensure_sample
from lwm.synth.needle_prompts import (
    CITIES,
    DEFAULT_HAYSTACK,
    INSTRUCTION,
    NEEDLE,
    QUESTION,
    QUESTION_MANY,
    Haystack,
    build_prompt,
    make_needles,
    min_length,
    number_range,
    question_for,
)


@dataclass(kw_only=True)
class NeedleGrid:
    """What the grid asks (training's `evaluate` is one, its own values in conf/train.yaml)."""

    lengths: list[int] | None = option(
        "whole-prompt lengths in tokens", default_factory=lambda: [1024, 2048], type=int, nargs="+"
    )
    depths: list[float] = option(
        "needle depths, percent", default_factory=lambda: [0.0, 25.0, 50.0, 75.0, 100.0], type=float, nargs="+"
    )
    trials: int = option("trials per cell (a new city and number each)", 2)
    needles: int = option("needles per context", 1)
    ask: int | None = option("how many of the needles the question asks for (default: all)", None, type=int)
    haystack: str | None = option(
        f'text file, or JSON lines with "text" (default {DEFAULT_HAYSTACK.relative_to(REPO)})', None
    )
    max_new_tokens: int = option("tokens generated per answer", 16)
    seed: int = option("seeds the needles' cities and numbers", 0)
    digits: int = option("digits of the needles' numbers (LWM's: 7)", 7)
    instruction: bool = option(
        "leave LWM's instruction after the question out (as lwm/synth/make_retrieval.py --no-instruction)",
        True,
        flag="--no-instruction",
        action="store_false",
    )


@dataclass(kw_only=True)
class NeedleConfig:
    """python -m lwm.eval.needle: the model, the grid and where its results go."""

    model: ModelOptions
    grid: NeedleGrid = field(default_factory=NeedleGrid)
    out: str = option("results folder", "results/needle")


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


def check_options(grid: NeedleGrid) -> None:
    """Every check of the grid's options that needs no file; each message names its field."""
    check_grid(grid.lengths, grid.depths, grid.trials, grid.needles, grid.ask)
    number_range(grid.digits)
    if grid.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {grid.max_new_tokens}")


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
    trial. A trial that raises is recorded with its error (score None) and the run goes on.
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
        path = Path(haystack) if haystack is not None else DEFAULT_HAYSTACK
        haystack = Haystack.from_file(tokenizer, path, longest + 4096)
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
    `length` ids, the answer generated with `config` and its score; an error is recorded, not raised."""
    rng = trial_rng(seed, length, depth, trial)
    items = make_needles(rng, depth, needles, ask, digits)
    order = list(range(needles))
    rng.shuffle(order)  # the order the asked cities are named in the question
    question = question_for(items, order)
    record = {"length": length, "depth": depth, "trial": trial, "question": question, "prompt_tokens": None}
    if needles == 1:
        record.update(city=items[0].city, number=items[0].number)
    start = time.perf_counter()
    try:
        prompt = build_prompt(tokenizer, haystack, length, items, question, instruction=instruction)
        record["prompt_tokens"] = len(prompt.ids)
        out = generator.generate(prompt.ids, config)
        answer = tokenizer.decode([t for t in out if t < vocab.text_size])
        for item in items:
            item.found = found_in(item.number, answer) if item.asked else None
        hits = [item.found for item in items if item.asked]
        record.update(answer=answer, score=sum(hits) / len(hits), correct=all(hits), error=None)
    except Exception as e:  # recorded; the grid goes on (an out-of-memory at one length, say)
        record.update(answer=None, score=None, correct=None, error=f"{type(e).__name__}: {e}")
        _free_memory()
    record["seconds"] = round(time.perf_counter() - start, 3)
    record["needles"] = [item.record() for item in items]
    return record


def _free_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------
# Outputs and the command line.


def accuracy_grid(results: dict) -> list[list[float | None]]:
    """Accuracy as depth rows x length columns."""
    cells = {(c["length"], c["depth"]): c["accuracy"] for c in results["cells"]}
    cfg = results["config"]
    return [[cells.get((n, d)) for n in cfg["lengths"]] for d in cfg["depths"]]


def _labels(cfg: dict) -> tuple[list[str], list[str]]:
    """The grid's row (depth) and column (length) labels."""
    return [f"{d:g}" for d in cfg["depths"]], [human_count(n) for n in cfg["lengths"]]


def write_results(results: dict, out: Path, title: str = "Needle in a haystack") -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    path = write_atomic(out / "needle.json", json.dumps(results, indent=1))
    rows, cols = _labels(results["config"])
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Needle-in-a-haystack evaluation (LWM's form) over context lengths x depths",
        epilog="Exit status: 0, 1 if some trial failed (recorded in needle.json), 2 for bad input.",
    )
    return add_options(p, NeedleConfig)


def validate(config: NeedleConfig) -> Haystack:
    """Every check that needs no weights, before they load -> the haystack; raises FileNotFoundError or
    ValueError naming the input."""
    grid, model = config.grid, config.model
    if grid.lengths is None:
        raise ValueError("lengths: give at least one context length")
    check_options(grid)
    if not Path(model.model).exists():
        raise FileNotFoundError(f"model {model.model} does not exist")
    check_out_dir(Path(config.out))
    tokenizer = TextTokenizer(find_tokenizer(Path(model.model), model.tokenizer))
    check_lengths(tokenizer, grid.lengths, grid.needles, grid.ask)
    if grid.haystack is None and not DEFAULT_HAYSTACK.exists():  # the sample data is made, not committed
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the grid's
            ensure_sample()
    return Haystack.from_file(tokenizer, grid.haystack or DEFAULT_HAYSTACK, max(grid.lengths) + 4096)


def _so_far(grid: NeedleGrid, run_info: dict, records: list[dict]) -> dict:
    """needle.json while the grid runs."""
    config = {
        **run_info,
        "lengths": grid.lengths,
        "depths": [float(d) for d in grid.depths],
        "trials": grid.trials,
        "needles": grid.needles,
        "ask": grid.ask or grid.needles,
        "complete": False,
    }
    return {"config": config, "trials": records}


def _report(results: dict, out: Path, title: str) -> list[str]:
    """Writes needle.json and the heatmap -> the grid table and the accuracy line."""
    path, png = write_results(results, out, title)
    rows, cols = _labels(results["config"])
    acc = results["accuracy"]
    return [
        grid_table(accuracy_grid(results), rows, cols, corner="depth \\ length"),
        f"accuracy {'n/a' if acc is None else f'{acc:.3f}'} over {results['trials_run']} trials"
        f" ({results['trials_failed']} failed); wrote {path} and {png}",
    ]


def _title(config: NeedleConfig) -> str:
    model, grid = Path(config.model.model).resolve(), config.grid
    many = f", {grid.needles} needles ({grid.ask or grid.needles} asked)" if grid.needles > 1 else ""
    return f"Needle in a haystack: {model.parent.name}/{model.name}{many}"


def _trial_name(r: dict) -> str:
    return f"length {r['length']} depth {r['depth']:g} trial {r['trial']}"


def run(config: NeedleConfig) -> int:
    """The command: checks, the model, the grid; rank 0 saves as it goes, writes and prints -> exit
    status (0, 1 if some trial failed, 2 for bad input, said on stderr)."""
    runtime = start(config.model.device)
    try:  # every check that needs no weights comes before loading them
        haystack = validate(config)
        loaded, gen = load_generator(config.model, runtime)
    except (FileNotFoundError, ValueError) as e:
        print(f"needle: {e}", file=sys.stderr)
        return 2
    grid, out = config.grid, Path(config.out)
    run_info = {
        "model": str(config.model.model),
        "tokenizer": str(loaded.tokenizer.path),
        "device": runtime.device,
        "dtype": str(next(loaded.model.parameters()).dtype).replace("torch.", ""),
        "world_size": runtime.world,
        "layout": config.model.layout,
    }
    announce(runtime, "needle", len(grid.lengths), len(grid.depths), grid.trials)
    results = run_needle(
        gen,
        loaded.tokenizer,
        loaded.vocab,
        grid.lengths,
        grid.depths,
        grid.trials,
        needles=grid.needles,
        ask=grid.ask,
        haystack=haystack,
        max_new_tokens=grid.max_new_tokens,
        seed=grid.seed,
        digits=grid.digits,
        instruction=INSTRUCTION if grid.instruction else "",
        progress=is_rank0(),
        on_trial=Autosave(out / "needle.json", partial(_so_far, grid, run_info)),
    )
    results["config"] = {**run_info, **results["config"], "complete": True}
    return finish(runtime, results, lambda: _report(results, out, _title(config)), _trial_name)


def main(argv: list[str] | None = None) -> int:
    return run(from_args(NeedleConfig, build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
