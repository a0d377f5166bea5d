"""LWM's released VQGAN (a pickled Flax parameter dict) -> lwm VQGAN, without jax or flax.

LWM's Flax VQGAN is the same network as ours op for op: GroupNorm(32, eps 1e-6), 'SAME' 3x3
convs, a 1x1 shortcut conv where a ResNet block changes channels, no attention (LWM's
attn_resolutions=(), no_attn_mid_block=True), stride-2 downsampling after padding right and
bottom by one, nearest x2 upsampling then a conv, nearest-codebook (squared distance) codes. So
weights map one to one through the key map below; the only moves are layout (Flax kernels are
[kh, kw, in, out], NHWC) and quant_conv / post_quant_conv, which we keep inside the encoder and
decoder. One difference is not in the weights: LWM's decode clips frames to [-1, 1], our
VQGAN.decode returns them unclipped (its consumers clamp).

    model = from_lwm_vqgan("path/to/LWM-Chat-1M-Jax/vqgan")  # the file LWM passes as vqgan_checkpoint
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import torch

from lwm.interop.keymap import KeyMap
from lwm.interop.vqgan_pickle import read_vqgan_pickle
from lwm.vision.vqgan import VQGAN
from lwm.vision.vqgan_config import TOKENS_PER_FRAME, VQGANConfig

# ---------------------------------------------------------------------------------------- key map


def _conv(ours: str, theirs: str) -> dict[str, str]:
    return {f"{ours}.weight": f"{theirs}/kernel", f"{ours}.bias": f"{theirs}/bias"}


def _norm(ours: str, theirs: str) -> dict[str, str]:
    return {f"{ours}.weight": f"{theirs}/scale", f"{ours}.bias": f"{theirs}/bias"}


def _resnet(ours: str, theirs: str) -> dict[str, str]:
    # Flax numbers each module type in creation order: norm, conv, norm, conv, then the shortcut.
    return {
        **_norm(f"{ours}.norm1", f"{theirs}/GroupNorm_0"),
        **_conv(f"{ours}.conv1", f"{theirs}/Conv_0"),
        **_norm(f"{ours}.norm2", f"{theirs}/GroupNorm_1"),
        **_conv(f"{ours}.conv2", f"{theirs}/Conv_1"),
        **_conv(f"{ours}.shortcut", f"{theirs}/Conv_2"),
    }


# ours -> LWM's Flax path, by parameter; "{i}" is the level, "{j}" the ResNet block within it.
# decoder.up.{i} is UpsamplingBlock_{i}: LWM's decoder creates its levels deepest first
# (reversed(range(num_resolutions))), the order our decoder.up runs in.
KEY_MAP = {
    **_conv("encoder.conv_in", "encoder/Conv_0"),
    **_resnet("encoder.down.{i}.resnets.{j}", "encoder/DownsamplingBlock_{i}/ResnetBlock_{j}"),
    **_conv("encoder.down.{i}.downsample.conv", "encoder/DownsamplingBlock_{i}/Downsample_0/Conv_0"),
    **_resnet("encoder.mid.{j}", "encoder/MidBlock_0/ResnetBlock_{j}"),
    **_norm("encoder.norm_out", "encoder/GroupNorm_0"),
    **_conv("encoder.conv_out", "encoder/Conv_1"),
    **_conv("encoder.quant_conv", "quant_conv"),
    "quantizer.codebook.weight": "quantize/embeddings",
    **_conv("decoder.post_quant_conv", "post_quant_conv"),
    **_conv("decoder.conv_in", "decoder/Conv_0"),
    **_resnet("decoder.mid.{j}", "decoder/MidBlock_0/ResnetBlock_{j}"),
    **_resnet("decoder.up.{i}.resnets.{j}", "decoder/UpsamplingBlock_{i}/ResnetBlock_{j}"),
    **_conv("decoder.up.{i}.upsample.conv", "decoder/UpsamplingBlock_{i}/Upsample_0/Conv_0"),
    **_norm("decoder.norm_out", "decoder/GroupNorm_0"),
    **_conv("decoder.conv_out", "decoder/Conv_1"),
}
_KEYS = KeyMap(KEY_MAP, theirs="LWM VQGAN")

# LWM builds every GroupNorm with Flax's defaults.
FLAX_GROUPS, FLAX_EPS = 32, 1e-6


# ---------------------------------------------------------------------------------------- config


def _check_supported(params: dict[str, np.ndarray]) -> None:
    """Refuse LWM VQGAN options our VQGAN does not have, naming the parameter that shows them."""
    for key, value in params.items():
        if "AttnBlock_" in key:
            raise ValueError(
                f"parameter {key!r} belongs to an attention block; lwm's VQGAN has none "
                f"(supported: LWM's attn_resolutions=() and no_attn_mid_block=True)"
            )
        if re.search(r"ResnetBlock_\d+/Conv_2/kernel$", key) and value.shape[:2] != (1, 1):
            raise ValueError(
                f"parameter {key!r} is a {value.shape[0]}x{value.shape[1]} shortcut conv (use_conv_shortcut=True); "
                f"lwm's VQGAN supports only the 1x1 shortcut"
            )


def _shape(params: dict[str, np.ndarray], key: str, ndim: int) -> tuple[int, ...]:
    if key not in params:
        raise ValueError(f"parameter {key!r} is missing; not an LWM VQGAN parameter dict?")
    shape = tuple(params[key].shape)
    if len(shape) != ndim:
        raise ValueError(f"parameter {key!r} has shape {shape}, expected {ndim} dimensions")
    return shape


def _count(params: dict[str, np.ndarray], prefix: str) -> int:
    """How many submodules prefix0, prefix1, ... the params hold."""
    found = {int(m.group(1)) for k in params if (m := re.match(re.escape(prefix) + r"(\d+)/", k))}
    if not found:
        raise ValueError(f"no parameters under {prefix + '0/'!r}; not an LWM VQGAN parameter dict?")
    if found != set(range(len(found))):
        raise ValueError(f"parameters under {prefix + 'N/'!r} should be numbered 0, 1, ...; found N in {sorted(found)}")
    return len(found)


def vqgan_config_from_params(params: dict[str, np.ndarray]) -> VQGANConfig:
    """A VQGANConfig with every shape read from LWM's parameter shapes; resolution is the one that
    gives 16x16 codes (256 for the released VQGAN)."""
    _check_supported(params)
    n_levels = _count(params, "encoder/DownsamplingBlock_")
    base = _shape(params, "encoder/Conv_0/kernel", 4)[3]  # [3, 3, 3, hidden]
    level = "encoder/DownsamplingBlock_{}/ResnetBlock_0/Conv_0/kernel"
    channels = [_shape(params, level.format(i), 4)[3] for i in range(n_levels)]
    if channels[0] != base:
        raise ValueError(
            f"{level.format(0)!r} has {channels[0]} output channels but 'encoder/Conv_0/kernel' {base} "
            f"(channel_mult[0] = {channels[0] / base:g}); lwm's VQGAN needs channel_mult[0] == 1"
        )
    bad = [(level.format(i), c) for i, c in enumerate(channels) if c % base]
    if bad:
        raise ValueError(f"level channels {bad} are not multiples of hidden_channels {base} ('encoder/Conv_0/kernel')")
    n_codes, code_dim = _shape(params, "quantize/embeddings", 2)
    return VQGANConfig(
        resolution=math.isqrt(TOKENS_PER_FRAME) * 2 ** (n_levels - 1),  # 16 codes a side
        base_channels=base,
        channel_mult=tuple(c // base for c in channels),
        layers_per_block=_count(params, "encoder/DownsamplingBlock_0/ResnetBlock_"),
        z_channels=_shape(params, "encoder/Conv_1/kernel", 4)[3],
        n_codes=n_codes,
        code_dim=code_dim,
        norm_groups=FLAX_GROUPS,
        norm_eps=FLAX_EPS,
    )


# ---------------------------------------------------------------------------------------- weights


def _listing(keys: list[str], limit: int = 8) -> str:
    return ", ".join(map(repr, keys[:limit])) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def vqgan_state_dict_from_params(params: dict[str, np.ndarray], config: VQGANConfig) -> dict[str, torch.Tensor]:
    """LWM's flat parameter dict -> our VQGAN's state dict (copies); every parameter is used once."""
    _check_supported(params)
    with torch.device("meta"):
        expected = VQGAN(config).state_dict()
    theirs_to_ours = _KEYS.to_theirs({k: k for k in expected})  # {LWM key: our key}
    missing = sorted(set(theirs_to_ours) - set(params))
    unused = sorted(set(params) - set(theirs_to_ours))
    if missing or unused:
        raise ValueError(
            f"LWM VQGAN parameters do not match lwm's VQGAN ({config}): "
            f"missing {_listing(missing) or 'none'}; unused {_listing(unused) or 'none'}"
        )
    state = {}
    for theirs, ours in theirs_to_ours.items():
        value = params[theirs]
        if theirs.endswith("/kernel") and value.ndim == 4:
            value = value.transpose(3, 2, 0, 1)  # [kh, kw, in, out] -> [out, in, kh, kw]
        if value.shape != tuple(expected[ours].shape):
            raise ValueError(
                f"parameter {theirs!r} -> {ours!r} has shape {value.shape}, expected {tuple(expected[ours].shape)}"
            )
        state[ours] = torch.from_numpy(np.array(value, order="C"))  # a copy: shares nothing with params
    return state


def from_lwm_vqgan(path: str | Path, dtype: torch.dtype | None = None) -> VQGAN:
    """Our VQGAN with the weights of LWM's VQGAN parameter pickle at `path` (config from its shapes)."""
    params = read_vqgan_pickle(path)
    try:
        config = vqgan_config_from_params(params)
        state = vqgan_state_dict_from_params(params, config)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    with torch.device("meta"):
        model = VQGAN(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()
