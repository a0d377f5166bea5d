"""lwm-convert-lwm on a synthetic checkpoint of LWM-Chat's 7B width: time per GB and peak memory.

A checkpoint in LWM's streaming format (bf16, scanned layers, random weights) with LLaMA-2 7B's
hidden size, MLP width, heads and vocabularies (32000 text, 8448 vision) but --layers layers is
written to a temporary folder, then converted by the real command in a child process, whose peak
RSS the kernel reports (VmHWM). Baselines measured in the same run: copying the checkpoint file
(the disk's read + write speed) and a child that only imports the converter (the interpreter's
own RSS). The full 7B (32 layers) is extrapolated from the measured rates.

    python -m bench.convert_lwm                  # writes docs/benchmarks.md
    python -m bench.convert_lwm --layers 2 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import torch

from bench.report import command_line, host_line, publish
from lwm.model import ModelConfig

WIDTH = dict(
    hidden_size=4096,
    intermediate_size=11008,
    num_attention_heads=32,
    vocab_size=32000,
    vision_vocab_size=8448,
    max_sequence_length=1048576,
    theta=50000000.0,
    rms_norm_eps=1e-6,
)
LAYER_SHAPES = {
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
MAX_CHUNK = 2**30  # Flax writes a leaf over 1 GiB as chunks of this many bytes


def leaf_shapes(n_layers: int) -> dict[str, tuple[int, ...]]:
    D, F, V, Vv = WIDTH["hidden_size"], WIDTH["intermediate_size"], WIDTH["vocab_size"], WIDTH["vision_vocab_size"]
    size = {"D": D, "F": F}
    shapes = {
        "transformer/wte/embedding": (V, D),
        "transformer/vte/embedding": (Vv, D),
        "transformer/ln_f/kernel": (D,),
        "lm_head/kernel": (D, V),
        "vision_head/kernel": (D, Vv),
    }
    for leaf, dims in LAYER_SHAPES.items():
        shapes[f"transformer/h/scan_decoder/{leaf}"] = (n_layers, *(size[d] for d in dims))
    return shapes


def _ext(flat: np.ndarray, shape) -> msgpack.ExtType:
    return msgpack.ExtType(1, msgpack.packb((list(shape), "bfloat16", flat.tobytes()), use_bin_type=True))


def write_checkpoint(path: Path, n_layers: int, seed: int = 0) -> int:
    """LWM's params file of random bf16 leaves (one [key, bytes] msgpack record each) -> bytes written."""
    g = torch.Generator().manual_seed(seed)
    packer = msgpack.Packer()
    with open(path, "wb") as f:
        for name, shape in leaf_shapes(n_layers).items():
            bits = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16).view(torch.int16).numpy().reshape(-1)
            if bits.nbytes <= MAX_CHUNK:
                value = msgpack.packb(_ext(bits, shape))
            else:
                per = MAX_CHUNK // 2
                chunks = {
                    str(j): _ext(bits[s : s + per], (min(per, bits.size - s),))
                    for j, s in enumerate(range(0, bits.size, per))
                }
                value = msgpack.packb(
                    {
                        "__msgpack_chunked_array__": True,
                        "shape": {str(j): n for j, n in enumerate(shape)},
                        "chunks": chunks,
                    }
                )
            f.write(packer.pack((name.split("/"), value)))
            del bits, value
    return path.stat().st_size


# Runs a module's main(argv) and prints the process's peak RSS (VmHWM: counted from the exec, unlike
# wait4's ru_maxrss, which a forked child inherits from this process).
_PEAK = (
    "import importlib, sys; m = importlib.import_module(sys.argv[1]); code = m.main(sys.argv[2:]) if sys.argv[2:] else 0; "
    "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]); sys.exit(code)"
)


