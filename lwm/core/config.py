"""Typed configs of a training run. Hydra composes the YAML in conf/; to_run_config turns each group
into its dataclass here, resolve_stage what a stage needs, and each component gets only its own part."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lwm.configs import from_dict
from lwm.core.lr import SCHEDULES
from lwm.core.run_id import register_resolver
from lwm.data import DataConfig, Source, TextTokenizer, Vocab
from lwm.data.batches import StreamOptions
from lwm.data.sources import FORMATS, source_format
from lwm.disk.writes import FolderRefused, check_output_folder
from lwm.eval.needle import NeedleGrid, check_options
from lwm.interop.hf import start_config
from lwm.model import ModelConfig
from lwm.parallel.dims import ParallelDims
from lwm.parallel.flash_impl import KERNELS
from lwm.parallel.kept import kept_count
from lwm.parallel.layout import LAYOUTS
from lwm.ranks import say

FLOAT32_MAX = 3.4028234663852886e38  # the largest float32: AdamW's arithmetic on the parameters


register_resolver()  # ${run_id:} in trainer.out_dir: one folder name shared by every rank


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
        # lr 0: steps that change no weight (a check of a start); `not` below refuses nan too; AdamW
        # multiplies in the parameters' float32, where an lr past its range is no number
        if not (math.isfinite(self.lr) and 0 <= self.lr <= FLOAT32_MAX):
            raise ValueError(
                f"stage {self.name!r}: lr must be a finite number >= 0 within float32's range, got {self.lr}"
            )
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ValueError(f"stage {self.name!r}: rope_theta must be a finite number > 0, got {self.rope_theta}")
        if not 0 <= self.min_lr_ratio <= 1:  # the cosine's floor, a share of lr
            raise ValueError(f"stage {self.name!r}: min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
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
    """How the ranks split the work (lwm.parallel.dims). The context-parallel degree is each stage's
    cp; dp is derived (world size / (cp x tp)), so neither is set here."""

    layout: str = "striped"
    mode: str = "ring"  # ring | ulysses | hybrid (Ulysses inside groups of `ulysses`, ring across)
    ulysses: int = 1  # hybrid's all-to-all size (divides each stage's cp)
    tp: int = 1  # tensor-parallel degree (divides the q and kv heads)
    activation_checkpointing: bool = False  # recompute each block in backward
    # ... but not its attention: each block keeps its attention output and logsumexp (lwm.parallel.kept)
    keep_attention: bool = False
    # ... in the first this many blocks only (null: every block): the kept outputs' memory for the time saved
    keep_attention_blocks: int | None = None
    # move each checkpointed block's input to host memory between forward and backward
    activation_offload: bool = False
    # parameter shards, gradients and AdamW state in host memory (FSDP2's CPUOffloadPolicy): AdamW
    # steps on the CPU; one CPU process holds the plain model in host memory already
    param_offload: bool = False
    document_mask: bool = True  # packed examples attend only within themselves (segment ids)
    # which FlashAttention serves the flash kernels on a GPU: auto | fa2 | fa3 | fa4 (lwm.parallel.flash_impl)
    attention_kernel: str = "auto"
    # torch.compile each block's norms, SwiGLU and RoPE; the attention stays eager (lwm.parallel.apply_compile)
    compile_blocks: bool = False

    def kept_blocks(self, n_layers: int) -> int:
        """How many of the model's n_layers blocks keep their attention (the first ones)."""
        blocks = self.keep_attention if self.keep_attention_blocks is None else self.keep_attention_blocks
        try:
            return kept_count(blocks, n_layers)
        except ValueError:
            raise ValueError(
                f"parallel.keep_attention_blocks={self.keep_attention_blocks}: the model has {n_layers} blocks"
            ) from None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"parallel.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.attention_kernel not in KERNELS:
            raise ValueError(f"parallel.attention_kernel must be one of {list(KERNELS)}, got {self.attention_kernel!r}")
        if self.keep_attention and not self.activation_checkpointing:
            raise ValueError(
                "parallel.keep_attention=true needs parallel.activation_checkpointing=true: it keeps the attention "
                "of checkpointed blocks (got activation_checkpointing=false)"
            )
        if self.keep_attention_blocks is not None and (not self.keep_attention or self.keep_attention_blocks < 1):
            raise ValueError(
                f"parallel.keep_attention_blocks={self.keep_attention_blocks} needs parallel.keep_attention=true and "
                "a number of blocks of at least 1 (null: every block)"
            )
        if self.activation_offload and not self.activation_checkpointing:
            raise ValueError(
                "parallel.activation_offload=true needs parallel.activation_checkpointing=true: offload moves "
                "the checkpointed blocks' inputs (got activation_checkpointing=false)"
            )
        # mode, ulysses and tp on their own (the stage's cp and the world are checked in resolve_stage)
        ParallelDims(1, self.ulysses if self.mode == "hybrid" else 1, self.tp, self.mode, self.ulysses)

    def dims(self, world: int, cp: int) -> ParallelDims:
        """The run's ParallelDims at a stage's cp, dp derived; raises naming the values. A stage of
        cp 1 has no context parallelism to arrange (a schedule's short stages under hybrid)."""
        if cp == 1:
            return ParallelDims.from_world(world, 1, self.tp)
        return ParallelDims.from_world(world, cp, self.tp, self.mode, self.ulysses)


