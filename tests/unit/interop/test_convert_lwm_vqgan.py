"""LWM's VQGAN (a pickled Flax parameter dict) -> lwm VQGAN: parity with an independent
re-implementation of LWM's Flax forward pass, reading of jax / flax pickles, and bad input."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lwm_writers import RELEASED, SMALL, lwm_params

from lwm.interop.lwm_vqgan import (
    from_lwm_vqgan,
    read_vqgan_pickle,
    vqgan_config_from_params,
    vqgan_state_dict_from_params,
)
from lwm.vision.vqgan_config import VQGANConfig


def flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        out.update(flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {prefix + k: v})
    return out


# ---------------------------------------------------------------------------------------- reference
# LWM's Flax VQGAN (LargeWorldModel/LWM, lwm/vqgan.py) re-written in fp64 torch, NHWC, straight on
# the parameter tree; it shares no code with lwm.vision.


def t(a) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a)).double()


def ref_conv(x, p, stride=1, same=True):
    """flax nn.Conv: x (B, H, W, Cin), kernel [kh, kw, Cin, Cout]; 'SAME' pads (k-1)/2 each side."""
    k = t(p["kernel"])
    y = F.conv2d(
        x.permute(0, 3, 1, 2),
        k.permute(3, 2, 0, 1),
        t(p["bias"]),
        stride=stride,
        padding=k.shape[0] // 2 if same else 0,
    )
    return y.permute(0, 2, 3, 1)


def ref_group_norm(x, p, groups=32, eps=1e-6):
    """flax nn.GroupNorm defaults: 32 groups of adjacent channels, var = E[x^2] - E[x]^2 clipped at 0."""
    b, h, w, c = x.shape
    g = x.reshape(b, h, w, groups, c // groups)
    mean = g.mean((1, 2, 4), keepdim=True)
    var = ((g * g).mean((1, 2, 4), keepdim=True) - mean**2).clamp_min(0)
    return ((g - mean) * torch.rsqrt(var + eps)).reshape(b, h, w, c) * t(p["scale"]) + t(p["bias"])


def ref_resnet(x, p):
    h = ref_conv(F.silu(ref_group_norm(x, p["GroupNorm_0"])), p["Conv_0"])
    h = ref_conv(F.silu(ref_group_norm(h, p["GroupNorm_1"])), p["Conv_1"])
    if h.shape[-1] != x.shape[-1]:
        x = ref_conv(x, p["Conv_2"])
    return h + x


def ref_encoder(p, frames: np.ndarray, n_levels: int, n_res: int) -> torch.Tensor:
    """frames (T, H, W, 3) uint8 -> encoder + quant_conv output (T, h, w, code_dim)."""
    x = t(frames) / 127.5 - 1
    enc = p["encoder"]
    h = ref_conv(x, enc["Conv_0"])
    for i in range(n_levels):
        block = enc[f"DownsamplingBlock_{i}"]
        for j in range(n_res):
            h = ref_resnet(h, block[f"ResnetBlock_{j}"])
        if i != n_levels - 1:
            h = F.pad(h, (0, 0, 0, 1, 0, 1))  # (0, 1) on W and on H
            h = ref_conv(h, block["Downsample_0"]["Conv_0"], stride=2, same=False)  # (B, H, W, C) -> (B, H/2, W/2, C)
    h = ref_resnet(ref_resnet(h, enc["MidBlock_0"]["ResnetBlock_0"]), enc["MidBlock_0"]["ResnetBlock_1"])
    h = ref_conv(F.silu(ref_group_norm(h, enc["GroupNorm_0"])), enc["Conv_1"])
    return ref_conv(h, p["quant_conv"])


def ref_quantize(p, z: torch.Tensor) -> torch.Tensor:
    """z (T, h, w, D) -> codes (T, h*w): argmin of the squared distance, written out as LWM does."""
    e = t(p["quantize"]["embeddings"])
    flat_z = z.reshape(-1, z.shape[-1])
    d = (flat_z**2).sum(1, keepdim=True) + (e**2).sum(1)[None] - 2 * flat_z @ e.T  # (T*h*w, n_codes)
    return d.argmin(1).reshape(z.shape[0], -1)


def ref_decode(p, codes: torch.Tensor, n_levels: int, n_res: int) -> torch.Tensor:
    """codes (T, h*w) -> frames (T, H, W, 3), before LWM's final clip to [-1, 1]."""
    side = int(codes.shape[1] ** 0.5)
    z_q = t(p["quantize"]["embeddings"])[codes].reshape(codes.shape[0], side, side, -1)
    dec = p["decoder"]
    h = ref_conv(ref_conv(z_q, p["post_quant_conv"]), dec["Conv_0"])
    h = ref_resnet(ref_resnet(h, dec["MidBlock_0"]["ResnetBlock_0"]), dec["MidBlock_0"]["ResnetBlock_1"])
    for k in range(n_levels):
        block = dec[f"UpsamplingBlock_{k}"]
        for j in range(n_res + 1):
            h = ref_resnet(h, block[f"ResnetBlock_{j}"])
        if n_levels - 1 - k != 0:
            h = h.repeat_interleave(2, 1).repeat_interleave(2, 2)  # nearest x2: (B, H, W, C) -> (B, 2H, 2W, C)
            h = ref_conv(h, block["Upsample_0"]["Conv_0"])
    return ref_conv(F.silu(ref_group_norm(h, dec["GroupNorm_0"])), dec["Conv_1"])


