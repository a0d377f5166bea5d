"""A training stage's folder: the one description of its layout, used by the run that writes it
(lwm.train) and by what reads it back (lwm.interop.stage_outputs: export, lwm-generate, evaluation).

    out_dir/<stage>/
      model_config.json    the stage's model (shape, RoPE theta), written before it trains
      checkpoints/         Lightning checkpoints (sharded folders when distributed): model, optimizer, LR
                           schedule, loop and data position; last.ckpt resumes the stage
      logs/  tb/           CSV metrics (and a resumed stage's earlier rows until it finishes); TensorBoard
      final.safetensors    the stage's weights when its last step is done (the next stage starts from them)
    out_dir/hf/            the last stage exported as a Hugging Face LLaMA folder
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LOGS, TB, CHECKPOINTS = "logs", "tb", "checkpoints"
KEPT_METRICS = "metrics.kept.csv"  # in logs/: a resumed stage's rows until it finishes


@dataclass(frozen=True)
class StageFolder:
    path: Path

    @classmethod
    def of(cls, out_dir: str | Path, stage: str) -> StageFolder:
        return cls(Path(out_dir) / stage)

    @property
    def model_config(self) -> Path:
        return self.path / "model_config.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.ckpt"

    @property
    def logs(self) -> Path:
        return self.path / LOGS

    @property
    def final(self) -> Path:
        return self.path / "final.safetensors"

    def is_stage(self) -> bool:
        """Whether the folder is a stage's (its model_config.json is there)."""
        return self.model_config.exists()
