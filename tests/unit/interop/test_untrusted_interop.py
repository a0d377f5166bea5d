"""Files from outside that reach lwm.interop, crafted here to cost memory, time or a traceback:
each is refused quickly, before the allocation it asks for, with a message naming the file and
the field or leaf (issue 25, items 8-12).

Longer than most test files: one subject's tests kept together, beside the helpers they share.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import shutil
import struct
import time
import tracemalloc
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from lwm_writers import CFG, TOKENIZER, write_lwm
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from lwm.interop.bundle import read_bundle_info
from lwm.interop.convert_lwm import main as convert_main
from lwm.interop.hf import from_hf
from lwm.interop.lwm_params import read_params
from lwm.interop.lwm_vqgan import read_vqgan_pickle
from lwm.interop.msgpack_view import RecordReader, decode

MiB = 2**20


def refused_cheaply(fn, error, match: str, limit: int = 16 * MiB) -> None:
    """fn() raises `error` matching `match` within 5 s, having allocated under `limit` bytes on the way."""
    tracemalloc.start()  # numpy's and Python's allocations are both traced
    t0 = time.perf_counter()
    try:
        with pytest.raises(error, match=match):
            fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit and time.perf_counter() - t0 < 5, (peak, time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------- 8: VQGAN pickles

_RECONSTRUCT = np.empty(0).__reduce__()[0]  # numpy's _reconstruct


class Reduce:
    """Pickles as fun(*args), then BUILD with `state` when given."""

    def __init__(self, fun, args, state=None):
        self.fun, self.args, self.state = fun, args, state

    def __reduce__(self):
        return (self.fun, self.args) if self.state is None else (self.fun, self.args, self.state)


def vqgan_file(tmp_path: Path, leaf, protocol: int = 4) -> Path:
    path = tmp_path / "vqgan"
    path.write_bytes(pickle.dumps({"encoder": {"Conv_0": {"kernel": leaf}}}, protocol=protocol))
    return path


@pytest.mark.parametrize(
    "leaf,message",
    [
        # 14 GB asked for by a pickle of a few hundred bytes; numpy.ndarray(shape) fills nothing
        (Reduce(np.ndarray, ((3_500_000_000,), np.dtype("f4"))), r"calls numpy\.ndarray"),
        (Reduce(np.ndarray, ((4,), np.dtype("f4"))), r"calls numpy\.ndarray"),  # uninitialised memory as weights
        (Reduce(_RECONSTRUCT, (np.ndarray, (3_500_000_000,), b"b")), r"_reconstruct called with \(\(3500000000,\)"),
        (
            Reduce(_RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (10**9,), np.dtype("f4"), False, b"\0" * 4)),
            r"shape \(1000000000,\) and dtype float32 takes 4000000000 bytes, but the pickle holds 4",
        ),
        (
            Reduce(_RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (2,), np.dtype("O"), False, [1, 2])),
            "expected a float dtype",
        ),
        (Reduce(_RECONSTRUCT, (np.ndarray, (0,), b"b")), "is an array without its data"),
        (Reduce(__import__("_codecs").encode, ("x", "zlib")), r"_codecs\.encode with encoding 'zlib'"),
    ],
    ids=["ndarray-14GB", "ndarray-uninitialised", "reconstruct-shape", "short-data", "object", "no-state", "codec"],
)
def test_vqgan_pickle_arrays_come_only_from_their_bytes(tmp_path, leaf, message):
    path = vqgan_file(tmp_path, leaf)
    assert path.stat().st_size < 400
    refused_cheaply(lambda: read_vqgan_pickle(path), ValueError, f"{re.escape(str(path))}.*{message}")


def test_vqgan_pickle_nested_deeply_is_refused(tmp_path):
    n = 5000  # {"a": {"a": ... {}}}: the dicts pushed, then n SETITEMs
    path = tmp_path / "deep"
    path.write_bytes(b"\x80\x02" + b"}X\x01\x00\x00\x00a" * n + b"}" + b"s" * n + b".")
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: parameter dicts nested deeper than 16 levels"):
        read_vqgan_pickle(path)


# ---------------------------------------------------------------------------------------- 9: msgpack lengths and time


def test_a_declared_length_is_checked_against_the_file_before_allocating(tmp_path):
    path = tmp_path / "params"  # one record [["w"], bin32 of 2^32-1 bytes]: 14 bytes, not 4 GiB
    path.write_bytes(b"\x92\x91\xa1w\xc6\xff\xff\xff\xff" + b"\0" * 5)
    refused_cheaply(lambda: list(read_params(f"params::{path}")), ValueError, "declares a 4294967295-byte value")
    path.write_bytes(b"\x92\x91\xa1w\xdf\xff\xff\xff\xff" + b"\0" * 4 * MiB)  # a map of 2^32-1 entries
    refused_cheaply(lambda: list(read_params(f"params::{path}")), ValueError, "needs at least 8589934599 bytes")
    with pytest.raises(IndexError, match="needs at least 4294967300 bytes"):
        decode(memoryview(b"\xdd\xff\xff\xff\xff\x00"))


class CountingReads(io.BytesIO):
    reads = 0

    def read(self, n=-1):
        self.reads += 1
        return super().read(n)


def test_a_record_read_in_pieces_is_decoded_a_logarithmic_number_of_times():
    """A 300 KB record read 4 KiB at a time: each read doubles what is held, so the record is decoded
    about log2(300 KB / 4 KiB) times, not once per 4 KiB (which made a 100 MB record take hours)."""
    record = msgpack.packb([["w"], list(range(100)) * 3000])
    f = CountingReads(record)
    (key, value), *rest = RecordReader(f, head=4096)
    assert key == ["w"] and value == list(range(100)) * 3000 and rest == []
    assert f.reads <= 10, f.reads


def test_msgpack_nesting_is_bounded():
    with pytest.raises(ValueError, match="nested deeper than 32 levels"):
        decode(memoryview(b"\x91" * 100_000 + b"\x00"))


# ---------------------------------------------------------------------------------------- 10: lwm-convert-lwm records


def _ext(shape, dtype, data: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(1, msgpack.packb([shape, dtype, data], use_bin_type=True))


def _chunked(shape: dict, chunks) -> bytes:
    return msgpack.packb({"__msgpack_chunked_array__": True, "shape": shape, "chunks": chunks}, use_bin_type=True)


BAD_LEAVES = {
    "shape-vs-data": (
        msgpack.packb(_ext([1000, 1000], "float32", b"\0" * 16)),
        "takes 4000000 bytes, but the record holds 16",
    ),
    "complex64": (msgpack.packb(_ext([2], "complex64", b"\0" * 16)), "dtype 'complex64' is not a parameter dtype"),
    "big-endian": (msgpack.packb(_ext([2], ">f4", b"\0" * 8)), "dtype '>f4' is not a parameter dtype"),
    "not-a-triple": (msgpack.packb(msgpack.ExtType(1, msgpack.packb([1, 2]))), "holds [shape, dtype, bytes]"),
    "shape-of-text": (msgpack.packb(_ext(["a"], "float32", b"")), "shape is ['a']"),
    "chunk-missing": (_chunked({"0": 2}, {"1": _ext([2], "float32", b"\0" * 8)}), "'chunks' must be a map"),
    "shape-a-list": (_chunked([2], {"0": _ext([2], "float32", b"\0" * 8)}), "'shape' must be a map"),
    "chunk-not-array": (_chunked({"0": 2}, {"0": 5}), "a chunk of a chunked array is a int"),
    "chunk-sizes": (_chunked({"0": 3}, {"0": _ext([2], "float32", b"\0" * 8)}), "chunks of 2 elements for shape"),
    "nested": (b"\x91" * 100_000 + b"\x00", "nested deeper than 32 levels"),
    "list-key": (b"\x81\x91\x00\x00", "has a key of type list"),
}


@pytest.mark.parametrize("case", sorted(BAD_LEAVES))
def test_malformed_records_exit_2_naming_the_file_and_the_leaf(tmp_path, capsys, case):
    raw, message = BAD_LEAVES[case]
    path = tmp_path / "params"
    path.write_bytes(msgpack.packb((["lm_head", "kernel"], raw), use_bin_type=True))
    assert convert_main(["--checkpoint", f"params::{path}", "--config", "debug", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: lm_head/kernel: " in err and message in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "change,message",
    [
        ({"hidden_size": "abc"}, "hidden_size must be a positive integer, got 'abc'"),
        ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
        ({"hidden_size": 30, "num_attention_heads": 2}, "hidden_size 30 / num_attention_heads 2 must be an even head"),
        ({"theta": -1}, "theta must be a positive number, got -1"),
    ],
)
def test_bad_lwm_configs_exit_2_naming_the_field(tmp_path, capsys, change, message):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**CFG, **change}))
    path = write_lwm(tmp_path / "params", {"lm_head/kernel": np.zeros((32, 4096), np.float32)})
    assert convert_main(["--checkpoint", f"params::{path}", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    assert f"{config}: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "leaf,value,message",
    [
        (
            "quantize/embeddings",
            np.zeros((64, 8), np.int32),
            "an array's dtype is dtype('int32'), expected a float dtype",
        ),
        ("encoder/Conv_0/kernel", np.zeros((3, 3, 3, 0), np.float32), "is an empty array (3, 3, 3, 0)"),
        (
            "quantize/embeddings",
            np.zeros((64, 9), np.float32),
            "'quant_conv/kernel' -> 'encoder.quant_conv.weight' has shape (8, 8, 1, 1), expected (9, 8, 1, 1)",
        ),
    ],
)
def test_malformed_vqgan_parameters_exit_2_naming_the_file(tmp_path, capsys, leaf, value, message):
    from lwm_writers import SMALL, lwm_params

    tree = lwm_params(**SMALL, rng=np.random.default_rng(0))
    *outer, last = leaf.split("/")
    node = tree
    for key in outer:
        node = node[key]
    node[last] = value
    vqgan = tmp_path / "vqgan"
    vqgan.write_bytes(pickle.dumps(tree))
    path = write_lwm(tmp_path / "params", {"lm_head/kernel": np.zeros((32, 4096), np.float32)})
    argv = ["--checkpoint", f"params::{path}", "--config", "debug", "--vqgan", str(vqgan), "--out", str(tmp_path / "o")]
    assert convert_main(argv) == 2
    err = capsys.readouterr().err
    assert f"{vqgan}: " in err and message in err, err


# ---------------------------------------------------------------------------------------- 11-12: Hugging Face folders


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """A 2-layer LLaMA saved whole (one/) and in shards (sharded/)."""
    root = tmp_path_factory.mktemp("hf")
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(root / "one")
    model.save_pretrained(root / "sharded", max_shard_size="100KB")
    return root


def edited(src: Path, dst: Path, name: str, **changes) -> Path:
    shutil.copytree(src, dst)
    raw = json.loads((dst / name).read_text())
    raw.update(changes)
    (dst / name).write_text(json.dumps(raw))
    return dst


@pytest.mark.parametrize(
    "change,message",
    [
        # a 10^6-layer model took 90 s and 4 GB to build before load_state_dict saw 2 layers
        ({"num_hidden_layers": 1_000_000}, "num_hidden_layers 1000000, but the weights hold 2 layers (0, 1)"),
        ({"hidden_size": "abc"}, "hidden_size must be a positive integer, got 'abc'"),
        ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
        ({"rms_norm_eps": "x"}, "rms_norm_eps must be a positive number, got 'x'"),
        ({"model_type": "gpt2"}, "model_type is 'gpt2'; the model types taken are ['llama', 'qwen2', 'qwen3']"),
        # these two were transformers' StrictDataclass tracebacks, the file not named
        ({"rope_scaling": "garbage"}, "rope_scaling must be an object (or null), got 'garbage'"),
        ({"num_attention_heads": 3, "num_key_value_heads": 1}, "num_attention_heads 3 must divide hidden_size 64"),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 must divide num_attention_heads 4"),
    ],
)
def test_hf_config_is_checked_before_a_model_is_built(hf_folders, tmp_path, change, message):
    folder = edited(hf_folders / "one", tmp_path / "m", "config.json", **change)
    match = re.escape(f"{folder / 'config.json'}: {message}")
    refused_cheaply(lambda: from_hf(folder), ValueError, match, limit=128 * MiB)  # transformers' config: ~40 MB


def test_hf_weights_are_compared_with_the_config_from_their_headers(hf_folders, tmp_path):
    folder = edited(hf_folders / "one", tmp_path / "m", "config.json", intermediate_size=200, head_dim=16)
    weights = folder / "model.safetensors"
    with pytest.raises(ValueError, match="the weights do not match") as e:
        from_hf(folder)
    assert f"model.layers.0.mlp.gate_proj.weight in {weights} is (112, 64), expected (200, 64)" in str(e.value)
    folder = edited(hf_folders / "one", tmp_path / "n", "config.json")
    weights = folder / "model.safetensors"
    state = load_file(weights)
    save_file({**state, "model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}, weights)  # a KeyError before
    with pytest.raises(ValueError, match=re.escape(f"unexpected model.layers.0.self_attn.q_proj.bias ({weights})")):
        from_hf(folder)
    save_file({k: v.to(torch.int32) if "norm" in k else v for k, v in state.items()}, weights)
    with pytest.raises(
        ValueError, match=re.escape(f"{weights}: weight 'model.layers.0.input_layernorm.weight' is not")
    ):
        from_hf(folder)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "{root}/outside.safetensors", "sub/../../x.safetensors"])
def test_index_entries_that_leave_the_folder_are_refused(hf_folders, tmp_path, shard):
    shutil.copy(hf_folders / "one" / "model.safetensors", tmp_path / "outside.safetensors")  # a whole model
    folder = tmp_path / "m"
    shutil.copytree(hf_folders / "sharded", folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = dict.fromkeys(index["weight_map"], shard.format(root=tmp_path))
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        ValueError, match="weight_map entry 'lm_head.weight' names .* a shard is a .safetensors file inside"
    ):
        from_hf(folder)


def test_sharded_and_whole_folders_still_load(hf_folders):
    one, sharded = from_hf(hf_folders / "one"), from_hf(hf_folders / "sharded")
    assert all(torch.equal(a, b) for a, b in zip(one.state_dict().values(), sharded.state_dict().values()))


def test_hf_file_errors_name_the_file(hf_folders, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(hf_folders / "one", folder)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(
        ValueError, match=f"{re.escape(str(folder / 'model.safetensors'))} is not a readable safetensors file"
    ):
        from_hf(folder)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json holds a JSON list, expected an object"):
        from_hf(folder)


def safetensors_file(path: Path, entries: dict, data: int, apparent: int | None = None) -> Path:
    """A safetensors file of a valid header (`entries`: name -> (dtype, shape, [begin, end])) and `data`
    zero bytes, or holes up to `apparent` bytes of data (a sparse file)."""
    header = json.dumps({k: {"dtype": d, "shape": s, "data_offsets": o} for k, (d, s, o) in entries.items()}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bytes(data))
        if apparent is not None:
            try:
                f.truncate(8 + len(header) + apparent)
            except OSError as e:  # a filesystem without sparse files this large
                pytest.skip(f"no sparse file of {apparent} bytes here: {e}")
    return path


TB4 = 4 * 2**40


@pytest.mark.parametrize(
    "entries,data,apparent,message",
    [
        # an uncaught "RuntimeError: unable to mmap 4398046511200 bytes" (exit 1) before
        (
            {"model.embed_tokens.weight": ("U8", [TB4], [0, TB4])},
            0,
            TB4,
            "holds 4,398,046,511,104 bytes of tensor data (the largest tensor 'model.embed_tokens.weight'), more "
            "than this host's",
        ),
        (
            {"model.norm.weight": ("F32", [1000, 1000], [0, 4_000_000])},
            16,
            None,
            "is not a readable safetensors file: tensor 'model.norm.weight' lies at bytes 0..4000000 of the data, "
            "but the file holds 16 bytes of data",
        ),
        (
            {"model.norm.weight": ("F32", [1000], [0, 16])},
            16,
            None,
            "is not a readable safetensors file: tensor 'model.norm.weight' is F32 of shape (1000,), 4000 bytes, "
            "but its data_offsets span 16",
        ),
    ],
    ids=["sparse-4TB", "past-the-end", "short-span"],
)
def test_safetensors_headers_are_checked_against_the_file_before_mapping(
    hf_folders, tmp_path, capsys, entries, data, apparent, message
):
    """Every reader of safetensors: the one weights reader, a Hugging Face folder (lwm-generate
    --model, schedule.init_hf), a diffusers VQGAN folder (lwm-generate --vqgan)."""
    from lwm.disk.weights import WeightsError, read_weights
    from lwm.infer.cli import main as generate_main
    from lwm.interop.hf import check_hf_folder
    from lwm.interop.vqgan_sources import load_vqgan

    lone = safetensors_file(tmp_path / "w.safetensors", entries, data, apparent)
    with pytest.raises(WeightsError, match=re.escape(f"{lone} {message}")):
        read_weights(lone)
    folder = tmp_path / "m"
    shutil.copytree(hf_folders / "one", folder)
    weights = folder / "model.safetensors"
    lone.replace(weights)
    for read in (from_hf, check_hf_folder):
        with pytest.raises(WeightsError, match=re.escape(f"{weights} {message}")):
            read(folder)
    assert generate_main(["--model", str(folder), "--prompt", "x", "--tokenizer", str(TOKENIZER)]) == 2
    assert f"lwm-generate: {weights} {message}" in capsys.readouterr().err
    vqgan = tmp_path / "vqgan"
    vqgan.mkdir()
    (vqgan / "config.json").write_text(json.dumps({"_class_name": "VQModel"}))
    weights.replace(vqgan / "diffusion_pytorch_model.safetensors")
    with pytest.raises(WeightsError, match=re.escape(f"{vqgan / 'diffusion_pytorch_model.safetensors'} {message}")):
        load_vqgan(vqgan)
    (vqgan / "diffusion_pytorch_model.safetensors").unlink()  # not 4 TB left behind, even as holes


@pytest.mark.parametrize(
    "info,message",
    [
        ({"prompt": "lwm", "vqgan": "../elsewhere"}, "vqgan '../elsewhere' must name a folder inside"),
        ({"prompt": "lwm", "vqgan": "/abs/vqgan"}, "vqgan '/abs/vqgan' must name a folder inside"),
        (["lwm"], "lwm.json holds a JSON list, expected an object"),
    ],
)
def test_bundle_info_names_only_folders_inside_the_bundle(tmp_path, info, message):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text("{}")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "lwm.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=re.escape(message)):
        read_bundle_info(folder)