# ---------------------------------------------------------------------------------------- jax / flax pickles
# What a tree of jax arrays inside flax FrozenDicts pickles to, written without jax or flax:
# FrozenDict.__reduce__ is (FrozenDict, (dict,)); jax.Array.__reduce__ is (reconstruct, (numpy's
# reconstructor, its args, its state, {"weak_type": ...})). Stand-in classes pickle as references
# to those names.

FOREIGN: dict[object, str] = {}


def foreign(module: str, name: str):
    cls = type(name, (), {})
    FOREIGN[cls] = f"{module}\n{name}\n"
    return cls


FROZEN_DICT = foreign("flax.core.frozen_dict", "FrozenDict")
# numpy 1's name for its reconstructor, as in pickles written before numpy 2.
FOREIGN[np.empty(0).__reduce__()[0]] = "numpy.core.multiarray\n_reconstruct\n"


class ForeignPickler(pickle._Pickler):  # the Python pickler: its save_global can be overridden
    def save_global(self, obj, name=None):
        if obj in FOREIGN:
            self.write(pickle.GLOBAL + FOREIGN[obj].encode())
            self.memoize(obj)
        else:
            super().save_global(obj, name)


class FrozenDictLike:
    def __init__(self, d):
        self.d = d

    def __reduce__(self):
        return FROZEN_DICT, (self.d,)


class JaxArrayLike:
    def __init__(self, a, reconstruct):
        self.a, self.reconstruct = a, reconstruct

    def __reduce__(self):
        fun, args, state = self.a.__reduce__()
        return self.reconstruct, (fun, args, state, {"weak_type": False})


def as_jax_flax(tree, reconstruct):
    return FrozenDictLike(
        {
            k: as_jax_flax(v, reconstruct) if isinstance(v, dict) else JaxArrayLike(v, reconstruct)
            for k, v in tree.items()
        }
    )


def dump_foreign(obj, path, protocol=4):
    with open(path, "wb") as f:
        ForeignPickler(f, protocol=protocol).dump(obj)


# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(parameter tree, frames (T, 32, 32, 3) uint8, the reference's encoder output for them,
    path of the tree's plain pickle)."""
    rng = np.random.default_rng(0)
    tree = lwm_params(**SMALL, rng=rng)
    frames = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    z = ref_encoder(tree, frames, len(SMALL["mult"]), SMALL["n_res"])
    # Codebook on the scale of the encoder's outputs, so the codes spread over it.
    codebook = float(z.std()) * rng.standard_normal((SMALL["n_codes"], SMALL["code_dim"]))
    tree["quantize"]["embeddings"] = codebook.astype(np.float32)
    path = tmp_path_factory.mktemp("lwm_vqgan") / "vqgan"
    path.write_bytes(pickle.dumps(tree))
    return tree, frames, z, path


# ---------------------------------------------------------------------------------------- parity


def test_codes_and_frames_match_lwm_reference(small):
    tree, frames, z, path = small
    n_levels, n_res = len(SMALL["mult"]), SMALL["n_res"]
    model = from_lwm_vqgan(path)
    assert model.config.resolution == 32 and model.config.latent_size == 16

    ref_codes = ref_quantize(tree, z)
    codes = model.encode(torch.from_numpy(frames))  # (T, H, W, 3) uint8, scaled to [-1, 1] as LWM's input
    assert len(torch.unique(ref_codes)) >= 16  # the codes are spread, so a wrong mapping would show
    assert torch.equal(codes, ref_codes)

    ref_raw = ref_decode(tree, ref_codes, n_levels, n_res)  # (T, H, W, 3)
    ref_frames = ref_raw.clamp(-1, 1)  # LWM's decode clips; ours leaves that to its consumers
    assert 0.2 < (ref_raw.abs() < 1).double().mean() < 1  # both clipped and unclipped values occur
    out = model.decode(codes).permute(0, 2, 3, 1).double()  # (T, 3, H, W) -> (T, H, W, 3)
    torch.testing.assert_close(out.clamp(-1, 1), ref_frames, atol=1e-4, rtol=0)
    torch.testing.assert_close(out, ref_raw, atol=1e-4, rtol=0)


