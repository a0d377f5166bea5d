"""The VQGAN training run's configuration: conf/vqgan.yaml (composed by Hydra) -> typed dataclasses.

    conf/vqgan.yaml             data:, trainer:, out_dir, export, report; defaults: vision=tiny
    conf/vision/<name>.yaml     preset: (a VQGANConfig preset), model: (overrides of its fields),
                                train: (VQGANTrainConfig, with gan:)

`from_hydra(cfg)` builds one dataclass per part; train_vqgan.py hands each component only its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

from lwm.vision.frames import FramesConfig
from lwm.vision.train_config import VQGANTrainConfig
from lwm.vision.vqgan_config import VQGANConfig

PRECISIONS = ("32-true", "bf16-mixed")


@dataclass
class TrainerConfig:
    max_minutes: float = 10.0  # wall-clock limit of fit() (validation included); <= 0 is an error, use max_steps
    max_steps: int = -1  # -1: until max_minutes
    log_every: int = 25  # steps between logger writes
    val_every: int = 250  # training steps between validations (one more runs after fit)
    precision: str = "32-true"
    threads: int = 2  # torch.set_num_threads
    seed: int = 0
    progress_bar: bool = False

    def __post_init__(self) -> None:
        if not self.max_minutes > 0:
            raise ValueError(f"TrainerConfig.max_minutes must be > 0, got {self.max_minutes}")
        if (
            isinstance(self.max_steps, bool)
            or not isinstance(self.max_steps, int)
            or (self.max_steps < 1 and self.max_steps != -1)
        ):
            raise ValueError(
                f"TrainerConfig.max_steps must be a positive integer or -1 (no limit), got {self.max_steps!r}"
            )
        for name in ("log_every", "val_every", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainerConfig.{name} must be a positive integer, got {value!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainerConfig.precision must be one of {list(PRECISIONS)}, got {self.precision!r}")


class RunConfigs(NamedTuple):
    preset: str
    model: VQGANConfig
    train: VQGANTrainConfig
    data: FramesConfig
    trainer: TrainerConfig
    out_dir: str
    export: str | None  # also save the final weights here (.safetensors; the config as .json beside it)
    report: bool  # write the run's numbers to docs/benchmarks.md (section vqgan-train)


def _build(cls, values: Any, where: str):
    """cls(**values) with unknown keys named in the error."""
    values = dict(values or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} for {cls.__name__}; expected some of {sorted(known)}")
    return cls(**values)


def from_hydra(cfg) -> RunConfigs:
    """A composed conf/vqgan.yaml (DictConfig or plain dict) -> the run's dataclasses."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    for key in ("vision", "data", "trainer", "out_dir"):
        if key not in cfg:
            raise ValueError(f"the VQGAN training config has no {key!r} (keys: {sorted(cfg)}); compose conf/vqgan.yaml")
    vision = cfg["vision"]
    if "preset" not in vision:
        raise ValueError(f"vision: needs a 'preset' (one of the VQGANConfig presets), got keys {sorted(vision)}")
    unknown = sorted(set(vision) - {"preset", "model", "train"})
    if unknown:
        raise ValueError(f"vision: unknown key(s) {unknown}; expected preset, model (overrides), train")
    overrides = dict(vision.get("model") or {})
    bad = sorted(set(overrides) - {f.name for f in dataclasses.fields(VQGANConfig)})
    if bad:
        raise ValueError(f"vision.model: unknown VQGANConfig field(s) {bad}")
    model = VQGANConfig.from_preset(vision["preset"], **overrides)
    train = _build(VQGANTrainConfig, vision.get("train"), "vision.train")
    if train.crop and (train.crop > model.resolution or train.crop % model.downsample):
        raise ValueError(
            f"vision.train.crop {train.crop} must be at most the resolution {model.resolution} and a multiple of the "
            f"VQGAN's downsampling {model.downsample} (so crops keep the code grid), or 0 for whole frames"
        )
    return RunConfigs(
        preset=vision["preset"],
        model=model,
        train=train,
        data=_build(FramesConfig, cfg["data"], "data"),
        trainer=_build(TrainerConfig, cfg["trainer"], "trainer"),
        out_dir=str(cfg["out_dir"]),
        export=cfg.get("export"),
        report=bool(cfg.get("report", False)),
    )
