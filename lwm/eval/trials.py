"""A grid of trials, as the needle evaluations (needle, vniah) run it: one record per trial with a
progress bar, the results file rewritten as they go (so a stopped run keeps what it did), and the
report at the end."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from tqdm import tqdm

from lwm.arg_types import from_args
from lwm.ranks import is_rank0


def checked_main(argv: list[str] | None, parser, config_type, check: Callable, run: Callable) -> int:
    """A grid command's main: its config from argv, check(config) (bad input exits 2 with the usage, before
    anything loads), then run(config) -> exit status."""
    config = from_args(config_type, parser.parse_args(argv))
    try:
        check(config)
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    return run(config)


def check_out_dir(out: Path) -> None:
    """Refuse a results folder that cannot be made (a file on its path, no write access), before the
    model loads and without writing anything: a ValueError naming --out."""
    out = Path(out)
    existing = next(a for a in (out, *out.parents) if a.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {out} cannot be the results folder: {existing} is a file")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"--out {out} cannot be the results folder: {existing} is not writable")


def group_of(generator) -> tuple:
    """(process group, compute device) of a generator, for agreeing on a trial's failure; a stand-in
    without them runs as one process."""
    return getattr(generator, "group", None), getattr(generator, "device", None)


def run_trials(
    grid: Sequence[tuple],
    trial: Callable[..., dict],
    score: Callable[[dict], float],
    *,
    desc: str,
    progress: bool = False,
    on_trial: Callable[[dict, list[dict]], None] | None = None,
) -> list[dict]:
    """trial(*cell) -> a record, for each cell of the grid in order; on_trial(record, records so far)
    after each. The bar shows the mean score(record) of the trials without an error, and the failures."""
    bar = None
    if progress:
        bar = tqdm(total=len(grid), desc=desc, unit="trial", dynamic_ncols=True)
    records: list[dict] = []
    for cell in grid:
        records.append(trial(*cell))
        if on_trial is not None:
            on_trial(records[-1], records)
        if bar is not None:
            done = [score(r) for r in records if r["error"] is None]
            bar.set_postfix(acc=f"{np.mean(done):.2f}" if done else "n/a", failed=len(records) - len(done))
            bar.update()
    if bar is not None:
        bar.close()
    return records


class Autosave:
    """An on_trial that rewrites `path` with partial(records) on rank 0, at most every 30 s."""

    def __init__(self, path: Path, partial: Callable[[list[dict]], dict], every: float = 30.0):
        self.path, self.partial, self.every = path, partial, every
        self.last = 0.0  # so the first trial is saved

    def __call__(self, record: dict, records: list[dict]) -> None:
        if is_rank0() and time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.partial(records), indent=1))


def announce(runtime, name: str, lengths: int, depths: int, trials: int) -> None:
    """The grid's size on stderr (stdout is the report's), from rank 0."""
    if is_rank0():
        print(
            f"{name}: {lengths} lengths x {depths} depths x {trials} trials on {runtime.world} process(es), "
            f"{runtime.device}",
            file=sys.stderr,
        )


def finish(runtime, results: dict, report: Callable[[], list[str]], trial_name: Callable[[dict], str]) -> int:
    """The end of a grid command: on rank 0, report() (which writes the outputs) -> lines for stdout,
    then each failed trial to stderr; the process group ends. -> 1 if a trial failed, else 0."""
    if is_rank0():
        for line in report():
            print(line)
        for r in results["trials"]:
            if r["error"]:
                print(f"failed: {trial_name(r)}: {r['error']}", file=sys.stderr)
    runtime.close()
    return 1 if results["trials_failed"] else 0
