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
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from lwm.arg_types import add_options, from_args, option
from lwm.data.text_tokenizer import TextTokenizer
from lwm.eval.needle_grid import accuracy_grid, check_grid, check_lengths, grid_labels, run_needle, write_results
from lwm.eval.plots import grid_table
from lwm.eval.trials import Autosave, announce, check_out_dir, finish
from lwm.infer.load import find_tokenizer
from lwm.infer.runtime import ModelOptions, load_generator, start
from lwm.paths import REPO
from lwm.ranks import is_rank0
from lwm.synth.needle_prompts import DEFAULT_HAYSTACK, INSTRUCTION, Haystack, haystack_path, number_range


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


def check_options(grid: NeedleGrid) -> None:
    """Every check of the grid's options that needs no file; each message names its field."""
    check_grid(grid.lengths, grid.depths, grid.trials, grid.needles, grid.ask)
    number_range(grid.digits)
    if grid.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {grid.max_new_tokens}")


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
    return Haystack.from_file(tokenizer, haystack_path(grid.haystack), max(grid.lengths) + 4096)


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
    rows, cols = grid_labels(results["config"])
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
