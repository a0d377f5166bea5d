"""Typed configs of a training run. Hydra composes the YAML in conf/; train.py turns each group
into its dataclass here and hands each component only its own part."""

from __future__ import annotations

from dataclasses import dataclass, field

from lwm.configs import from_dict
from lwm.parallel.layout import LAYOUTS
from lwm.train.lr import SCHEDULES


@dataclass
class StageConfig:
    name: str
    seq_len: int
    rope_theta: float
    steps: int
    lr: float
    cp: int = 1  # context-parallel degree of this stage
    batch_size: int = 1  # sequences per data-parallel rank per step (ignored when global_batch is set)
    global_batch: int | None = None  # sequences per step over all data-parallel ranks
    warmup_steps: int = 0
    schedule: str = "constant"  # constant | cosine (to min_lr_ratio * lr)
    min_lr_ratio: float = 0.1
    sources: list[str] | None = None  # names of data sources for this stage (None: all)

    def __post_init__(self) -> None:
        for name in ("seq_len", "steps", "cp", "batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"stage {self.name!r}: {name} must be positive, got {getattr(self, name)}")
        if self.lr <= 0 or self.rope_theta <= 0:
            raise ValueError(f"stage {self.name!r}: lr {self.lr} and rope_theta {self.rope_theta} must be positive")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"stage {self.name!r}: schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.global_batch is not None and self.global_batch <= 0:
            raise ValueError(f"stage {self.name!r}: global_batch must be positive, got {self.global_batch}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(
                f"stage {self.name!r}: warmup_steps {self.warmup_steps} must lie in [0, steps {self.steps}]"
            )

    def per_rank_batch(self, dp: int) -> int:
        if self.global_batch is None:
            return self.batch_size
        if self.global_batch % dp:
            raise ValueError(f"stage {self.name!r}: global_batch {self.global_batch} is not divisible by dp {dp}")
        return self.global_batch // dp

    def check_world(self, world_size: int) -> int:
        """dp for this stage; raises with the values when the world cannot be split."""
        if world_size % self.cp:
            raise ValueError(f"stage {self.name!r}: world size {world_size} is not divisible by cp {self.cp}")
        return world_size // self.cp


@dataclass
class ScheduleConfig:
    name: str
    stages: list[StageConfig] = field(default_factory=list)
    init_hf: str | None = None  # a Hugging Face LLaMA folder for the first stage (vocabulary extended)

    def __post_init__(self) -> None:
        self.stages = [from_dict(StageConfig, s, f"schedule.stages[{i}]") for i, s in enumerate(self.stages)]
        if not self.stages:
            raise ValueError(f"schedule {self.name!r} has no stages")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"schedule {self.name!r} has repeated stage names {names}")


@dataclass
class ParallelConfig:
    """How context parallelism is done; its degree is each stage's cp, and dp is derived
    (world size / cp), so neither is set here."""

    layout: str = "striped"
    mode: str = "ring"  # ring | ulysses
    activation_checkpointing: bool = False  # recompute each block in backward
    document_mask: bool = True  # packed examples attend only within themselves (segment ids)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"parallel.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.mode not in ("ring", "ulysses"):
            raise ValueError(f"parallel.mode must be 'ring' or 'ulysses', got {self.mode!r}")


@dataclass
class OptimConfig:
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0  # max total gradient 2-norm; None or 0: no clipping
    text_weight: float = 0.5  # loss = weighted means of text and vision targets (lwm.model.loss)
    vision_weight: float = 0.5

    def __post_init__(self) -> None:
        if self.grad_clip is not None and self.grad_clip < 0:
            raise ValueError(f"optim.grad_clip must be >= 0 (0 or null: no clipping), got {self.grad_clip}")


PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "64-true")  # Lightning's names


@dataclass
class TrainerBase:
    """The Lightning Trainer settings every training run has: train.py's stages (TrainerConfig) and
    train_vqgan.py's VQGAN (lwm.train.vqgan.run_config.VQGANTrainerConfig)."""

    accelerator: str = "cpu"  # Lightning's: cpu | gpu | auto (gpu when there is one)
    precision: str = "32-true"
    log_every: int = 5  # steps between logger writes
    val_every: int = 0  # steps between validations
    seed: int = 0

    def __post_init__(self) -> None:
        if self.log_every < 1 or self.val_every < 0:
            raise ValueError(
                f"trainer.log_every must be >= 1 and trainer.val_every >= 0, got {self.log_every}, {self.val_every}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(f"trainer.precision must be one of {PRECISIONS}, got {self.precision!r}")


@dataclass
class TrainerConfig(TrainerBase):
    devices: int = 1
    num_nodes: int = 1
    out_dir: str = "runs/latest"
    val_every: int = 0  # steps between validation losses on data.holdout; 0: at the end of each stage
    checkpoint_every: int = 0  # steps between checkpoints (checkpoints/last.ckpt); 0 = only when a stage stops early
    keep_checkpoints: bool = False  # keep last.ckpt (optimizer included, saved at the end) once a stage is finished
    timeout_s: int = 600  # a rank that dies makes the others fail within this many seconds
    peak_tflops: float = 0.0  # for MFU in the throughput log; 0 = not logged

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("devices", "num_nodes", "timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint_every < 0 or self.peak_tflops < 0:
            raise ValueError(
                f"trainer.checkpoint_every (0: only when a stage stops early) and trainer.peak_tflops must be "
                f">= 0, got {self.checkpoint_every}, {self.peak_tflops}"
            )

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes
