"""After the run: a needle grid on what it trained. Training's `evaluate` is lwm/eval/needle.py's own
NeedleGrid, with the run's values in conf/train.yaml; the run adds the model (the last stage's
weights), the tokenizer and the results folder, prints the command a user would type for the same
grid, and runs the command's run(config) in a process of its own: rank 0 only, and alone (without
the launcher's RANK, WORLD_SIZE, MASTER_ADDR ...: a rank's process group would make the grid a rank
of the finished run). It prints its table and writes <out_dir>/needle/needle.json and
needle_heatmap.png. A failed evaluation is reported and leaves the trained weights as they are."""

from __future__ import annotations

import json
from pathlib import Path

from lwm.arg_types import to_argv
from lwm.child import run_in_child
from lwm.eval import needle
from lwm.eval.needle import NeedleConfig, NeedleGrid
from lwm.infer.runtime import ModelOptions
from lwm.parallel.launch import single_process_env
from lwm.ranks import say


def needle_config(grid: NeedleGrid, model: Path, tokenizer: str, out: Path, device: str | None) -> NeedleConfig:
    """The command's config: `grid` on `model` (a stage folder or Hugging Face folder), results in `out`."""
    return NeedleConfig(
        model=ModelOptions(model=str(model), tokenizer=str(tokenizer), device=device), grid=grid, out=str(out)
    )


EVALUATION_FAILED = "needle failed"  # the run's summary line for an evaluation that did not finish whole


def evaluated(out: Path) -> bool:
    """Whether `out` (a run's needle/ folder) holds a whole evaluation: needle.json complete, no trial failed."""
    try:
        results = json.loads((out / "needle.json").read_text())
        return results["config"]["complete"] is True and results.get("trials_failed") == 0
    except (OSError, ValueError, KeyError, TypeError):
        return False


def evaluate_needles(
    grid: NeedleGrid, model: Path, tokenizer: str, out: Path, device: str | None = None
) -> Path | None:
    """Run the grid on `model`; returns needle.json, or None when the evaluation failed (said, not
    raised: the run's weights are kept either way)."""
    config = needle_config(grid, model, tokenizer, out, device)
    say(f"\nevaluating: -m lwm.eval.needle {' '.join(to_argv(config))}")
    code = run_in_child(needle.run, config, env=single_process_env())  # one process, not a rank of the run
    if code != 0:
        say(f"warning: the needle evaluation exited with status {code}; {out} holds what it finished")
        return None
    return out / "needle.json"
