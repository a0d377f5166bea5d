"""The VQGAN training run's configuration: conf/vqgan.yaml (composed by Hydra) -> typed dataclasses.

    conf/vqgan.yaml             data: (FramesConfig), trainer: (VQGANTrainerConfig), out_dir, export,
                                report; defaults: vision=tiny
    conf/vision/<name>.yaml     preset: (a VQGANConfig preset), model: (its fields, each one overriding the preset's),
                                train: (VQGANTrainConfig: the training's hyperparameters, with gan:)

`from_hydra(cfg)` builds one dataclass per part with lwm.configs.from_dict (unknown keys and wrong
types are errors naming the key); train_vqgan.py hands each component only its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

from lwm.configs import from_dict
from lwm.core.config import TrainerBase
from lwm.core.lr import SCHEDULES
from lwm.vision.vqgan_config import VQGANConfig
from lwm.vqgan_training.discriminator import GANConfig
from lwm.vqgan_training.frames import FramesConfig

PRECISIONS = ("32-true", "bf16-mixed")


@dataclass
class VQGANTrainConfig:
    batch_size: int = 16
    # Train on random crop x crop windows of the frames (0: whole frames); validation uses whole frames.
    # The VQGAN is convolutional: a 32x32 crop costs a quarter of a 64x64 frame and teaches the same patches.
    crop: int = 0
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0  # AdamW; 0 = Adam
    lr_schedule: str = "constant"  # or "cosine": to lr * min_lr_ratio at trainer.max_steps or max_time
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    # Reconstruction loss: l1_weight * |x - x^| + l2_weight * (x - x^)^2, means over pixels.
    l1_weight: float = 1.0
    l2_weight: float = 0.0
    beta: float = 0.25  # commitment weight (VQ-VAE)
    ema_decay: float = 0.0  # 0: the codebook learns by gradient (codebook loss); in (0, 1): EMA updates
    usage_window: int = 100  # steps over which training usage/perplexity are counted and dead codes found
    restart_every: int = 50  # restart codes unused over the window every this many steps (0: never)
    restart_until: int = -1  # last step with restarts (-1: to the end), so the codes can settle
    grid_frames: int = 8  # frames in the validation reconstruction grid
    gan: GANConfig = field(default_factory=GANConfig)

    def __post_init__(self) -> None:
        self.gan = from_dict(GANConfig, self.gan, "VQGANTrainConfig.gan")
        self.betas = tuple(self.betas)
        for name in ("batch_size", "usage_window", "grid_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"VQGANTrainConfig.{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("crop", "warmup_steps", "restart_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"VQGANTrainConfig.{name} must be an integer >= 0, got {getattr(self, name)!r}")
        if not self.lr > 0:
            raise ValueError(f"VQGANTrainConfig.lr must be > 0, got {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"VQGANTrainConfig.betas must be two numbers in [0, 1), got {list(self.betas)}")
        if self.lr_schedule not in SCHEDULES:
            raise ValueError(f"VQGANTrainConfig.lr_schedule must be one of {list(SCHEDULES)}, got {self.lr_schedule!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"VQGANTrainConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.l1_weight < 0 or self.l2_weight < 0 or self.l1_weight + self.l2_weight == 0:
            raise ValueError(
                f"reconstruction weights must be >= 0 and not both 0, got l1_weight {self.l1_weight}, l2_weight {self.l2_weight}"
            )
        if self.beta < 0 or self.weight_decay < 0:
            raise ValueError(
                f"beta and weight_decay must be >= 0, got beta {self.beta}, weight_decay {self.weight_decay}"
            )
        if not 0 <= self.ema_decay < 1:
            raise ValueError(
                f"VQGANTrainConfig.ema_decay must be in [0, 1) (0: gradient codebook), got {self.ema_decay}"
            )
        if self.restart_until < -1:
            raise ValueError(
                f"VQGANTrainConfig.restart_until must be a step >= 0 or -1 (to the end), got {self.restart_until}"
            )


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
