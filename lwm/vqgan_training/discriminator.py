"""The VQGAN's adversary: a PatchGAN discriminator, hinge losses and the adaptive GAN weight.

As in taming-transformers (VQGAN, Esser et al. 2021): the discriminator scores overlapping
patches (pix2pix's NLayerDiscriminator); it is trained with the hinge loss; the decoder gets
-mean(D(recon)) weighted by

    lambda = ||grad_L rec_loss|| / (||grad_L gan_loss|| + 1e-4),  clamped to [0, 1e4], no gradient,

with L the decoder's last layer, so the GAN term never swamps the reconstruction; and the GAN
only joins after `disc_start` steps, once reconstructions are worth judging.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GANConfig:
    enabled: bool = False
    disc_start: int = 2000  # steps of pure reconstruction before the GAN joins
    disc_weight: float = 0.8  # factor on the adaptive weight (taming's disc_weight)
    channels: int = 64  # first layer's channels; doubled per layer up to 8x
    n_layers: int = 3  # stride-2 layers (3: 70x70 receptive field at 256x256)
    lr: float = 1e-4  # the discriminator's own Adam learning rate

    def __post_init__(self) -> None:
        if self.disc_start < 0:
            raise ValueError(f"GANConfig.disc_start must be >= 0 steps, got {self.disc_start}")
        if self.disc_weight < 0:
            raise ValueError(f"GANConfig.disc_weight must be >= 0, got {self.disc_weight}")
        if self.channels < 1 or self.n_layers < 1:
            raise ValueError(f"GANConfig.channels and n_layers must be >= 1, got {self.channels} and {self.n_layers}")
        if self.lr <= 0:
            raise ValueError(f"GANConfig.lr must be > 0, got {self.lr}")


class PatchDiscriminator(nn.Module):
    """(B, 3, H, W) -> patch logits (B, 1, h, w): conv 4x4/2 + LeakyReLU, n_layers - 1 x (conv 4x4/2 + BN +
    LeakyReLU), conv 4x4/1 + BN + LeakyReLU, conv 4x4/1 -> 1 channel."""

    def __init__(self, channels: int = 64, n_layers: int = 3, in_channels: int = 3):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_channels, channels, 4, 2, 1), nn.LeakyReLU(0.2, True)]
        c = channels
        for i in range(1, n_layers + 1):
            c_out = channels * min(2**i, 8)
            stride = 2 if i < n_layers else 1
            layers += [nn.Conv2d(c, c_out, 4, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.LeakyReLU(0.2, True)]
            c = c_out
        layers.append(nn.Conv2d(c, 1, 4, 1, 1))
        self.net = nn.Sequential(*layers)
        for m in self.modules():  # pix2pix / taming init
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0.0, 0.02)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.normal_(m.weight, 1.0, 0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def hinge_d_loss(logits_real: torch.Tensor, logits_fake: torch.Tensor) -> torch.Tensor:
    """The discriminator's hinge loss: real patches pushed above +1, fake ones below -1."""
    return 0.5 * (F.relu(1.0 - logits_real).mean() + F.relu(1.0 + logits_fake).mean())


def generator_loss(logits_fake: torch.Tensor) -> torch.Tensor:
    """The generator's (decoder's) adversarial loss."""
    return -logits_fake.mean()


def adaptive_weight(
    rec_loss: torch.Tensor, gan_loss: torch.Tensor, last_layer: torch.Tensor, max_weight: float = 1e4, eps: float = 1e-4
) -> torch.Tensor:
    """||d rec_loss / d last_layer|| / (||d gan_loss / d last_layer|| + eps), clamped to [0, max_weight],
    detached. Both losses must still have their graphs (they are kept for the real backward)."""
    rec_grad = torch.autograd.grad(rec_loss, last_layer, retain_graph=True)[0]
    gan_grad = torch.autograd.grad(gan_loss, last_layer, retain_graph=True)[0]
    return (rec_grad.norm() / (gan_grad.norm() + eps)).clamp(0.0, max_weight).detach()
