"""Train the VQGAN on video frames: Lightning, configured by Hydra (conf/vqgan.yaml + conf/vision/).

    python train_vqgan.py vision=tiny trainer.max_minutes=10
    python train_vqgan.py vision=tiny trainer.max_steps=300 vision.train.lr=2e-3 out_dir=runs/try1
    python train_vqgan.py vision=lwm data.index=/data/videos.jsonl trainer.max_minutes=600 trainer.precision=bf16-mixed

The run folder (out_dir) gets: metrics.csv (csv/), TensorBoard events (tb/), grids/step_*.png
(held-out originals above, reconstructions below), checkpoints/last.ckpt (Lightning),
vqgan.safetensors + vqgan.json (the VQGAN's weights and config), summary.json and Hydra's .hydra/.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from lwm.core.numerics import flush_denormals
from lwm.doc_sections import host_line, write_section
from lwm.vision.checkpoint import save_vqgan
from lwm.vision.vqgan import VQGAN
from lwm.vqgan_training.config import VQGANRunConfig, from_hydra
from lwm.vqgan_training.frames import FrameData
from lwm.vqgan_training.lit_vqgan import LitVQGAN


def make_trainer(run: VQGANRunConfig, out: Path):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    t = run.trainer
    return L.Trainer(
        accelerator=t.accelerator,
        devices=1,
        precision=t.precision,
        max_steps=t.max_steps,
        max_epochs=-1,
        max_time=timedelta(minutes=t.max_minutes),
        log_every_n_steps=t.log_every,
        val_check_interval=t.val_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        logger=[CSVLogger(out, name="csv", version=""), TensorBoardLogger(out, name="tb", version="")],
        callbacks=[ModelCheckpoint(dirpath=out / "checkpoints", save_last=True, save_top_k=0)],
        enable_progress_bar=t.progress_bar,
        enable_model_summary=False,
        default_root_dir=out,
    )


def train(run: VQGANRunConfig) -> dict:
    import lightning as L

    torch.set_num_threads(run.trainer.threads)
    flushed = flush_denormals(run.trainer.flush_denormal)
    L.seed_everything(run.trainer.seed, verbose=False)
    out = Path(run.out_dir)
    start = time.time()
    data = FrameData(
        run.data,
        resolution=run.model.resolution,
        batch_size=run.train.batch_size,
        crop=run.train.crop,
        align=run.model.downsample,
    )
    data.setup()
    load_s = time.time() - start
    lit = LitVQGAN(run.model, run.train, grid_dir=out / "grids")
    trainer = make_trainer(run, out)
    start, cpu_start, load_before = time.time(), time.process_time(), os.getloadavg()[0]
    trainer.fit(lit, datamodule=data)
    timing = {
        "fit_minutes": round((time.time() - start) / 60, 2),
        "fit_cpu_minutes": round((time.process_time() - cpu_start) / 60, 2),  # all of this process's threads
        # 1-minute load averages of the machine (all processes) when fit began and ended: > threads means others ran too
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "frames_load_seconds": round(load_s, 1),
    }
    val = lit.evaluate(data.val, trainer.global_step)  # the final weights on the held-out frames, in fp32
    summary = {**summarize(run, lit, data, trainer.global_step, val, timing), "flush_denormal": flushed}
    extra = {
        "result": {
            k: summary[k] for k in ("steps", "fit_minutes", "fit_cpu_minutes", "held_out", "train_window", "command")
        },
        "train": summary["config"]["train"],
    }
    weights, config = save_vqgan(lit.model, out / "vqgan.safetensors", run.preset, extra)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    exported = save_vqgan(lit.model, run.export, run.preset, extra) if run.export else None
    if run.report:
        write_report(summary, run)
    print_summary(summary, out, weights, config, exported)
    return summary


def summarize(run: VQGANRunConfig, lit: LitVQGAN, data: FrameData, steps: int, val: dict, timing: dict) -> dict:
    """The run's numbers (summary.json): held-out and training-window codebook use, times, config."""
    window = lit.usage.histogram()
    return {
        "preset": run.preset,
        "steps": steps,
        **timing,
        "frames": {
            "train": len(data.train),
            "val": len(data.val),
            **{f"{k}_videos": v for k, v in data.videos.items()},
        },
        "held_out": {k: val[k] for k in ("psnr", "usage", "perplexity", "codes_used")},
        "train_window": {
            "usage": lit.usage.usage(),
            "perplexity": lit.usage.perplexity(),
            "codes_used": int((window > 0).sum()),
            "steps": min(steps, lit.usage.window),
            "positions": int(window.sum()),
        },
        "threads": torch.get_num_threads(),
        "command": "python " + " ".join(sys.argv),
        "config": {
            "train": dataclasses.asdict(run.train),
            "data": dataclasses.asdict(run.data),
            "trainer": dataclasses.asdict(run.trainer),
        },
    }


