"""VQGAN training hyperparameters: the `train:` node of a conf/vision/*.yaml, as a dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field

from lwm.configs import from_dict
from lwm.core.lr import SCHEDULES
from lwm.vqgan_training.discriminator import GANConfig


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
