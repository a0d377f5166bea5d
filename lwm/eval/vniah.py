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
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from lwm.arg_types import add_options, option
from lwm.eval.plots import grid_table
from lwm.eval.trials import Autosave, announce, check_out_dir, checked_main, finish
from lwm.eval.vniah_grid import ANSWERS, METHODS, accuracy_grid, check_grid, grid_labels, run_vniah, write_results
from lwm.infer.runtime import ModelOptions, load_generator, start
from lwm.interop.vqgan_sources import load_vqgan
from lwm.paths import TINY_VQGAN
from lwm.ranks import is_rank0


@dataclass(kw_only=True)
class VniahConfig:
    """python -m lwm.eval.vniah: the model, the VQGAN, the grid and where its results go."""

    model: ModelOptions
    vqgan: str = option("the VQGAN that encodes the frames (safetensors)", str(TINY_VQGAN))
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
    rows, cols = grid_labels(cfg)
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
        prompt_style=loaded.prompt,
    )
    results["config"] = {**run_info, **results["config"], "complete": True}
    return finish(runtime, results, lambda: _report(results, out), _trial_name)


def main(argv: list[str] | None = None) -> int:
    return checked_main(argv, build_parser(), VniahConfig, check, run)


if __name__ == "__main__":
    sys.exit(main())
