"""Running a schedule: stage after stage, each from the previous stage's final weights, each in its
stage folder (lwm.disk.stage_folder: the layout)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Callable

import lightning as L
import torch
import torch.distributed as dist

from lwm.core.config import RunConfig, StageConfig, resolve_stage, stage_model_config
from lwm.core.numerics import denormals
from lwm.core.preflight import device_kind, device_memory, preflight, wanted
from lwm.disk.stage_folder import KEPT_METRICS, StageFolder
from lwm.disk.weights import read_weights, save_weights
from lwm.interop.hf import from_hf, start_config
from lwm.ranks import is_rank0, say
from lwm.train.callbacks import MetricHistory
from lwm.train.checkpointing import resume_point
from lwm.train.datamodule import LWMDataModule
from lwm.train.evaluate import EVALUATION_FAILED, evaluate_needles
from lwm.train.export import codes_vqgan, export_weights
from lwm.train.module import LWMModule
from lwm.train.trainer import build_trainer


def full_state(module: LWMModule) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0 (every rank must call this under FSDP)."""
    if getattr(module, "_device_mesh", None) is None:
        return {k: v.detach().cpu() for k, v in module.model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def hf_start(folder: str | Path) -> Callable[[], dict]:
    """A Hugging Face folder as a first stage's start: a function that reads its weights, with the
    vocabulary grown for vision unless its rows have it already (LWMModule calls it on global rank 0
    only). The run's model config is the folder's, resolved with the run's (lwm.core.config.start_model)."""
    _, text = start_config(folder)  # its config and weights' shapes, before anything is built
    return lambda: from_hf(folder, extend_vocab=text is not None, text_size=text).state_dict()


def stage_weights(final: Path) -> Callable[[], dict]:
    """A stage's final weights as the next stage's start, read when called: LWMModule calls it on
    global rank 0 only (the others receive the weights by broadcast), so a node does not hold
    a full fp32 copy per rank (8 x 27 GB at 7b)."""
    return partial(read_weights, final)


def run_stage(cfg: RunConfig, stage: StageConfig, init: Callable | None) -> Path | None:
    folder = StageFolder.of(cfg.trainer.out_dir, stage.name)
    final = folder.final
    resume_from = resume_point(folder, cfg.resume)
    setup = resolve_stage(cfg, stage)
    dims = setup.dims
    say(
        f"stage {stage.name}: seq_len {stage.seq_len}, rope_theta {stage.rope_theta:g}, {stage.steps} steps, "
        f"{dims.describe()}" + (f" (resuming from {resume_from})" if resume_from else "")
    )
    if wanted(cfg.trainer.preflight, cfg.trainer.accelerator):  # before anything is allocated
        kind = device_kind(cfg.trainer.accelerator)
        plan = preflight(cfg, stage, device_memory(kind, cfg.trainer.devices), device=kind)
        say(f"preflight: {plan.summary()}: fits")
    if is_rank0():
        folder.path.mkdir(parents=True, exist_ok=True)
        folder.model_config.write_text(json.dumps(asdict(setup.model), indent=2))
    L.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    module = LWMModule(setup.model, stage, cfg.optim, cfg.parallel, init_state=init, seed=cfg.trainer.seed, dims=dims)
    datamodule = LWMDataModule(setup.data, seq_len=stage.seq_len, dims=dims, layout=cfg.parallel.layout)
    history = MetricHistory.resumed(folder.logs, keep=is_rank0()) if resume_from else MetricHistory([])
    trainer = build_trainer(cfg, setup, folder, module, history)
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
    if trainer.global_step < stage.steps:  # stopped early (stop_at_step, a signal): resume later with resume=true
        return None
    state = full_state(module)
    if is_rank0():
        save_weights(state, final)
        (folder.logs / KEPT_METRICS).unlink(missing_ok=True)  # metrics.csv has every row now
        if not cfg.trainer.keep_checkpoints:
            shutil.rmtree(folder.checkpoints, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    return final


def run_schedule(cfg: RunConfig) -> dict[str, Path]:
    """Run (or resume) the schedule, checked by its caller (lwm.core.config.validate, once); returns
    where things went."""
    with denormals(cfg.trainer.flush_denormal):  # before the process's first parallel op (lwm.core.numerics)
        return _schedule(cfg)


def _schedule(cfg: RunConfig) -> dict[str, Path]:
    out = Path(cfg.trainer.out_dir)
    init: Callable[[], dict] | None = None  # the next stage's starting weights, read on rank 0 only
    if cfg.schedule.init_hf is not None:
        init = hf_start(cfg.schedule.init_hf)
    finished: Path | None = None
    last: StageConfig | None = None
    for stage in cfg.schedule.stages:
        final = StageFolder.of(out, stage.name).final
        if cfg.stage_only is not None and stage.name != cfg.stage_only:
            if final.exists():
                init = stage_weights(final)
            continue
        if cfg.resume and final.exists():
            init, finished, last = stage_weights(final), final, stage
            continue
        finished, last = run_stage(cfg, stage, init), stage
        if finished is None:
            return {"stopped": StageFolder.of(out, stage.name).last}
        init = stage_weights(finished)
    where = {"run": out, "last_weights": finished}
    if cfg.export and finished is not None and is_rank0():
        vqgan = codes_vqgan(cfg.data.codes) if cfg.data.codes is not None else None
        where["hf"] = export_weights(
            finished, stage_model_config(cfg.model, last), out / "hf", cfg.data.tokenizer, vqgan, inside=out
        )
    if cfg.evaluate.lengths is not None and finished is not None and is_rank0():
        device = "cpu" if cfg.trainer.accelerator == "cpu" else None
        needle = evaluate_needles(cfg.evaluate, finished.parent, cfg.data.tokenizer, out / "needle", device)
        if needle is not None:
            where["needle"] = needle
        else:  # train.py exits EXIT_EVALUATION; the same command evaluates again (command.finished)
            where[EVALUATION_FAILED] = out / "needle"
    return where
