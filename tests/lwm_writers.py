"""Checkpoints in LWM's own formats, written here from random parameters (no downloads): the language
model as tux's streaming msgpack records with Flax's array encoding (write_lwm), and the VQGAN's Flax
parameter dict (lwm_params). tests/integration/test_convert_lwm.py and tests/unit/interop/ read them
back through lwm.interop."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import torch

from lwm.paths import REPO

TOKENIZER = REPO / "data" / "sample" / "tokenizer.model"  # 4096 text ids
CFG = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=4096,
    vision_vocab_size=8448,
    max_sequence_length=512,
    rms_norm_eps=1e-6,
    theta=5000.0,
)
LAYER = {
    "attention/wq/kernel": "DD",
    "attention/wk/kernel": "DD",
    "attention/wv/kernel": "DD",
    "attention/wo/kernel": "DD",
    "feed_forward/w1/kernel": "DF",
    "feed_forward/w3/kernel": "DF",
    "feed_forward/w2/kernel": "FD",
    "attention_norm/kernel": "D",
    "ffn_norm/kernel": "D",
}


# ---------------------------------------------------------------------------------------- LWM's format, written here


def random_params(cfg: dict, vision: bool = True, seed: int = 0) -> dict[str, np.ndarray]:
    """Per-layer Flax parameters, '/'-joined keys, float32."""
    rng = np.random.default_rng(seed)
    size = {"D": cfg["hidden_size"], "F": cfg["intermediate_size"]}
    p = {
        "transformer/wte/embedding": rng.normal(0, 0.5, (cfg["vocab_size"], size["D"])),
        "transformer/ln_f/kernel": rng.normal(1, 0.2, size["D"]),
        "lm_head/kernel": rng.normal(0, 0.12, (size["D"], cfg["vocab_size"])),
    }
    if vision:
        p["transformer/vte/embedding"] = rng.normal(0, 0.5, (cfg["vision_vocab_size"], size["D"]))
        p["vision_head/kernel"] = rng.normal(0, 0.12, (size["D"], cfg["vision_vocab_size"]))
    for i in range(cfg["num_hidden_layers"]):
        for leaf, dims in LAYER.items():
            shape = tuple(size[d] for d in dims)
            p[f"transformer/h/{i}/{leaf}"] = rng.normal(1, 0.2, shape) if dims == "D" else rng.normal(0, 0.2, shape)
    return {k: v.astype(np.float32) for k, v in p.items()}


def scanned(params: dict, n_layers: int) -> dict:
    """Per-layer leaves stacked on a leading layer axis, as nn.scan stores them."""
    out = {k: v for k, v in params.items() if "/h/" not in k}
    for leaf in LAYER:
        out[f"transformer/h/scan_decoder/{leaf}"] = np.stack(
            [params[f"transformer/h/{i}/{leaf}"] for i in range(n_layers)]
        )
    return out


def bf16_round(params: dict) -> dict:
    return {k: torch.from_numpy(v).to(torch.bfloat16).float().numpy() for k, v in params.items()}


def _array_bytes(a: np.ndarray, dtype: str) -> msgpack.ExtType:
    if dtype == "bfloat16":
        raw = torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    else:
        raw = np.ascontiguousarray(a, dtype=dtype).tobytes()
    return msgpack.ExtType(1, msgpack.packb((list(a.shape), dtype, raw), use_bin_type=True))


def leaf_bytes(a: np.ndarray, dtype: str, chunk_bytes: int) -> bytes:
    """What flax.serialization.to_bytes writes for one array leaf (chunked above chunk_bytes)."""
    itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    if a.size * itemsize <= chunk_bytes:
        return msgpack.packb(_array_bytes(a, dtype))
    flat, per = a.reshape(-1), max(1, chunk_bytes // itemsize)
    chunks = {str(j): _array_bytes(flat[s : s + per], dtype) for j, s in enumerate(range(0, flat.size, per))}
    return msgpack.packb(
        {"__msgpack_chunked_array__": True, "shape": {str(j): n for j, n in enumerate(a.shape)}, "chunks": chunks}
    )


def write_lwm(
    path: Path, params: dict, dtype: str = "float32", chunk_bytes: int = 2**30, prefix=(), extra: dict | None = None
) -> Path:
    """tux's StreamingCheckpointer layout: one msgpack [key, to_bytes(leaf)] record per leaf."""
    packer = msgpack.Packer()
    with open(path, "wb") as f:
        for key, value in params.items():
            f.write(packer.pack((list(prefix) + key.split("/"), leaf_bytes(value, dtype, chunk_bytes))))
        for key, value in (extra or {}).items():
            f.write(packer.pack((key.split("/"), leaf_bytes(value, "float32", chunk_bytes))))
    return path