def child(module: str, args: list[str]) -> tuple[float, float, int]:
    """(seconds, peak RSS in GiB, exit status) of `module`'s main(args) in a child process (no args:
    only the import)."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, module, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TQDM_DISABLE": "1"},
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
    return seconds, int(proc.stdout.split()[-1]) / 2**20 if proc.returncode == 0 else float("nan"), proc.returncode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4, help="layers of the synthetic checkpoint (7B has 32)")
    p.add_argument(
        "--dir", type=Path, help="where to write the checkpoint and the output (default: a temporary folder)"
    )
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        (root / "config.json").write_text(json.dumps({**WIDTH, "num_hidden_layers": args.layers}))
        t0 = time.perf_counter()
        ckpt_bytes = write_checkpoint(root / "params", args.layers)
        print(f"wrote {ckpt_bytes / 2**30:.2f} GiB in {time.perf_counter() - t0:.0f} s", flush=True)
        t0 = time.perf_counter()
        shutil.copyfile(root / "params", root / "copy")
        copy_s = time.perf_counter() - t0
        (root / "copy").unlink()
        _, idle_gib, _ = child("lwm.interop.convert_lwm", [])
        seconds, peak_gib, status = child(
            "lwm.interop.convert_lwm",
            [
                "--checkpoint",
                f"params::{root / 'params'}",
                "--config",
                str(root / "config.json"),
                "--out",
                str(root / "hf"),
            ],
        )
        if status != 0:
            raise SystemExit(f"the conversion failed with exit status {status}")
        out_bytes = sum(f.stat().st_size for f in (root / "hf").glob("*.safetensors"))
    shapes = leaf_shapes(args.layers)
    largest = max(np.prod(s) for s in shapes.values()) * 2
    gib = ckpt_bytes / 2**30
    over = peak_gib - idle_gib
    bound = (out_bytes + largest) / 2**30
    full = leaf_shapes(32)
    full_ckpt = sum(np.prod(s) for s in full.values()) * 2 / 2**30
    full_largest = max(np.prod(s) for s in full.values()) * 2 / 2**30
    full_out = ModelConfig.from_preset("7b").num_params() * 2 / 2**30  # bf16; LWM's vocabulary in our layout
    lines = [
        f"Command: `{command_line()}`  ",
        f"Host: {host_line()}  ",
        f"Synthetic LWM checkpoint: 7B width (hidden 4096, MLP 11008, 32 heads, 32000 text + 8448 vision ids), "
        f"{args.layers} scanned layers, bf16, {gib:.2f} GiB; converted to a bf16 Hugging Face folder of "
        f"{out_bytes / 2**30:.2f} GiB by `lwm-convert-lwm` in a child process.",
        "",
        "| measure | value | baseline (same run) | ratio |",
        "| --- | ---: | ---: | ---: |",
        f"| time per GiB of checkpoint | {seconds / gib:.1f} s | copying the file: {copy_s / gib:.1f} s | {seconds / copy_s:.1f}x |",
        f"| peak RSS | {peak_gib:.2f} GiB | importing the converter: {idle_gib:.2f} GiB | |",
        f"| peak RSS above that | {over:.2f} GiB | output {out_bytes / 2**30:.2f} GiB + largest leaf {largest / 2**30:.2f} GiB "
        f"= {bound:.2f} GiB | {over / bound:.2f}x |",
        "",
        f"Measured: {seconds:.0f} s in all. The target is peak memory about the output model plus one leaf: above the "
        f"interpreter the peak is {over / bound:.2f}x that.",
        "",
        f"The full 7B (32 layers) on paper, from these rates: a {full_ckpt:.1f} GiB checkpoint converts in about "
        f"{seconds / gib * full_ckpt / 60:.0f} min; with its largest leaf (a scanned MLP kernel, {full_largest:.2f} GiB, "
        f"written in 1 GiB chunks) the peak is about {idle_gib + over / bound * (full_out + full_largest):.0f} GiB at the "
        f"measured ratio (the target, interpreter + output {full_out:.1f} GiB + largest leaf, is "
        f"{idle_gib + full_out + full_largest:.0f} GiB).",
    ]
    publish("convert_lwm", "\n".join(lines), write=not args.no_write)


if __name__ == "__main__":
    main()
