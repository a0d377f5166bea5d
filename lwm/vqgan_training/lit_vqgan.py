"""Training the VQGAN with Lightning: reconstruction + VQ losses, optional PatchGAN, codebook upkeep.

One training step (manual optimization, so restarts can reset the optimizer state of the codes
they move and the discriminator can have its own optimizer):

    z = encoder(x); codes, z_q = quantizer(z); x^ = decoder(z_q)
    loss = l1 |x - x^| + l2 (x - x^)^2 + [codebook_loss, without EMA] + beta * commitment_loss [+ lambda * -D(x^)]
    EMA codebook update (if ema_decay > 0); usage window update; every restart_every steps the
    codes unused over the window move onto random encoder outputs of this batch
    [discriminator step: hinge loss on x vs x^, once step >= disc_start]

Logged: train/{loss, rec, l1, mse, codebook, commitment, psnr, usage, perplexity, restarted, lr}
[, train/{gan_g, gan_weight, gan_d}] and, at validation on the held-out frames, val/{psnr, usage,
perplexity, codes_used}; a reconstruction grid PNG per validation goes to `grid_dir`.
PSNR is per frame on the [0, 1] scale, 10 log10(1 / MSE), with the reconstruction clamped to
[-1, 1], averaged over frames.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Timer

from lwm.core.lr import lr_factor
from lwm.vision.codebook import CodeUsage, EMACodebook, code_histogram, perplexity, restart_codes, usage_fraction
from lwm.vision.vqgan import VQGAN
from lwm.vision.vqgan_config import VQGANConfig
from lwm.vqgan_training.config import VQGANTrainConfig
from lwm.vqgan_training.discriminator import PatchDiscriminator, adaptive_weight, generator_loss, hinge_d_loss
from lwm.vqgan_training.grid import save_grid


def frame_psnr(x: torch.Tensor, recon: torch.Tensor) -> torch.Tensor:
    """x, recon (B, 3, H, W) in [-1, 1] -> PSNR (B,) in dB on the [0, 1] scale (recon clamped)."""
    mse = ((recon.float().clamp(-1, 1) - x.float()) / 2).pow(2).flatten(1).mean(1)  # (B,)
    return -10 * torch.log10(mse.clamp_min(1e-10))


class LitVQGAN(L.LightningModule):
    def __init__(self, model_config: VQGANConfig, train_config: VQGANTrainConfig, grid_dir: str | Path | None = None):
        super().__init__()
        self.automatic_optimization = False
        self.config = train_config
        self.model = VQGAN(model_config)
        n_codes, code_dim = model_config.n_codes, model_config.code_dim
        self.ema = EMACodebook(n_codes, code_dim, train_config.ema_decay) if train_config.ema_decay > 0 else None
        if self.ema is not None:
            self.model.quantizer.codebook.weight.requires_grad_(False)  # moved by EMA, not by the optimizer
        self.discriminator = (
            PatchDiscriminator(train_config.gan.channels, train_config.gan.n_layers)
            if train_config.gan.enabled
            else None
        )
        self.usage = CodeUsage(n_codes, train_config.usage_window)
        self.grid_dir = None if grid_dir is None else Path(grid_dir)
        self.restart_generator = torch.Generator().manual_seed(0)
        self.last_val: dict[str, float] = {}

    @property
    def codebook(self) -> torch.Tensor:
        return self.model.quantizer.codebook.weight

    # ------------------------------------------------------------------------------ pieces

    def forward(self, x: torch.Tensor):
        """x (B, 3, H, W) in [-1, 1] -> (z (B, D, h, w), quantizer output, recon (B, 3, H, W))."""
        z = self.model.encoder(x)
        q = self.model.quantizer(z)
        return z, q, self.model.decoder(q.z_q)

    def reconstruction_loss(self, x: torch.Tensor, recon: torch.Tensor) -> dict[str, torch.Tensor]:
        recon = recon.float()
        l1, mse = F.l1_loss(recon, x), F.mse_loss(recon, x)
        return {"rec": self.config.l1_weight * l1 + self.config.l2_weight * mse, "l1": l1, "mse": mse}

    def restart_dead_codes(self, z_flat: torch.Tensor) -> int:
        """Move the codes unused over the usage window onto random rows of z_flat (N, D); reset their
        optimizer state (or EMA averages). Codes in use are not touched. Returns how many moved."""
        idx = restart_codes(self.codebook.data, self.usage.dead(), z_flat.detach(), self.restart_generator)
        if len(idx) == 0:
            return 0
        if self.ema is not None:
            self.ema.restarted(idx.to(self.codebook.device), self.codebook.data)
        elif self._trainer is not None:
            opt = self.optimizers()
            state = (opt[0] if isinstance(opt, list) else opt).optimizer.state.get(self.codebook, {})
            for key in ("exp_avg", "exp_avg_sq"):  # Adam's moments of the moved rows start again
                if key in state:
                    state[key][idx.to(state[key].device)] = 0
        return len(idx)

    def _restart_due(self, step: int) -> bool:
        every, until = self.config.restart_every, self.config.restart_until
        return every > 0 and step % every == 0 and (until < 0 or step <= until)

    # ------------------------------------------------------------------------------ training

    def training_step(self, x: torch.Tensor, batch_idx: int) -> None:
        cfg, step = self.config, self.global_step
        opts = self.optimizers()
        opt_g, opt_d = (opts[0], opts[1]) if isinstance(opts, list) else (opts, None)

        z, q, recon = self(x)
        rec = self.reconstruction_loss(x, recon)
        vq = q.commitment_loss * cfg.beta + (q.codebook_loss if self.ema is None else 0.0)
        loss = rec["rec"] + vq
        logs = {**rec, "codebook": q.codebook_loss, "commitment": q.commitment_loss}
        gan_on = self.discriminator is not None and step >= cfg.gan.disc_start
        if gan_on:
            self.discriminator.requires_grad_(False)
            g = generator_loss(self.discriminator(recon))
            weight = cfg.gan.disc_weight * adaptive_weight(rec["rec"], g, self.model.decoder.conv_out.weight)
            self.discriminator.requires_grad_(True)
            loss = loss + weight * g
            logs.update(gan_g=g, gan_weight=weight)
        opt_g.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        opt_g.step()
        sched = self.lr_schedulers()
        if sched is not None:
            sched.step()

        z_flat = z.detach().permute(0, 2, 3, 1).reshape(-1, z.shape[1])  # (B, D, h, w) -> (B*h*w, D)
        if self.ema is not None:
            self.ema.update(self.codebook.data, z_flat, q.codes.reshape(-1))
        self.usage.update(q.codes)
        logs["restarted"] = float(self.restart_dead_codes(z_flat)) if self._restart_due(step) else 0.0

        if gan_on:
            d_loss = hinge_d_loss(self.discriminator(x), self.discriminator(recon.detach()))
            opt_d.zero_grad(set_to_none=True)
            self.manual_backward(d_loss)
            opt_d.optimizer.step()  # the raw optimizer: Lightning's global_step counts generator steps only
            logs["gan_d"] = d_loss

        logs.update(
            loss=loss,
            psnr=frame_psnr(x, recon.detach()).mean(),
            usage=self.usage.usage(),
            perplexity=self.usage.perplexity(),
            lr=opt_g.optimizer.param_groups[0]["lr"],
        )
        self.log_dict(
            {f"train/{k}": float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in logs.items()},
            on_step=True,
            prog_bar=False,
        )
        self.log("psnr", float(logs["psnr"]), prog_bar=True, logger=False)
        self.log("usage", self.usage.usage(), prog_bar=True, logger=False)

    # ------------------------------------------------------------------------------ validation

    def _val_begin(self, total_frames: int) -> None:
        n_codes = self.model.config.n_codes
        self._val = {"psnr": 0.0, "frames": 0, "hist": torch.zeros(n_codes, dtype=torch.long), "grid": ([], [])}
        self._grid_stride = max(1, total_frames // self.config.grid_frames)  # grid frames spread over the set

    def _val_add(self, x: torch.Tensor) -> None:
        _, q, recon = self(x)
        v = self._val
        first = v["frames"]
        v["psnr"] += float(frame_psnr(x, recon).sum())
        v["hist"] += code_histogram(q.codes.cpu(), len(v["hist"]))
        for i in range(len(x)):
            if (first + i) % self._grid_stride == 0 and len(v["grid"][0]) < self.config.grid_frames:
                v["grid"][0].append(x[i].cpu())
                v["grid"][1].append(recon[i].float().cpu())
        v["frames"] += len(x)

    def _val_end(self, step: int, grid_name: str) -> dict[str, float]:
        v, hist = self._val, self._val["hist"]
        result = {
            "psnr": v["psnr"] / max(1, v["frames"]),
            "usage": usage_fraction(hist),
            "perplexity": perplexity(hist),
            "codes_used": float((hist > 0).sum()),
            "frames": float(v["frames"]),
            "step": float(step),
        }
        if self.grid_dir is not None and v["grid"][0]:
            self.last_val_grid = save_grid(
                torch.stack(v["grid"][0]), torch.stack(v["grid"][1]), self.grid_dir / grid_name
            )
        return result

    def on_validation_epoch_start(self) -> None:
        loaders = self.trainer.val_dataloaders
        self._val_begin(len(loaders.dataset) if hasattr(loaders, "dataset") else self.config.grid_frames)

    def validation_step(self, x: torch.Tensor, batch_idx: int) -> None:
        self._val_add(x)

    def on_validation_epoch_end(self) -> None:
        if self._val["frames"] == 0 or self.trainer.sanity_checking:
            return
        self.last_val = self._val_end(self.global_step, f"step_{self.global_step:06d}.png")
        self.log_dict({f"val/{k}": val for k, val in self.last_val.items() if k not in ("frames", "step")})

    @torch.no_grad()
    def evaluate(
        self, frames: torch.utils.data.Dataset, step: int, batch_size: int = 64, grid_name: str = "final.png"
    ) -> dict[str, float]:
        """The validation numbers outside Lightning, in the model's own precision (fp32 whatever the
        training precision was): PSNR, usage, perplexity, codes used on `frames`; writes the grid."""
        was_training = self.training
        self.eval()
        self._val_begin(len(frames))
        device = self.codebook.device
        for start in range(0, len(frames), batch_size):
            self._val_add(
                torch.stack([frames[i] for i in range(start, min(start + batch_size, len(frames)))]).to(device)
            )
        self.train(was_training)
        return self._val_end(step, grid_name)

    # ------------------------------------------------------------------------------ optimizers

    def configure_optimizers(self):
        cfg = self.config
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt_g = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt_g, self._lr_factor())
        if self.discriminator is None:
            return [opt_g], [sched]
        opt_d = torch.optim.AdamW(self.discriminator.parameters(), lr=cfg.gan.lr, betas=(0.5, 0.9), weight_decay=0.0)
        return [opt_g, opt_d], [sched]

    def budget_progress(self) -> float:
        """Fraction of the run's budget spent: steps of trainer.max_steps or time of trainer's max_time,
        whichever is further along (0 without a trainer)."""
        trainer = self._trainer
        if trainer is None:
            return 0.0
        fractions = [trainer.global_step / trainer.max_steps] if trainer.max_steps and trainer.max_steps > 0 else []
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
        remaining = None if timer is None else timer.time_remaining()
        if remaining is not None:
            elapsed = timer.time_elapsed()
            fractions.append(elapsed / max(elapsed + remaining, 1e-9))
        return min(1.0, max(fractions, default=0.0))

    def _lr_factor(self):
        """LambdaLR's factor: linear warm-up over warmup_steps, then constant or cosine down to min_lr_ratio
        over the budget (trainer.max_steps or max_time, whichever ends first: a time-limited run anneals
        fully however fast the machine is)."""
        cfg = self.config
        if cfg.lr_schedule == "cosine":
            trainer = self._trainer
            has_budget = trainer is not None and (
                (trainer.max_steps or 0) > 0
                or any(isinstance(c, Timer) and c.time_remaining() is not None for c in trainer.callbacks)
            )
            if not has_budget:
                max_steps = None if trainer is None else trainer.max_steps
                raise ValueError(
                    f"lr_schedule 'cosine' decays over trainer.max_steps or max_time; the trainer has neither "
                    f"(max_steps {max_steps}, no max_time)"
                )

        def factor(step: int) -> float:
            return lr_factor(
                step,
                warmup_steps=cfg.warmup_steps,
                schedule=cfg.lr_schedule,
                min_lr_ratio=cfg.min_lr_ratio,
                progress=self.budget_progress(),
            )

        return factor