# A small VQGAN in LWM's layout: 2 levels (32x32 frames -> 16x16 codes), a channel change in both
# halves (so shortcut convs exist), 64 codes of 8 dims.
SMALL = dict(hidden=32, mult=(1, 2), n_res=2, z=8, n_codes=64, code_dim=8)
RELEASED = dict(hidden=128, mult=(1, 2, 2, 4, 6), n_res=2, z=64, n_codes=8192, code_dim=64)


def lwm_params(hidden, mult, n_res, z, n_codes, code_dim, rng=None) -> dict:
    """A random parameter tree named as LWM's Flax VQGAN names it (modules numbered per type in
    creation order; kernels [kh, kw, in, out]). rng=None gives zero-memory arrays (shapes only)."""

    def array(shape, std, mean=0.0):
        if rng is None:
            return np.broadcast_to(np.float32(0), shape)
        return (mean + std * rng.standard_normal(shape)).astype(np.float32)

    def conv(k, cin, cout):
        return {"kernel": array((k, k, cin, cout), (k * k * cin) ** -0.5), "bias": array((cout,), 0.1)}

    def norm(c):
        return {"scale": array((c,), 0.1, mean=1.0), "bias": array((c,), 0.1)}

    def resnet(cin, cout):
        p = {
            "GroupNorm_0": norm(cin),
            "Conv_0": conv(3, cin, cout),
            "GroupNorm_1": norm(cout),
            "Conv_1": conv(3, cout, cout),
        }
        if cin != cout:
            p["Conv_2"] = conv(1, cin, cout)
        return p

    n = len(mult)
    encoder, c = {"Conv_0": conv(3, 3, hidden)}, hidden
    for i in range(n):
        block = {}
        for j in range(n_res):
            block[f"ResnetBlock_{j}"], c = resnet(c, hidden * mult[i]), hidden * mult[i]
        if i != n - 1:
            block["Downsample_0"] = {"Conv_0": conv(3, c, c)}
        encoder[f"DownsamplingBlock_{i}"] = block
    encoder.update(
        MidBlock_0={"ResnetBlock_0": resnet(c, c), "ResnetBlock_1": resnet(c, c)},
        GroupNorm_0=norm(c),
        Conv_1=conv(3, c, z),
    )

    c = hidden * mult[-1]
    decoder = {"Conv_0": conv(3, z, c), "MidBlock_0": {"ResnetBlock_0": resnet(c, c), "ResnetBlock_1": resnet(c, c)}}
    for k, level in enumerate(reversed(range(n))):  # created deepest level first: UpsamplingBlock_0 is level n-1
        block = {}
        for j in range(n_res + 1):
            block[f"ResnetBlock_{j}"], c = resnet(c, hidden * mult[level]), hidden * mult[level]
        if level != 0:
            block["Upsample_0"] = {"Conv_0": conv(3, c, c)}
        decoder[f"UpsamplingBlock_{k}"] = block
    decoder.update(GroupNorm_0=norm(c), Conv_1=conv(3, c, 3))

    return {
        "encoder": encoder,
        "decoder": decoder,
        "quantize": {"embeddings": array((n_codes, code_dim), 1.0)},
        "quant_conv": conv(1, z, code_dim),
        "post_quant_conv": conv(1, code_dim, z),
    }