@dataclass
class OptimConfig:
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0  # max total gradient 2-norm; None or 0: no clipping
    text_weight: float = 0.5  # loss = weighted means of text and vision targets (lwm.model.loss)
    vision_weight: float = 0.5
    # steps of a stage whose loss or gradient norm is not finite that are skipped (no update) before
    # the run stops; 0: it stops at the first
    max_nonfinite_steps: int = 0

    def __post_init__(self) -> None:
        if self.max_nonfinite_steps < 0:
            raise ValueError(
                f"optim.max_nonfinite_steps must be >= 0 (0: stop at the first), got {self.max_nonfinite_steps}"
            )
        if self.grad_clip is not None and not (math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            raise ValueError(f"optim.grad_clip must be >= 0 and finite (0 or null: no clipping), got {self.grad_clip}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"optim.weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):  # AdamW's moment decays
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {list(self.betas)}")
        weights = {"text_weight": self.text_weight, "vision_weight": self.vision_weight}
        for name, value in weights.items():
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"optim.{name} must be a finite number >= 0, got {value}")
        if not any(weights.values()):  # a loss of 0 at every step: nothing trains
            raise ValueError(
                f"optim.text_weight and optim.vision_weight are both 0: at least one must be > 0 "
                f"(got {self.text_weight}, {self.vision_weight})"
            )


MAX_SEED = 2**32 - 1  # what seed_everything (numpy's generator) takes
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "64-true")  # Lightning's names