def test_dtype(small):
    model = from_lwm_vqgan(small[3], dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_config_from_released_shapes():
    """LWM's released VQGAN (shapes only, no memory) is our "lwm" preset: 256x256 -> 16x16 codes."""
    params = flat(lwm_params(**RELEASED))
    assert vqgan_config_from_params(params) == VQGANConfig.from_preset("lwm")


def test_config_from_three_levels():
    config = vqgan_config_from_params(flat(lwm_params(hidden=32, mult=(1, 2, 2), n_res=1, z=4, n_codes=16, code_dim=4)))
    assert (config.resolution, config.channel_mult, config.layers_per_block, config.z_channels) == (64, (1, 2, 2), 1, 4)
    assert (config.n_codes, config.code_dim, config.norm_groups, config.norm_eps) == (16, 4, 32, 1e-6)


# ---------------------------------------------------------------------------------------- reading


@pytest.mark.parametrize(
    "reconstruct", [("jax._src.array", "_reconstruct_array"), ("jax._src.device_array", "reconstruct_device_array")]
)
def test_reads_frozen_dicts_of_jax_arrays(small, tmp_path, reconstruct):
    tree = small[0]
    path = tmp_path / "vqgan"
    dump_foreign(as_jax_flax(tree, foreign(*reconstruct)), path)
    raw = path.read_bytes()
    assert b"flax.core.frozen_dict\nFrozenDict" in raw and "\n".join(reconstruct).encode() in raw
    got, want = read_vqgan_pickle(path), flat(tree)
    assert got.keys() == want.keys() and got["encoder/Conv_0/kernel"].dtype == np.float32
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_reads_variables_dict(small, tmp_path):
    path = tmp_path / "vqgan"
    path.write_bytes(pickle.dumps({"params": small[0]}, protocol=2))
    assert read_vqgan_pickle(path).keys() == flat(small[0]).keys()


@pytest.mark.parametrize("module, name", [("flax.core.scope", "Scope"), ("jax.numpy", "asarray"), ("os", "system")])
def test_refuses_other_globals(tmp_path, module, name):
    path = tmp_path / "vqgan"
    dump_foreign({"encoder": foreign(module, name)}, path)
    with pytest.raises(ValueError, match=f"{module}.{name}"):
        read_vqgan_pickle(path)


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        read_vqgan_pickle(tmp_path / "nothing_here")
    (tmp_path / "text").write_text("not a pickle at all\n")
    with pytest.raises(ValueError, match="not a readable pickle"):
        read_vqgan_pickle(tmp_path / "text")
    (tmp_path / "list").write_bytes(pickle.dumps([np.zeros(3)]))
    with pytest.raises(ValueError, match="holds a list, expected a dict"):
        read_vqgan_pickle(tmp_path / "list")
    (tmp_path / "str").write_bytes(pickle.dumps({"encoder": {"Conv_0": {"kernel": "weights"}}}))
    with pytest.raises(ValueError, match="'encoder/Conv_0/kernel' is a str"):
        read_vqgan_pickle(tmp_path / "str")


# ---------------------------------------------------------------------------------------- bad parameters


@pytest.fixture
def params(small):
    return read_vqgan_pickle(small[3])


def test_missing_and_unused_keys(params):
    config = vqgan_config_from_params(params)
    gone = "decoder/UpsamplingBlock_1/ResnetBlock_2/GroupNorm_1/scale"
    del params[gone]
    params["encoder/Extra_0/kernel"] = np.zeros((1, 1, 1, 1), np.float32)
    with pytest.raises(ValueError, match=f"missing '{gone}'.*unused 'encoder/Extra_0/kernel'"):
        vqgan_state_dict_from_params(params, config)


def test_shape_mismatch(params):
    config = vqgan_config_from_params(params)
    params["decoder/Conv_1/bias"] = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="'decoder/Conv_1/bias' -> 'decoder.conv_out.bias' has shape"):
        vqgan_state_dict_from_params(params, config)


def test_unsupported_options(params):
    attn = dict(params, **{"encoder/MidBlock_0/AttnBlock_0/Conv_0/kernel": np.zeros((1, 1, 64, 64), np.float32)})
    with pytest.raises(ValueError, match="'encoder/MidBlock_0/AttnBlock_0/Conv_0/kernel'.*attention"):
        vqgan_config_from_params(attn)
    key = "encoder/DownsamplingBlock_1/ResnetBlock_0/Conv_2/kernel"
    shortcut = dict(params, **{key: np.zeros((3, 3, 32, 64), np.float32)})
    with pytest.raises(ValueError, match=f"'{key}' is a 3x3 shortcut"):
        vqgan_config_from_params(shortcut)
    wide = flat(lwm_params(hidden=32, mult=(2, 4), n_res=1, z=4, n_codes=16, code_dim=4))
    with pytest.raises(ValueError, match=r"channel_mult\[0\] == 1"):
        vqgan_config_from_params(wide)
    with pytest.raises(ValueError, match="'encoder/Conv_0/kernel' is missing"):
        vqgan_config_from_params({k: v for k, v in params.items() if k != "encoder/Conv_0/kernel"})
