"""After the run: a needle grid on what it trained. lwm/eval/needle.py runs on the last stage's weights
in a process of its own (rank 0 only, and alone: without the launcher's RANK, WORLD_SIZE, MASTER_ADDR
...; the same command a user would type, printed first), prints its table, and writes
<out_dir>/needle/needle.json and needle_heatmap.png. A failed evaluation is reported and leaves the
trained weights as they are."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lwm.parallel.launch import single_process_env
from lwm.train.console import say


@dataclass
class NeedleEvalConfig:
    lengths: list[int] | None = None  # whole-prompt lengths in tokens; None: no evaluation
    depths: list[float] = field(default_factory=lambda: [0.0, 50.0, 100.0])  # needle depths, percent
    trials: int = 4  # per (length, depth) cell
    digits: int = 1  # digits of the needles' numbers (chance: 1 / 10 ** digits)
    haystack: str | None = None  # text file or JSON lines with "text"; None: lwm/eval/needle.py's default
    instruction: bool = (
        True  # False: LWM's instruction after the question left out, as a curriculum's first step trains
    )
    max_new_tokens: int = 4

    def __post_init__(self) -> None:
        if self.lengths is not None and (not self.lengths or any(int(n) < 1 for n in self.lengths)):
            raise ValueError(f"evaluate.lengths must be positive token counts or null, got {self.lengths}")
        if not self.depths or any(not 0 <= float(d) <= 100 for d in self.depths):
            raise ValueError(f"evaluate.depths must be percentages in [0, 100], got {self.depths}")
        for name in ("trials", "digits", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"evaluate.{name} must be >= 1, got {getattr(self, name)}")


def needle_command(cfg: NeedleEvalConfig, model: Path, tokenizer: str, out: Path, device: str | None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "lwm.eval.needle",
        "--model",
        str(model),
        "--tokenizer",
        str(tokenizer),
        "--lengths",
        *map(str, cfg.lengths),
        "--depths",
        *(f"{float(d):g}" for d in cfg.depths),
        "--trials",
        str(cfg.trials),
        "--digits",
        str(cfg.digits),
        "--max-new-tokens",
        str(cfg.max_new_tokens),
        "--out",
        str(out),
    ]
    cmd += ["--haystack", cfg.haystack] if cfg.haystack else []
    cmd += [] if cfg.instruction else ["--no-instruction"]
    return cmd + (["--device", device] if device else [])


def evaluate_needles(
    cfg: NeedleEvalConfig, model: Path, tokenizer: str, out: Path, device: str | None = None
) -> Path | None:
    """Run the grid on `model` (a stage folder or Hugging Face folder); returns needle.json, or None
    when the evaluation failed (said, not raised: the run's weights are kept either way)."""
    cmd = needle_command(cfg, model, tokenizer, out, device)
    say(f"\nevaluating: {' '.join(cmd[1:])}")
    code = subprocess.run(cmd, env=single_process_env()).returncode  # one process, not a rank of the run
    if code != 0:
        say(f"warning: the needle evaluation exited with status {code}; {out} holds what it finished")
        return None
    return out / "needle.json"
