"""Running a schedule: stage after stage, each from the previous stage's final weights.

out_dir/
  <stage>/checkpoints/   Lightning checkpoints (sharded when distributed): model, optimizer,
                         LR schedule, loop and data position; last.ckpt resumes the stage
  <stage>/logs/          CSV metrics;  <stage>/tb/  TensorBoard
  <stage>/final.safetensors   the stage's final weights (the next stage starts from them)
  hf/                    the last stage exported as a Hugging Face LLaMA folder
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Callable

import lightning as L
import torch
import torch.distributed as dist

from lwm.data import DataConfig, Source
from lwm.data.batches import StreamOptions
from lwm.data.vocab import Vocab
from lwm.eval.needle import NeedleGrid
from lwm.interop.hf import config_from_hf, from_hf
from lwm.interop.hf_files import read_hf_config
from lwm.model import ModelConfig
from lwm.parallel.layout import check_divisible
from lwm.ranks import is_rank0
from lwm.train.callbacks import KEPT_METRICS, MetricHistory, PeakMemory, StageCheckpoint, StageProgress, Throughput
from lwm.train.checkpointing import AtomicCheckpointIO, AtomicModelParallelStrategy, recover
from lwm.train.config import OptimConfig, ParallelConfig, ScheduleConfig, StageConfig, TrainerConfig
from lwm.train.console import say
from lwm.train.datamodule import LWMDataModule
from lwm.train.evaluate import evaluate_needles
from lwm.train.export import codes_vqgan, export_weights
from lwm.train.module import LWMModule
from lwm.train.probe import AnswerProbe, ProbeConfig
from lwm.train.requeue import StopOnSignal
from lwm.weights import read_weights, save_weights


@dataclass
class DataSpec(StreamOptions):
    """conf/data: the stream's options, the named sources a stage picks from, and the sample data."""

    sources: dict[str, Source] = field(default_factory=dict)
    sample: bool = False  # make data/sample and tokenize its videos on first use
    vqgan_checkpoint: str | None = None  # sample only: the VQGAN that tokenizes the sample videos
    positions: str | None = None  # sequence | document (RoPE restarts per example); None: document when masked

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
    world = cfg.trainer.world_size
    if cfg.stop_at_step is not None and cfg.stop_at_step < 1:
        raise ValueError(f"stop_at_step must be >= 1 (null: run each stage to its end), got {cfg.stop_at_step}")
    if Path(cfg.trainer.out_dir).exists() and not Path(cfg.trainer.out_dir).is_dir():
        raise ValueError(f"trainer.out_dir {cfg.trainer.out_dir} is a file; name a folder for the run")
    names = [s.name for s in cfg.schedule.stages]
    if cfg.stage_only is not None and cfg.stage_only not in names:
        raise ValueError(f"stage_only {cfg.stage_only!r} is not a stage of schedule {cfg.schedule.name!r}: {names}")

    for stage in cfg.schedule.stages:
        dp = stage.check_world(world)
        stage.per_rank_batch(dp)
        check_divisible(stage.seq_len, stage.cp, cfg.parallel.layout)
        cfg.data.for_stage(stage, 1)
    if cfg.schedule.init_hf is not None:
        try:
            read_hf_config(cfg.schedule.init_hf)  # its fields, before any process starts
        except (FileNotFoundError, ValueError) as e:
            raise type(e)(f"schedule.init_hf: {e}") from None
    if cfg.resume and not Path(cfg.trainer.out_dir).is_dir():
        raise FileNotFoundError(
            f"resume=true: trainer.out_dir {cfg.trainer.out_dir} does not exist; "
            "name the folder of the run to continue (trainer.out_dir=runs/X resume=true)"
        )
    if cfg.probe.path is not None and not Path(cfg.probe.path).is_file():
        raise FileNotFoundError(f"probe.path {cfg.probe.path} does not exist")
    if not cfg.data.sample:  # the sample data (and its needle sets) is made on first use, then checked
        check_files(cfg)


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
    if not Path(data.tokenizer).is_file():
        raise FileNotFoundError(f"data.tokenizer {data.tokenizer} does not exist")
    if data.codes is not None and not list(Path(data.codes).glob("manifest*.jsonl")):
        raise FileNotFoundError(f"data.codes {data.codes} has no manifest*.jsonl; run lwm-tokenize into it first")
    for name, source in data.sources.items():
        if not Path(source.path).is_file():
            raise FileNotFoundError(f"data.sources.{name}.path {source.path} does not exist")


