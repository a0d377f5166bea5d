"""diffusers VQModel <-> lwm VQGAN.

Our blocks are diffusers' op for op (lwm.vision.blocks), so weights map one to one through the
key map below; the only moves are quant_conv / post_quant_conv, which we keep inside the encoder
and decoder. diffusers is a dev dependency: it is imported inside the functions.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from lwm.disk.weights import check_safetensors
from lwm.interop.keymap import KeyMap
from lwm.vision.vqgan import VQGAN
from lwm.vision.vqgan_config import TOKENS_PER_FRAME, VQGANConfig

# Sub-modules of one ResNet block: ours -> diffusers'.
_RESNET = {"norm1": "norm1", "conv1": "conv1", "norm2": "norm2", "conv2": "conv2", "shortcut": "conv_shortcut"}
# Where the ResNet blocks live; "{i}" is the block (resolution level), "{j}" the ResNet within it.
_RESNETS_AT = {
    "encoder.down.{i}.resnets.{j}": "encoder.down_blocks.{i}.resnets.{j}",
    "encoder.mid.{j}": "encoder.mid_block.resnets.{j}",
    "decoder.mid.{j}": "decoder.mid_block.resnets.{j}",
    "decoder.up.{i}.resnets.{j}": "decoder.up_blocks.{i}.resnets.{j}",
}
# ours -> diffusers' VQModel, by module; a parameter keeps its name (.weight / .bias).
KEY_MAP = {
    "encoder.conv_in": "encoder.conv_in",
    "encoder.down.{i}.downsample.conv": "encoder.down_blocks.{i}.downsamplers.0.conv",
    "encoder.norm_out": "encoder.conv_norm_out",
    "encoder.conv_out": "encoder.conv_out",
    "encoder.quant_conv": "quant_conv",
    "quantizer.codebook": "quantize.embedding",
    "decoder.post_quant_conv": "post_quant_conv",
    "decoder.conv_in": "decoder.conv_in",
    "decoder.up.{i}.upsample.conv": "decoder.up_blocks.{i}.upsamplers.0.conv",
    "decoder.norm_out": "decoder.conv_norm_out",
    "decoder.conv_out": "decoder.conv_out",
    **{f"{ours}.{a}": f"{theirs}.{b}" for ours, theirs in _RESNETS_AT.items() for a, b in _RESNET.items()},
}


_KEYS = KeyMap(KEY_MAP, theirs="diffusers", suffix="weight|bias")


def to_diffusers_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _KEYS.to_theirs(state_dict)


def from_diffusers_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _KEYS.to_ours(state_dict)


# ---------------------------------------------------------------------------------------- config

# diffusers' VQModel defaults, for configs (plain dicts) that leave options out.
_DIFFUSERS_DEFAULTS = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",),
    up_block_types=("UpDecoderBlock2D",),
    block_out_channels=(64,),
    layers_per_block=1,
    act_fn="silu",
    latent_channels=3,
    num_vq_embeddings=256,
    norm_num_groups=32,
    vq_embed_dim=None,
    norm_type="group",
    mid_block_add_attention=True,
)


def config_from_diffusers(diffusers_config, **overrides) -> VQGANConfig:
    """A VQGANConfig from a VQModel's config (or its dict). resolution defaults to the one that gives
    16x16 codes (256 for aMUSEd's model); overrides change any field."""
    cfg = {**_DIFFUSERS_DEFAULTS, **dict(diffusers_config)}
    if cfg.get("_class_name", "VQModel") != "VQModel":
        raise ValueError(f"expected a diffusers VQModel config, got _class_name {cfg['_class_name']!r}")
    channels = list(cfg["block_out_channels"])
    n = len(channels)
    required = {
        "in_channels": 3,
        "out_channels": 3,
        "act_fn": "silu",
        "norm_type": "group",
        "mid_block_add_attention": False,
        "down_block_types": ["DownEncoderBlock2D"] * n,
        "up_block_types": ["UpDecoderBlock2D"] * n,
    }
    bad = {k: cfg[k] for k, want in required.items() if (list(cfg[k]) if isinstance(want, list) else cfg[k]) != want}
    if bad:
        needed = {k: required[k] for k in bad}
        raise ValueError(f"unsupported VQModel options {bad}; lwm's VQGAN (aMUSEd's VQ model) needs {needed}")
    if any(c % channels[0] for c in channels):
        raise ValueError(
            f"block_out_channels {channels} must be multiples of the first, {channels[0]} (base_channels x channel_mult)"
        )
    fields = dict(
        base_channels=channels[0],
        channel_mult=tuple(c // channels[0] for c in channels),
        layers_per_block=cfg["layers_per_block"],
        z_channels=cfg["latent_channels"],
        n_codes=cfg["num_vq_embeddings"],
        code_dim=cfg["vq_embed_dim"] or cfg["latent_channels"],
        norm_groups=cfg["norm_num_groups"],
        resolution=math.isqrt(TOKENS_PER_FRAME) * 2 ** (n - 1),  # 16 codes a side
    )
    fields.update(overrides)
    return VQGANConfig(**fields)


def config_to_diffusers(config: VQGANConfig) -> dict:
    """VQModel(**kwargs) arguments for `config`, with aMUSEd's flags (codes decode by lookup)."""
    n = len(config.channel_mult)
    return dict(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=config.block_out_channels,
        layers_per_block=config.layers_per_block,
        act_fn="silu",
        latent_channels=config.z_channels,
        sample_size=config.resolution,
        num_vq_embeddings=config.n_codes,
        norm_num_groups=config.norm_groups,
        vq_embed_dim=config.code_dim,
        norm_type="group",
        mid_block_add_attention=False,
        lookup_from_codebook=True,
        force_upcast=True,
    )


# ---------------------------------------------------------------------------------------- import / export


def _load_vq_model(folder: Path):
    from diffusers import VQModel

    for sub in (None, "vqvae"):  # a VQModel folder, or a whole pipeline folder (aMUSEd)
        model_dir = folder / sub if sub else folder
        if (model_dir / "config.json").exists():
            for weights in sorted(model_dir.glob("*.safetensors")):
                check_safetensors(weights)  # before diffusers maps it
            return VQModel.from_pretrained(folder, subfolder=sub) if sub else VQModel.from_pretrained(folder)
    raise FileNotFoundError(f"{folder} is not a diffusers VQModel folder (no config.json, nor vqvae/config.json)")


def from_diffusers(vq_model_or_folder, *, dtype: torch.dtype | None = None, **overrides) -> VQGAN:
    """A VQGAN from a diffusers VQModel object, a folder written by its save_pretrained, or a
    pipeline folder with a vqvae/ subfolder. overrides change VQGANConfig fields. The weights are
    copied: the result shares no storage with a VQModel passed in."""
    if isinstance(vq_model_or_folder, (str, Path)):
        vq_model = _load_vq_model(Path(vq_model_or_folder))
    else:
        vq_model = vq_model_or_folder
    config = config_from_diffusers(vq_model.config, **overrides)
    state = from_diffusers_state_dict(vq_model.state_dict())
    state = {k: v.detach().to(dtype or v.dtype, copy=True) for k, v in state.items()}
    with torch.device("meta"):
        model = VQGAN(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model


def to_diffusers(model: VQGAN, dtype: torch.dtype | None = None):
    """A diffusers VQModel with `model`'s weights (copied)."""
    from diffusers import VQModel

    vq_model = VQModel(**config_to_diffusers(model.config))
    vq_model.load_state_dict(to_diffusers_state_dict(model.state_dict()), strict=True)  # copies into its own tensors
    return vq_model.to(dtype) if dtype is not None else vq_model
