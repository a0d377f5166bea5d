"""From a composed Hydra config to typed configs, sample data on first use, and the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lwm.model import ModelConfig
from lwm.train.config import OptimConfig, ParallelConfig, ScheduleConfig, TrainerConfig
from lwm.train.probe import ProbeConfig
from lwm.train.console import say
from lwm.train.run import DataSpec, RunConfig
from lwm.train.run_dir import register_resolver

register_resolver()  # ${run_id:} in trainer.out_dir: one folder name shared by every rank

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {"data.tokenizer": "path/to/tokenizer.model", "data.sources": "'{docs: {path: docs.jsonl}}'"}


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Each group becomes its dataclass; unknown keys are errors that name them."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ValueError(f"{', '.join(missing)} must be given (no default), e.g. "
                         + " ".join(f"{k}={EXAMPLES.get(k, '...')}" for k in missing))
    c = OmegaConf.to_container(cfg, resolve=True)
    data = DataSpec(**c["data"])
    model = ModelConfig.from_preset(c["model"]["preset"], **(c["model"].get("overrides") or {}))
    if Path(data.tokenizer).is_file():  # the embedding has exactly the rows of the vocabulary layout
        from lwm.data import TextTokenizer, Vocab

        rows = Vocab(TextTokenizer(data.tokenizer).vocab_size).size
        if rows != model.vocab_size:
            say(f"note: vocab_size {model.vocab_size} of model {c['model']['preset']!r} set to {rows} for {data.tokenizer}")
            model = model.replace(vocab_size=rows)
    return RunConfig(
        model=model,
        data=data,
        parallel=ParallelConfig(**c["parallel"]),
        schedule=ScheduleConfig(**c["schedule"]),
        trainer=TrainerConfig(**c["trainer"]),
        optim=OptimConfig(**{**c["optim"], "betas": tuple(c["optim"]["betas"])}),
        stage_only=c.get("stage_only"),
        resume=bool(c.get("resume", False)),
        export=bool(c.get("export", True)),
        stop_at_step=c.get("stop_at_step"),
        probe=ProbeConfig(**(c.get("probe") or {})),
    )


def ensure_sample_data(data: DataSpec) -> None:
    """Make data/sample and tokenize its videos once (both skip what is already there)."""
    subprocess.run([sys.executable, str(ROOT / "data" / "make_sample.py")], check=True)
    codes = Path(data.codes)
    if list(codes.glob("manifest*.jsonl")) and not (codes / "failures.jsonl").read_text().strip():
        return
    cmd = [sys.executable, "-m", "lwm.vision.tokenize", str(ROOT / "data" / "sample" / "videos"), "--out", str(codes),
           "--tokenizer", "tiny", "--ids", "stem"]
    cmd += ["--fps", str(data.fps)] if data.fps else ["--max-frames", str(data.max_frames or 8)]
    if data.vqgan_checkpoint and Path(data.vqgan_checkpoint).exists():
        cmd += ["--checkpoint", data.vqgan_checkpoint]
    else:
        print(f"note: {data.vqgan_checkpoint} not found; the sample videos are tokenized by a random-weight VQGAN")
    subprocess.run(cmd, check=True)