def _strategy(stage: StageConfig, trainer_cfg: TrainerConfig):
    # On GPUs FSDP2 runs even on one device: it is what computes in bf16 on fp32 master weights
    # (lwm/train/sharding.py); one CPU process trains the plain model.
    gpu = trainer_cfg.accelerator in ("gpu", "cuda") or (
        trainer_cfg.accelerator == "auto" and torch.cuda.is_available()
    )
    if trainer_cfg.world_size == 1 and not gpu:
        return "auto"
    return AtomicModelParallelStrategy(
        data_parallel_size=trainer_cfg.world_size // stage.cp,
        tensor_parallel_size=stage.cp,
        timeout=timedelta(seconds=trainer_cfg.timeout_s),
    )


def full_state(module: LWMModule) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0 (every rank must call this under FSDP)."""
    if getattr(module, "_device_mesh", None) is None:
        return {k: v.detach().cpu() for k, v in module.model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def hf_start(folder: str | Path) -> tuple[ModelConfig, Callable[[], dict]]:
    """A Hugging Face LLaMA folder as a first stage's start: its config with the vocabulary grown
    for vision (read on every rank), and a function that reads its weights (LWMModule calls it on
    global rank 0 only)."""
    hf_config = read_hf_config(folder)  # its fields checked before transformers builds anything
    config = config_from_hf(hf_config, vocab_size=Vocab(hf_config.vocab_size).size)  # as from_hf(extend_vocab=True)
    return config, lambda: from_hf(folder, extend_vocab=True).state_dict()


def stage_weights(final: Path) -> Callable[[], dict]:
    """A stage's final weights as the next stage's start, read when called: LWMModule calls it on
    global rank 0 only (the others receive the weights by broadcast), so a node does not hold
    a full fp32 copy per rank (8 x 27 GB at 7b)."""
    return partial(read_weights, final)


def stage_model_config(model_config: ModelConfig, stage: StageConfig) -> ModelConfig:
    """The model of a stage: its RoPE theta, and a max_seq_len that covers its sequences."""
    return model_config.replace(rope_theta=stage.rope_theta, max_seq_len=max(model_config.max_seq_len, stage.seq_len))


def run_stage(cfg: RunConfig, stage: StageConfig, model_config: ModelConfig, init: Callable | None) -> Path | None:
    out = Path(cfg.trainer.out_dir) / stage.name
    final = out / "final.safetensors"
    last = out / "checkpoints" / "last.ckpt"
    recover(last)  # a sharded checkpoint a kill caught between its renames
    resume_from = last if cfg.resume and last.exists() else None
    stage_model = stage_model_config(model_config, stage)
    dp = stage.check_world(cfg.trainer.world_size)
    say(
        f"stage {stage.name}: seq_len {stage.seq_len}, rope_theta {stage.rope_theta:g}, {stage.steps} steps, "
        f"cp {stage.cp}, dp {dp}" + (f" (resuming from {resume_from})" if resume_from else "")
    )
    if is_rank0():
        out.mkdir(parents=True, exist_ok=True)
        (out / "model_config.json").write_text(json.dumps(asdict(stage_model), indent=2))
    L.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    module = LWMModule(stage_model, stage, cfg.optim, cfg.parallel, init_state=init, seed=cfg.trainer.seed)
    datamodule = LWMDataModule(
        cfg.data.for_stage(stage, stage.per_rank_batch(dp), cfg.parallel.document_mask),
        seq_len=stage.seq_len,
        cp_size=stage.cp,
        layout=cfg.parallel.layout,
    )
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    global_batch = stage.per_rank_batch(dp) * dp
    history = MetricHistory.resumed(out / "logs", keep=is_rank0()) if resume_from else MetricHistory([])
    strategy = _strategy(stage, cfg.trainer)
    trainer = L.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        num_nodes=cfg.trainer.num_nodes,
        strategy=strategy,
        plugins=[AtomicCheckpointIO()] if strategy == "auto" else None,  # the strategy writes sharded ones
        precision=cfg.trainer.precision,
        max_steps=min(stage.steps, cfg.stop_at_step or stage.steps),  # validate: >= 1 or None
        log_every_n_steps=cfg.trainer.log_every,
        logger=[
            CSVLogger(out.parent, name=stage.name, version="logs"),
            TensorBoardLogger(out.parent, name=stage.name, version="tb"),
        ],
        callbacks=[
            StageCheckpoint(
                out / "checkpoints", cfg.trainer.checkpoint_every, stage.steps, cfg.trainer.keep_checkpoints
            ),
            StageProgress(stage.name, stage.steps),
            history,
            Throughput(module.model_config, stage.seq_len, global_batch, cfg.trainer.peak_tflops),
            PeakMemory(),
            StopOnSignal(),
        ]
        + ([AnswerProbe(cfg.probe, out, stage.name)] if cfg.probe.path else []),
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        enable_model_summary=False,
        default_root_dir=out,
        # val/loss on data.holdout every trainer.val_every steps (0: at the stage's last step)
        limit_val_batches=1.0 if cfg.data.holdout else 0,
        check_val_every_n_epoch=None,
        val_check_interval=cfg.trainer.val_every or stage.steps,
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
    if trainer.global_step < stage.steps:  # stopped early (stop_at_step, a signal): resume later with resume=true
        return None
    state = full_state(module)
    if is_rank0():
        save_weights(state, final)
        (out / "logs" / KEPT_METRICS).unlink(missing_ok=True)  # metrics.csv has every row now
        if not cfg.trainer.keep_checkpoints:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    return final


def run_schedule(cfg: RunConfig) -> dict[str, Path]:
    """Run (or resume) the schedule; returns where things went."""
    validate(cfg)
    out = Path(cfg.trainer.out_dir)
    model_config = cfg.model
    init: Callable[[], dict] | None = None  # the next stage's starting weights, read on rank 0 only
    if cfg.schedule.init_hf is not None:
        model_config, init = hf_start(cfg.schedule.init_hf)
    finished: Path | None = None
    last: StageConfig | None = None
    for stage in cfg.schedule.stages:
        final = out / stage.name / "final.safetensors"
        if cfg.stage_only is not None and stage.name != cfg.stage_only:
            if final.exists():
                init = stage_weights(final)
            continue
        if cfg.resume and final.exists():
            init, finished, last = stage_weights(final), final, stage
            continue
        finished, last = run_stage(cfg, stage, model_config, init), stage
        if finished is None:
            return {"stopped": out / stage.name / "checkpoints" / "last.ckpt"}
        init = stage_weights(finished)
    where = {"run": out, "last_weights": finished}
    if cfg.export and finished is not None and is_rank0():
        vqgan = codes_vqgan(cfg.data.codes) if cfg.data.codes is not None else None
        where["hf"] = export_weights(
            finished, stage_model_config(model_config, last), out / "hf", cfg.data.tokenizer, vqgan
        )
    if cfg.evaluate.lengths is not None and finished is not None and is_rank0():
        device = "cpu" if cfg.trainer.accelerator == "cpu" else None
        needle = evaluate_needles(cfg.evaluate, finished.parent, cfg.data.tokenizer, out / "needle", device)
        if needle is not None:
            where["needle"] = needle
    return where
