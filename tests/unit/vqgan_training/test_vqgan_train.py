"""VQGAN training (train_vqgan.py, lwm/vqgan_training/lit_vqgan.py and helpers): losses go down, dead codes are
revived, usage/perplexity and the adaptive GAN weight are computed right, the grid PNG, the configs.

Longer than most test files: one subject's tests kept together, beside the helpers they share.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image

from lwm.paths import REPO
from lwm.vision import VQGANConfig
from lwm.vision.codebook import CodeUsage, EMACodebook, code_histogram, perplexity, restart_codes, usage_fraction
from lwm.vqgan_training.config import VQGANTrainConfig, VQGANTrainerConfig, from_hydra
from lwm.vqgan_training.discriminator import GANConfig, PatchDiscriminator, adaptive_weight, hinge_d_loss
from lwm.vqgan_training.frames import FrameDataset, FramesConfig, read_index, split_videos
from lwm.vqgan_training.grid import recon_grid, save_grid
from lwm.vqgan_training.lit_vqgan import LitVQGAN, frame_psnr

ROOT = REPO
CONF = ROOT / "conf"
TINY = VQGANConfig.from_preset("tiny")


def synthetic_frames(n: int = 8, size: int = 64) -> torch.Tensor:
    """(n, size, size, 3) uint8: a flat dark background per frame and a bright axis-aligned box."""
    g = torch.Generator().manual_seed(1)
    frames = torch.zeros(n, size, size, 3, dtype=torch.uint8)
    for i in range(n):
        frames[i] = torch.randint(8, 40, (3,), generator=g, dtype=torch.uint8)
        top, left = (int(v) for v in torch.randint(0, size - 20, (2,), generator=g))
        frames[i, top : top + 16, left : left + 16] = torch.randint(120, 255, (3,), generator=g, dtype=torch.uint8)
    return frames


def fit(lit: LitVQGAN, frames: torch.Tensor, steps: int, batch_size: int = 4):
    import lightning as L
    from torch.utils.data import DataLoader

    # max_time: a training_step that never steps the optimizer never reaches max_steps; fail, don't hang
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        max_time={"seconds": 60},
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(lit, DataLoader(FrameDataset(frames), batch_size=batch_size, shuffle=True, drop_last=True))
    return trainer


@torch.no_grad()
def rec_loss(lit: LitVQGAN, x: torch.Tensor) -> float:
    _, _, recon = lit(x)
    return float(lit.reconstruction_loss(x, recon)["rec"])


# ------------------------------------------------------------------------------------ training


def test_a_few_steps_reduce_the_reconstruction_loss():
    frames = synthetic_frames(8)
    x = torch.stack([FrameDataset(frames)[i] for i in range(len(frames))])  # (8, 3, 64, 64)
    lit = LitVQGAN(TINY, VQGANTrainConfig(batch_size=4, lr=2e-3, restart_every=5, usage_window=5))
    before = rec_loss(lit, x)
    trainer = fit(lit, frames, steps=12)
    after = rec_loss(lit, x)
    assert trainer.global_step == 12
    assert after < 0.7 * before, (before, after)
    assert lit.usage.usage() > 0.01  # restarts spread the codes (the initial codebook is all ~0)


def test_gan_and_ema_paths_run_and_count_generator_steps_only():
    frames = synthetic_frames(4)
    train = VQGANTrainConfig(
        batch_size=2, ema_decay=0.9, gan=GANConfig(enabled=True, disc_start=1, channels=8, n_layers=2)
    )
    lit = LitVQGAN(TINY, train)
    codebook_before = lit.codebook.clone()
    trainer = fit(lit, frames, steps=3, batch_size=2)
    assert trainer.global_step == 3  # the discriminator's steps do not advance global_step
    assert not lit.codebook.requires_grad and not torch.equal(lit.codebook, codebook_before)  # moved by EMA


def test_cosine_lr_anneals_over_max_steps():
    lit = LitVQGAN(
        TINY, VQGANTrainConfig(batch_size=2, lr=1e-3, lr_schedule="cosine", min_lr_ratio=0.1, restart_every=0)
    )
    lrs = []

    class Record(__import__("lightning").Callback):
        def on_train_batch_end(self, trainer, module, *args):
            lrs.append(module.optimizers().optimizer.param_groups[0]["lr"])

    import lightning as L
    from torch.utils.data import DataLoader

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=4,
        max_epochs=-1,
        max_time={"seconds": 60},
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[Record()],
    )
    trainer.fit(lit, DataLoader(FrameDataset(synthetic_frames(4), crop=32, align=4), batch_size=2))
    expected = [1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / 4))) for s in (1, 2, 3, 4)]
    assert lrs == pytest.approx(expected)  # after step s the LR is the one for progress s / max_steps; ends at 0.1 lr


def test_train_entry_point_writes_weights_grids_logs_and_summary(tmp_path, capsys):
    import sys

    sys.path.insert(0, str(ROOT))
    from video_samples import write_video

    import train_vqgan
    from lwm.interop.vqgan_sources import load_vqgan

    (tmp_path / "v").mkdir()
    for i in range(3):
        write_video(tmp_path / "v" / f"clip_{i}.mp4", width=64, height=64, frames=6, fps=4)
    (tmp_path / "videos.jsonl").write_text("".join(json.dumps({"path": f"v/clip_{i}.mp4"}) + "\n" for i in range(3)))
    out = tmp_path / "run"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "vqgan",
            overrides=[
                "vision=tiny",
                f"data.index={tmp_path / 'videos.jsonl'}",
                "data.held_out=1",
                "trainer.max_steps=3",
                "trainer.max_minutes=1",
                "trainer.val_every=2",
                "trainer.log_every=1",
                "trainer.threads=1",  # the test process's own (torch's threads are the process's)
                "trainer.flush_denormal=false",  # not the default: the field reaches the process
                "vision.train.batch_size=2",
                "vision.train.grid_frames=3",
                f"out_dir={out}",
                f"export={tmp_path / 'ckpt' / 'vqgan_tiny.safetensors'}",
            ],
        )
    summary = train_vqgan.train(from_hydra(cfg))
    assert summary["threads"] == 1 and torch.get_num_threads() == 1
    assert summary["flush_denormal"] is False and (torch.tensor([1e-40]) * 1.0).item() != 0.0
    assert summary["steps"] == 3 and summary["frames"] == {"train": 12, "val": 6, "train_videos": 2, "val_videos": 1}
    assert 0 < summary["held_out"]["psnr"] < 100 and summary["held_out"]["codes_used"] >= 1
    for name in (
        "vqgan.safetensors",
        "vqgan.json",
        "summary.json",
        "csv/metrics.csv",
        "checkpoints/last.ckpt",
        "grids/step_000002.png",
        "grids/final.png",
    ):
        assert (out / name).is_file(), name
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert Image.open(out / "grids" / "final.png").size == (3 * 64, 2 * 64)
    model = load_vqgan(tmp_path / "ckpt" / "vqgan_tiny.safetensors")
    assert (
        model.config == TINY and json.loads((tmp_path / "ckpt" / "vqgan_tiny.json").read_text())["result"]["steps"] == 3
    )
    printed = capsys.readouterr().out
    assert str(out / "checkpoints" / "last.ckpt") in printed and "held-out PSNR" in printed


def test_psnr_of_a_known_error():
    x = torch.zeros(2, 3, 8, 8)
    recon = x + 0.2  # 0.1 on the [0, 1] scale: MSE 0.01 -> 20 dB
    torch.testing.assert_close(frame_psnr(x, recon), torch.tensor([20.0, 20.0]), rtol=0, atol=1e-4)
    assert frame_psnr(x, x + 5.0)[0] == pytest.approx(-10 * math.log10(0.25), abs=1e-4)  # recon clamped to [-1, 1]


# ------------------------------------------------------------------------------------ codebook


def test_usage_and_perplexity_of_known_histograms():
    assert usage_fraction(torch.tensor([2, 2, 0, 0])) == 0.5
    assert perplexity(torch.tensor([2, 2, 0, 0])) == pytest.approx(2.0)
    assert perplexity(torch.ones(8192, dtype=torch.long)) == pytest.approx(8192.0)
    assert perplexity(torch.tensor([5, 0, 0])) == pytest.approx(1.0)
    p = torch.tensor([0.5, 0.25, 0.25])
    assert perplexity(torch.tensor([2, 1, 1])) == pytest.approx(math.exp(-(p * p.log()).sum().item()))
    assert perplexity(torch.zeros(4, dtype=torch.long)) == 0.0
    assert code_histogram(torch.tensor([[0, 3], [3, 3]]), 5).tolist() == [1, 0, 0, 3, 0]


def test_usage_window_forgets_old_steps():
    usage = CodeUsage(n_codes=4, window=2)
    usage.update(torch.tensor([0, 0]))
    usage.update(torch.tensor([1]))
    assert usage.histogram().tolist() == [2, 1, 0, 0]
    usage.update(torch.tensor([2, 2, 2]))  # step 1 falls out of the window
    assert usage.histogram().tolist() == [0, 1, 3, 0]
    assert usage.dead().tolist() == [True, False, False, True]
    assert usage.usage() == 0.5 and usage.perplexity() == pytest.approx(
        math.exp(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    )


def test_dead_code_restart_revives_unused_codes_and_keeps_used_ones():
    lit = LitVQGAN(TINY, VQGANTrainConfig(usage_window=3))
    n, d = TINY.n_codes, TINY.code_dim
    with torch.no_grad():
        lit.codebook.normal_()
    used = torch.arange(10)
    lit.usage.update(used)
    z = torch.randn(4096, d) * 3 + 5  # encoder outputs far from every code
    before = lit.codebook.detach().clone()
    usage_before = usage_fraction(code_histogram(lit.model.quantizer.nearest(z.T.reshape(1, d, 64, 64)), n))

    moved = lit.restart_dead_codes(z)

    assert moved == n - len(used)
    torch.testing.assert_close(lit.codebook[used], before[used], rtol=0, atol=0)  # used codes untouched
    rest = lit.codebook[len(used) :]
    assert not torch.isclose(rest, before[len(used) :]).all(dim=1).any()
    # every moved code is now one of the encoder outputs (4096 z for 8182 codes: each z is taken, some twice)
    outputs = {tuple(row) for row in z.tolist()}
    assert all(tuple(row) in outputs for row in rest.tolist())
    usage_after = usage_fraction(code_histogram(lit.model.quantizer.nearest(z.T.reshape(1, d, 64, 64)), n))
    assert usage_after > usage_before + 0.3, (usage_before, usage_after)


def test_restart_takes_distinct_vectors_when_there_are_enough():
    codebook = torch.zeros(6, 2)
    dead = torch.tensor([False, True, True, False, True, False])
    z = torch.arange(20, dtype=torch.float).view(10, 2)
    idx = restart_codes(codebook, dead, z, torch.Generator().manual_seed(0))
    assert idx.tolist() == [1, 2, 4]
    assert len({tuple(r) for r in codebook[idx].tolist()}) == 3 and codebook[[0, 3, 5]].abs().sum() == 0
    with pytest.raises(ValueError, match=r"z must be \(N, 2\)"):
        restart_codes(codebook, dead, torch.zeros(3, 5))


def test_restart_resets_adam_state_of_moved_codes_only():
    frames = synthetic_frames(4)
    lit = LitVQGAN(TINY, VQGANTrainConfig(batch_size=2, restart_every=0, usage_window=1))
    fit(lit, frames, steps=2, batch_size=2)
    state = lit.optimizers().optimizer.state[lit.codebook]
    lit.usage.update(torch.tensor([0, 1]))
    kept = state["exp_avg"][:2].clone()
    lit.restart_dead_codes(torch.randn(64, TINY.code_dim))
    assert state["exp_avg"][2:].abs().sum() == 0 and state["exp_avg_sq"][2:].abs().sum() == 0
    torch.testing.assert_close(state["exp_avg"][:2], kept)


def test_ema_codebook_moves_codes_to_the_mean_of_their_vectors():
    ema = EMACodebook(n_codes=3, code_dim=2, decay=0.5)
    codebook = torch.zeros(3, 2)
    z = torch.tensor([[2.0, 2.0], [4.0, 4.0], [-6.0, 0.0]])
    for _ in range(30):
        ema.update(codebook, z, torch.tensor([0, 0, 1]))
    torch.testing.assert_close(codebook[0], torch.tensor([3.0, 3.0]), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(codebook[1], torch.tensor([-6.0, 0.0]), rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------------------------ GAN


def test_adaptive_weight_is_the_ratio_of_gradient_norms():
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    rec = (w * torch.tensor([3.0, 4.0])).sum()  # gradient (3, 4): norm 5
    gan = (w * torch.tensor([0.0, 2.0])).sum()  # gradient (0, 2): norm 2
    assert float(adaptive_weight(rec, gan, w)) == pytest.approx(5 / (2 + 1e-4))
    assert float(adaptive_weight(rec, gan * 0, w)) == pytest.approx(1e4)  # clamped at max_weight
    assert not adaptive_weight(rec, gan, w).requires_grad


def test_hinge_loss_and_patch_logits():
    assert float(hinge_d_loss(torch.full((4,), 2.0), torch.full((4,), -2.0))) == 0.0
    assert float(hinge_d_loss(torch.zeros(4), torch.zeros(4))) == pytest.approx(1.0)
    logits = PatchDiscriminator(channels=8, n_layers=2)(torch.zeros(2, 3, 64, 64))
    assert logits.shape[:2] == (2, 1) and logits.shape[2] > 1  # one score per patch


# ------------------------------------------------------------------------------------ grid, data


def test_grid_png_has_two_rows(tmp_path):
    originals = torch.rand(5, 3, 64, 64) * 2 - 1
    recons = -originals
    path = save_grid(originals, recons, tmp_path / "grids" / "g.png")
    image = Image.open(path)
    assert image.size == (5 * 64, 2 * 64)  # (width, height): 5 frames, originals above, reconstructions below
    pixels = torch.from_numpy(__import__("numpy").array(image))
    expect_top = ((originals[2] + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0)
    assert torch.equal(pixels[:64, 128:192], expect_top)
    with pytest.raises(ValueError, match="both be"):
        recon_grid(originals, recons[:4])


def test_split_is_by_video_and_crops_are_aligned(tmp_path):
    index = tmp_path / "videos.jsonl"
    index.write_text("".join(json.dumps({"path": f"v/clip_{i}.mp4"}) + "\n" for i in range(6)))
    train, held = split_videos(read_index(index), held_out=2)
    assert [p.name for p in held] == ["clip_4.mp4", "clip_5.mp4"] and len(train) == 4
    assert train[0] == tmp_path / "v" / "clip_0.mp4"
    with pytest.raises(ValueError, match="cannot hold out 6 of 6 videos"):
        split_videos(read_index(index), held_out=6)
    frames = torch.arange(64, dtype=torch.uint8).view(1, 1, 64, 1).expand(1, 64, 64, 3).contiguous()  # column index
    ds = FrameDataset(frames, crop=32, align=4)
    for _ in range(20):
        x = ds[0]
        assert x.shape == (3, 32, 32)
        first_column = round(float((x[0, 0, 0] + 1) * 127.5))
        assert first_column % 4 == 0
    with pytest.raises(ValueError, match="multiple of the downsampling 4"):
        FrameDataset(frames, crop=30, align=4)


# ------------------------------------------------------------------------------------ configs


@pytest.mark.parametrize("vision", ["tiny", "lwm"])
def test_configs_compose_and_build(vision):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("vqgan", overrides=[f"vision={vision}"])
    run = from_hydra(cfg)
    # conf/vision/<name>.yaml writes out every field of the preset, so it shows the VQGAN it builds
    assert sorted(cfg.vision.model) == sorted(f.name for f in dataclasses.fields(VQGANConfig))
    assert run.preset == vision and run.model == VQGANConfig.from_preset(vision)
    assert isinstance(run.train, VQGANTrainConfig) and isinstance(run.train.gan, GANConfig)
    assert isinstance(run.data, FramesConfig) and isinstance(run.trainer, VQGANTrainerConfig)
    assert run.out_dir.startswith(f"runs/vqgan/{vision}/")
    assert run.train.gan.enabled == (vision == "lwm")


def test_trainer_accelerator_reaches_lightning(tmp_path):
    """trainer.accelerator (shared with train.py's trainer config) is the Trainer's: cpu is taken as
    asked, and gpu on a machine without one is Lightning's error, not a silent CPU run."""
    import sys

    import lightning as L

    sys.path.insert(0, str(ROOT))
    import train_vqgan

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("vqgan", overrides=["vision=tiny", "trainer.accelerator=cpu", f"out_dir={tmp_path}"])
    run = from_hydra(cfg)
    assert run.trainer.accelerator == "cpu"
    assert type(train_vqgan.make_trainer(run, tmp_path).accelerator).__name__ == "CPUAccelerator"
    if not torch.cuda.is_available():
        gpu = run._replace(trainer=dataclasses.replace(run.trainer, accelerator="gpu"))
        with pytest.raises(L.fabric.utilities.exceptions.MisconfigurationException):
            train_vqgan.make_trainer(gpu, tmp_path)


def test_overrides_reach_the_dataclasses():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "vqgan",
            overrides=[
                "vision=tiny",
                "vision.train.lr=3e-3",
                "trainer.max_minutes=2",
                "vision.train.crop=16",
                "vision.model.code_dim=8",
                "vision.train.gan.enabled=true",
            ],
        )
    run = from_hydra(cfg)
    assert (run.train.lr, run.trainer.max_minutes, run.train.crop, run.model.code_dim) == (3e-3, 2, 16, 8)
    assert run.train.gan.enabled and run.model.resolution == 64


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["vision.train.lr=-1"], r"VQGANTrainConfig.lr must be > 0, got -1"),
        (["vision.train.lr_schedule=linear"], r"lr_schedule must be one of \['constant', 'cosine'\], got 'linear'"),
        (["vision.train.l1_weight=0", "vision.train.l2_weight=0"], r"not both 0, got l1_weight 0"),
        (["vision.train.ema_decay=1.0"], r"ema_decay must be in \[0, 1\)"),
        (["+vision.train.foo=1"], r"vision.train: unknown key\(s\) \['foo'\]"),
        (["+vision.train.gan.foo=1"], r"gan: unknown key\(s\) \['foo'\]"),
        (["+vision.model.width=3"], r"vision.model: unknown key\(s\) \['width'\] for VQGANConfig"),
        (["vision.train.batch_size=abc"], r"vision.train.batch_size: expected an integer, got 'abc'"),
        (["trainer.progress_bar=3"], r"trainer.progress_bar: expected true or false, got 3"),
        (["vision.preset=huge"], r"unknown VQGAN preset 'huge'"),
        (["vision.model.code_dim=0"], r"code_dim must be a positive integer, got 0"),
        (["trainer.max_minutes=0"], r"max_minutes must be > 0, got 0"),
        (["trainer.max_steps=0"], r"max_steps must be a positive integer or -1"),
        (["trainer.precision=fp8"], r"precision must be one of"),
        (["data.held_out=0"], r"held_out must be a positive integer"),
        (["vision.train.crop=-32"], r"VQGANTrainConfig.crop must be an integer >= 0, got -32"),
        (
            ["vision.train.crop=30"],
            r"vision.train.crop 30 must be at most the resolution 64 and a multiple of the VQGAN's downsampling 4",
        ),
        (["vision.train.crop=128"], r"vision.train.crop 128 must be at most the resolution 64"),
        (["vision.train.betas=[0.9]"], r"vision.train.betas: expected 2 values, got \[0.9\]"),
        (["vision.train.betas=[0.9,1.5]"], r"betas must be two numbers in \[0, 1\), got \[0.9, 1.5\]"),
        (["vision.train.gan.disc_start=-5"], r"disc_start must be >= 0 steps, got -5"),
    ],
)
def test_bad_config_values_are_named(overrides, message):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("vqgan", overrides=["vision=tiny", *overrides])
    with pytest.raises(ValueError, match=message):
        from_hydra(cfg)


def test_checkpoint_round_trip(tmp_path):
    from lwm.interop.vqgan_sources import load_vqgan
    from lwm.vision.checkpoint import save_vqgan

    lit = LitVQGAN(TINY, VQGANTrainConfig())
    weights, config = save_vqgan(lit.model, tmp_path / "vqgan_tiny.safetensors", "tiny", {"result": {"psnr": 1.0}})
    assert config == tmp_path / "vqgan_tiny.json" and json.loads(config.read_text())["vqgan"]["code_dim"] == 16
    model = load_vqgan(weights)
    frames = synthetic_frames(2)
    torch.testing.assert_close(model.encode(frames), lit.model.eval().encode(frames), rtol=0, atol=0)


def test_cosine_schedule_needs_max_steps():
    lit = LitVQGAN(TINY, VQGANTrainConfig(lr_schedule="cosine"))
    with pytest.raises(ValueError, match="trainer.max_steps"):
        lit.configure_optimizers()