def print_summary(summary: dict, out: Path, weights: Path, config: Path, exported) -> None:
    ho, tw = summary["held_out"], summary["train_window"]
    grids = sorted((out / "grids").glob("*.png"))
    print(
        f"steps {summary['steps']} in {summary['fit_minutes']:.1f} min ({summary['fit_cpu_minutes']:.1f} CPU "
        f"core-minutes); held-out PSNR {ho['psnr']:.2f} dB, codebook usage {ho['usage']:.1%} "
        f"({int(ho['codes_used'])} codes), perplexity {ho['perplexity']:.0f}; last {tw['steps']} training steps: "
        f"usage {tw['usage']:.1%}, perplexity {tw['perplexity']:.0f}"
    )
    print(f"run folder        {out}")
    print(f"lightning ckpt    {out / 'checkpoints' / 'last.ckpt'}")
    print(f"VQGAN weights     {weights} (+ {config.name})")
    if exported:
        print(f"exported          {exported[0]} ({exported[0].stat().st_size / 2**20:.1f} MiB) + {exported[1]}")
    print(f"logs              {out / 'csv' / 'metrics.csv'}, TensorBoard: tensorboard --logdir {out / 'tb'}")
    print(f"grids             {out / 'grids'} ({len(grids)} PNGs; the final weights': final.png)")


def write_report(summary: dict, run: VQGANRunConfig) -> None:
    tr, ho, tw = run.train, summary["held_out"], summary["train_window"]
    with torch.device("meta"):  # shapes only
        n_params = sum(p.numel() for p in VQGAN(run.model).parameters())
    codebook = f"EMA (decay {tr.ema_decay})" if tr.ema_decay else "gradient (codebook loss)"
    rec = " + ".join(f"{w:g} {name}" for w, name in ((tr.l1_weight, "L1"), (tr.l2_weight, "MSE")) if w)
    crops = f" random {tr.crop}x{tr.crop} crops" if tr.crop else " whole frames"
    restarts = (
        f"every {tr.restart_every} steps" + (f" until step {tr.restart_until}" if tr.restart_until >= 0 else "")
        if tr.restart_every
        else "off"
    )
    md = f"""
Command: `{summary["command"]}`  
Host: {host_line()}

Preset `{run.preset}` ({n_params / 1e6:.2f}M parameters, {run.model.n_codes} codes of dim {run.model.code_dim}), trained in {run.trainer.precision};
{summary["frames"]["train"]} training frames from {summary["frames"]["train_videos"]} videos, {summary["frames"]["val"]} held-out frames
from the last {summary["frames"]["val_videos"]} videos ({run.data.index}, {run.data.fps:g} fps, 64x64, flips {"on" if run.data.hflip else "off"}).
Batch {tr.batch_size}{crops} (aligned to the code grid), AdamW lr {tr.lr:g} ({tr.lr_schedule}{" over the budget: max_steps or max_minutes" if tr.lr_schedule == "cosine" else ""}{f", warm-up {tr.warmup_steps}" if tr.warmup_steps else ""}), betas {list(tr.betas)},
loss {rec} + codebook + {tr.beta:g} commitment, GAN {"on" if tr.gan.enabled else "off"};
codebook {codebook}; dead-code restarts {restarts} (window {tr.usage_window} steps).
Held-out numbers: the final weights in fp32 on all {summary["frames"]["val"]} held-out frames ({summary["frames"]["val"] * run.model.tokens_per_frame} code positions);
PSNR is the mean over frames of 10 log10(1 / MSE) on the [0, 1] scale. Training window: the codes of the last
{tw["steps"]} training steps ({tw["positions"]} code positions). Usage: codes picked at least once.
Fit time: wall clock of `trainer.fit` (validation included); CPU: this process's CPU time (all threads), in core-minutes;
machine load average (1 min, all processes) {summary["load_average"][0]} at the start, {summary["load_average"][1]} at the end.

| steps | fit wall (min) | fit CPU (core-min) | held-out PSNR (dB) | held-out codes used | held-out usage | held-out perplexity | training-window codes used | training-window usage | training-window perplexity |
| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
| {summary["steps"]} | {summary["fit_minutes"]:.2f} | {summary["fit_cpu_minutes"]:.2f} | {ho["psnr"]:.2f} | {int(ho["codes_used"])} / {run.model.n_codes} | {ho["usage"]:.1%} | {ho["perplexity"]:.0f} | {tw["codes_used"]} / {run.model.n_codes} | {tw["usage"]:.1%} | {tw["perplexity"]:.0f} |
"""  # noqa: E501, W291 (a markdown report: table rows are long, "  " ends a line)
    write_section("vqgan-train", md)


@hydra.main(version_base="1.3", config_path="conf", config_name="vqgan")
def main(cfg: DictConfig) -> None:
    train(from_hydra(cfg))


if __name__ == "__main__":
    main()