@dataclass
class TrainerBase:
    """The Lightning Trainer settings every training run has: train.py's stages (TrainerConfig) and
    train_vqgan.py's VQGAN (lwm.vqgan_training.config.VQGANTrainerConfig)."""

    accelerator: str = "cpu"  # Lightning's: cpu | gpu | auto (gpu when there is one)
    precision: str = "32-true"
    log_every: int = 5  # steps between logger writes
    val_every: int = 0  # steps between validations
    seed: int = 0
    # floats too small to be normal computed as zero on the CPU (lwm.core.numerics): late in training they
    # otherwise make a CPU step up to twice as slow; false keeps IEEE's gradual underflow
    flush_denormal: bool = True

    def __post_init__(self) -> None:
        if self.log_every < 1 or self.val_every < 0:
            raise ValueError(
                f"trainer.log_every must be >= 1 and trainer.val_every >= 0, got {self.log_every}, {self.val_every}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(f"trainer.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"trainer.seed must lie in [0, {MAX_SEED}], got {self.seed}")


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
    preflight: bool | None = None  # plan each stage before it allocates, stop if it will not fit; None: on GPUs only
    overwrite: bool = False  # out_dir holds another run (another config): remove its files and start over

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("devices", "num_nodes", "timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint_every < 0 or not (math.isfinite(self.peak_tflops) and self.peak_tflops >= 0):
            raise ValueError(
                f"trainer.checkpoint_every (0: only when a stage stops early) and trainer.peak_tflops must be "
                f">= 0, got {self.checkpoint_every}, {self.peak_tflops}"
            )

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes


@dataclass
class ProbeConfig:
    path: str | None = None  # JSON lines of held-out examples; None: no probe
    examples: int = 100  # the first this many examples of the file

    def __post_init__(self) -> None:
        if self.examples <= 0:
            raise ValueError(f"probe.examples must be positive, got {self.examples}")


@dataclass
class DataSpec(StreamOptions):
    """conf/data: the stream's options, the named sources a stage picks from, and the sample data."""

    sources: dict[str, Source] = field(default_factory=dict)
    sample: bool = False  # make data/sample and tokenize its videos on first use
    vqgan_checkpoint: str | None = None  # sample only: the VQGAN that tokenizes the sample videos
    positions: str | None = None  # sequence | document (RoPE restarts per example); None: document when masked

    def vocab_rows(self) -> int | None:
        """The embedding rows the tokenizer's vocabulary layout makes; None while it does not exist (a
        sentencepiece model, a tokenizer.json, or a model folder holding either: lwm.data.TextTokenizer)."""
        if not Path(self.tokenizer).exists():
            return None
        return Vocab(TextTokenizer(self.tokenizer).vocab_size).size

    def for_stage(self, stage: StageConfig, batch_size: int, document_mask: bool = True) -> DataConfig:
        names = stage.sources or list(self.sources)
        unknown = [n for n in names if n not in self.sources]
        if unknown:
            raise ValueError(f"stage {stage.name!r} names data sources {unknown}; conf/data has {sorted(self.sources)}")
        shared = {f.name: getattr(self, f.name) for f in fields(StreamOptions)}
        return DataConfig(
            **shared,
            sources=[self.sources[n] for n in names],
            batch_size=batch_size,
            positions=self.positions or ("document" if document_mask else "sequence"),
        )


@dataclass
class RunConfig:
    model: ModelConfig
    data: DataSpec
    parallel: ParallelConfig
    schedule: ScheduleConfig
    trainer: TrainerConfig
    optim: OptimConfig
    stage_only: str | None = None
    resume: bool = False
    export: bool = True
    stop_at_step: int | None = None  # stop a stage early (a job's time limit; tests of resume)
    probe: ProbeConfig = field(default_factory=ProbeConfig)  # held-out answers scored at each stage's start and end
    evaluate: NeedleGrid = field(default_factory=NeedleGrid)  # a needle grid after the last stage (conf/train.yaml)


def validate(cfg: RunConfig) -> None:
    """Everything that can be checked before any process starts, with the values in the message."""
    if cfg.stop_at_step is not None and cfg.stop_at_step < 1:
        raise ValueError(f"stop_at_step must be >= 1 (null: run each stage to its end), got {cfg.stop_at_step}")
    if Path(cfg.trainer.out_dir).exists() and not Path(cfg.trainer.out_dir).is_dir():
        raise ValueError(f"trainer.out_dir {cfg.trainer.out_dir} is a file; name a folder for the run")
    names = [s.name for s in cfg.schedule.stages]
    if cfg.stage_only is not None and cfg.stage_only not in names:
        raise ValueError(f"stage_only {cfg.stage_only!r} is not a stage of schedule {cfg.schedule.name!r}: {names}")

    cfg.parallel.kept_blocks(cfg.model.n_layers)
    for stage in cfg.schedule.stages:
        resolve_stage(cfg, stage)
    if cfg.schedule.init_hf is not None:  # cfg.model is the folder's (start_model)
        rows = cfg.data.vocab_rows()
        if rows is not None and rows != cfg.model.vocab_size:
            raise ValueError(
                f"schedule.init_hf: {cfg.schedule.init_hf} starts a model of {cfg.model.vocab_size} vocabulary rows, "
                f"but data.tokenizer {cfg.data.tokenizer} makes {rows}: train with the folder's own tokenizer "
                f"(data.tokenizer={cfg.schedule.init_hf})"
            )
    if cfg.export:  # the run's own export (out_dir/hf), refused now rather than after the training
        try:
            check_output_folder(Path(cfg.trainer.out_dir) / "hf", inside=cfg.trainer.out_dir)
        except FolderRefused as e:
            raise FolderRefused(f"export=true: {e} (or export=false)") from None
    if cfg.resume and not Path(cfg.trainer.out_dir).is_dir():
        raise FileNotFoundError(
            f"resume=true: trainer.out_dir {cfg.trainer.out_dir} does not exist; "
            "name the folder of the run to continue (trainer.out_dir=runs/X resume=true)"
        )
    if cfg.probe.path is not None and not Path(cfg.probe.path).is_file():
        raise FileNotFoundError(f"probe.path {cfg.probe.path} does not exist")
    if not cfg.data.sample:  # the sample data (and its needle sets) is made on first use, then checked
        check_files(cfg)


# What a run decides about a model it starts from a checkpoint: memory settings (the checkpoint says
# nothing of them); each stage's rope_theta and max_seq_len come from the schedule (stage_model_config).
RUN_MODEL_FIELDS = ("mlp_chunk_size", "attn_head_groups", "norm_chunk_size", "loss_chunk_size")
STAGE_MODEL_FIELDS = ("rope_theta", "max_seq_len")


def start_model(run_model: ModelConfig, folder, explicit: Collection[str] = ()) -> ModelConfig:
    """The model a run trains from the Hugging Face `folder` (schedule.init_hf): what the checkpoint
    fixes (shapes, vocabulary, bias, norms, tying, RoPE) from it, the run's RUN_MODEL_FIELDS from
    `run_model`. `explicit`: the model fields the command set (model.<field>=...); one that contradicts
    the checkpoint is refused naming both values, before anything is written."""
    try:
        start, _ = start_config(folder)  # its config and weights' shapes, before anything is built
    except (FileNotFoundError, ValueError) as e:
        raise type(e)(f"schedule.init_hf: {e}") from None
    fixed = [f.name for f in fields(ModelConfig) if f.name not in RUN_MODEL_FIELDS + STAGE_MODEL_FIELDS]
    clash = [
        f"model.{name}={getattr(run_model, name)!r} (the checkpoint's is {getattr(start, name)!r})"
        for name in fixed
        if name in explicit and getattr(run_model, name) != getattr(start, name)
    ]
    if clash:
        raise ValueError(
            f"schedule.init_hf: {folder} fixes what the command overrides: {', '.join(clash)}; drop the override "
            "or start from another folder"
        )
    return start.replace(**{name: getattr(run_model, name) for name in RUN_MODEL_FIELDS})


@dataclass(frozen=True)
class StageSetup:
    """Everything one stage of a run trains with, resolved once from the run config (resolve_stage): what
    the run, its Trainer, the module and the datamodule read, none of them deriving it again."""

    stage: StageConfig
    model: ModelConfig  # the stage's: its RoPE theta, a max_seq_len covering its sequences (stage_model_config)
    dims: ParallelDims  # on the run's world, checked against the model and the stage's length
    per_rank_batch: int  # sequences a data-parallel rank takes a step
    data: DataConfig  # the stage's sources at per_rank_batch, positions as the document mask says

    @property
    def global_batch(self) -> int:
        return self.per_rank_batch * self.dims.dp


def resolve_stage(cfg: RunConfig, stage: StageConfig) -> StageSetup:
    """The stage's StageSetup; raises naming the stage and the values (validate resolves every stage before
    any process starts; run_stage resolves its stage once, as it begins)."""
    try:
        dims = cfg.parallel.dims(cfg.trainer.world_size, stage.cp)
        dims.check_model(cfg.model.n_heads, cfg.model.n_kv_heads, cfg.model.attn_head_groups)
        dims.check_seq(stage.seq_len, cfg.parallel.layout)
    except ValueError as e:
        raise ValueError(f"stage {stage.name!r} (seq_len {stage.seq_len}, cp {stage.cp}): {e}") from None
    batch = stage.per_rank_batch(dims.dp)
    data = cfg.data.for_stage(stage, batch, cfg.parallel.document_mask)
    return StageSetup(stage, stage_model_config(cfg.model, stage), dims, batch, data)


def check_files(cfg: RunConfig) -> None:
    """The data files and the evaluation's haystack exist."""
    check_data_files(cfg.data)
    if (
        cfg.evaluate.lengths is not None
        and cfg.evaluate.haystack is not None
        and not Path(cfg.evaluate.haystack).is_file()
    ):
        raise FileNotFoundError(f"evaluate.haystack {cfg.evaluate.haystack} does not exist")


def check_data_files(data: DataSpec) -> None:
    if not Path(data.tokenizer).exists():
        raise FileNotFoundError(f"data.tokenizer {data.tokenizer} does not exist")
    if data.codes is not None and not list(Path(data.codes).glob("manifest*.jsonl")):
        raise FileNotFoundError(f"data.codes {data.codes} has no manifest*.jsonl; run lwm-tokenize into it first")
    if data.index_dir is not None:  # the sources' indexes are kept there
        folder = Path(data.index_dir)
        existing = next(p for p in [folder, *folder.parents] if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK):
            raise ValueError(f"data.index_dir {folder} cannot be written: {existing} is not a writable folder")
    for name, source in data.sources.items():
        if not Path(source.path).is_file():
            raise FileNotFoundError(f"data.sources.{name}.path {source.path} does not exist")
        try:
            source_format(source.path)
        except ValueError:
            raise ValueError(f"data.sources.{name}.path {source.path}: expected {FORMATS}") from None


def stage_model_config(model_config: ModelConfig, stage: StageConfig) -> ModelConfig:
    """The model of a stage: its RoPE theta, and a max_seq_len that covers its sequences. The stage's
    theta replaces the base theta; a Llama-3 rope_scaling stays as it is and applies to the new
    theta's frequencies (its original_max_seq_len is the pretrained context, which a stage does not
    change), as transformers computes a "llama3" config with that rope_theta, so an export of the
    stage loads with the angles it trained with."""
    return model_config.replace(rope_theta=stage.rope_theta, max_seq_len=max(model_config.max_seq_len, stage.seq_len))


EXAMPLES = {"data.tokenizer": "path/to/tokenizer.model", "data.sources": "'{docs: {path: docs.jsonl}}'"}


def to_run_config(cfg: DictConfig, overrides: Sequence[str] = ()) -> RunConfig:
    """Each group becomes its dataclass; unknown keys are errors that name them. With schedule.init_hf
    the model is the folder's with the run's memory settings (start_model), checked
    against the model fields `overrides` (the command line's) set."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ValueError(
            f"{', '.join(missing)} must be given (no default), e.g. "
            + " ".join(f"{k}={EXAMPLES.get(k, '...')}" for k in missing)
        )
    c = OmegaConf.to_container(cfg, resolve=True)
    data = from_dict(DataSpec, c["data"], "data")
    model = from_dict(ModelConfig, c["model"], "model")
    init_hf = (c.get("schedule") or {}).get("init_hf")
    if init_hf is not None:  # its rows are the folder's; validate checks the data's tokenizer makes them
        model = start_model(model, init_hf, model_fields(overrides))
    elif (rows := data.vocab_rows()) is not None and rows != model.vocab_size:  # the vocabulary layout's rows
        say(f"note: model.vocab_size {model.vocab_size} set to {rows} for {data.tokenizer}")
        model = model.replace(vocab_size=rows)
    run = {k: v for k, v in c.items() if k not in ("model", "data")}
    run = from_dict(RunConfig, {**run, "model": model, "data": data})
    try:
        check_options(run.evaluate)
    except ValueError as err:
        raise ValueError(f"evaluate.{err}") from None
    return run


def model_fields(overrides: Sequence[str]) -> set[str]:
    """The model fields a command line sets: model.dim=... (+model.x=, ++model.x=), not model=<preset>."""
    return {m.group(1) for o in overrides if (m := re.match(r"^\+{0,2}model\.(\w+)=", o))}
