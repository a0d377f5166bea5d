"""The VQGAN training run's configuration: conf/vqgan.yaml (composed by Hydra) -> typed dataclasses.

    conf/vqgan.yaml             data: (FramesConfig), trainer: (VQGANTrainerConfig), out_dir, export,
                                report; defaults: vision=tiny
    conf/vision/<name>.yaml     preset: (a VQGANConfig preset), model: (its fields, each one overriding the preset's),
                                train: (VQGANTrainConfig, with gan:)

`from_hydra(cfg)` builds one dataclass per part with lwm.configs.from_dict (unknown keys and wrong
types are errors naming the key); train_vqgan.py hands each component only its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from lwm.configs import from_dict
from lwm.core.config import TrainerBase
from lwm.vision.vqgan_config import VQGANConfig
from lwm.vqgan_training.config import VQGANTrainConfig
from lwm.vqgan_training.frames import FramesConfig

PRECISIONS = ("32-true", "bf16-mixed")


@dataclass
class VQGANTrainerConfig(TrainerBase):
    accelerator: str = "auto"  # one device: the GPU when there is one
    max_minutes: float = 10.0  # wall-clock limit of fit() (validation included); <= 0 is an error, use max_steps
    max_steps: int = -1  # -1: until max_minutes
    log_every: int = 25  # steps between logger writes
    val_every: int = 250  # training steps between validations (one more runs after fit)
    threads: int = 2  # torch.set_num_threads
    progress_bar: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.max_minutes > 0:
            raise ValueError(f"trainer.max_minutes must be > 0, got {self.max_minutes}")
        if self.max_steps < 1 and self.max_steps != -1:
            raise ValueError(f"trainer.max_steps must be a positive integer or -1 (no limit), got {self.max_steps!r}")
        for name in ("val_every", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"trainer.precision must be one of {list(PRECISIONS)}, got {self.precision!r}")


class VQGANRunConfig(NamedTuple):
    preset: str
    model: VQGANConfig
    train: VQGANTrainConfig
    data: FramesConfig
    trainer: VQGANTrainerConfig
    out_dir: str
    export: str | None  # also save the final weights here (.safetensors; the config as .json beside it)
    report: bool  # write the run's numbers to docs/benchmarks.md (section vqgan-train)


def from_hydra(cfg) -> VQGANRunConfig:
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
    preset = dataclasses.asdict(VQGANConfig.from_preset(vision["preset"]))
    model = from_dict(VQGANConfig, {**preset, **(vision.get("model") or {})}, "vision.model")
    train = from_dict(VQGANTrainConfig, vision.get("train"), "vision.train")
    if train.crop and (train.crop > model.resolution or train.crop % model.downsample):
        raise ValueError(
            f"vision.train.crop {train.crop} must be at most the resolution {model.resolution} and a multiple of the "
            f"VQGAN's downsampling {model.downsample} (so crops keep the code grid), or 0 for whole frames"
        )
    return VQGANRunConfig(
        preset=vision["preset"],
        model=model,
        train=train,
        data=from_dict(FramesConfig, cfg["data"], "data"),
        trainer=from_dict(VQGANTrainerConfig, cfg["trainer"], "trainer"),
        out_dir=str(cfg["out_dir"]),
        export=cfg.get("export"),
        report=bool(cfg.get("report", False)),
    )
