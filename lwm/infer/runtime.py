"""What every inference tool (lwm-generate, lwm/eval/needle.py, lwm/eval/video_qa/) sets up the same way:
the model arguments, the device and process group (torchrun -> context parallelism over all
ranks), and the model with its Generator."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

from lwm.arg_types import add_options, device_name, option, positive_int
from lwm.infer.generator import Generator
from lwm.infer.load import Loaded, load_model
from lwm.parallel.comm import group_size_and_rank
from lwm.parallel.launch import end_process_groups, init_from_env, rank_device
from lwm.parallel.layout import LAYOUTS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(kw_only=True)
class ModelOptions:
    """The options of every inference command that loads a model (load_generator reads them)."""

    model: str = option("Hugging Face folder, training stage folder, final.safetensors or .ckpt")
    tokenizer: str | None = option(
        "text tokenizer: sentencepiece model, tokenizer.json or folder (default: the model's own)", None
    )
    device: str | None = option(
        "cpu or cuda (default: cuda when available); under torchrun each rank uses cuda:LOCAL_RANK",
        None,
        type=device_name,
    )
    dtype: str = option("auto: bfloat16 on CUDA, as stored on CPU", "auto", choices=["auto", *DTYPES])
    layout: str = option("how the prompt is split over the ranks under torchrun", "striped", choices=LAYOUTS)
    prefill_chunk: int = option("prompt tokens per rank processed at a time", 8192, type=positive_int)


def add_model_args(p: argparse.ArgumentParser) -> None:
    add_options(p, ModelOptions)


def require_paths(parser: argparse.ArgumentParser, args: argparse.Namespace, *options: str) -> None:
    """Exit 2 with parser.error naming the first of `options` (e.g. "--vqgan") given a path that does not
    exist; called before any model is loaded, so a typo costs no loading time."""
    for flag in options:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None and not Path(value).exists():
            parser.error(f"{flag} {value} does not exist")


@dataclass
class Runtime:
    device: str
    group: object | None  # the context-parallel group (all torchrun ranks), None for one process
    rank: int
    world: int

    def close(self) -> None:
        """End the process group that start() began (nothing for one process), every rank waiting
        for the others first (lwm.parallel.launch.end_process_groups)."""
        if self.group is not None:
            end_process_groups()
            self.group = None


def start(device: str | None) -> Runtime:
    """Pick the device and, under torchrun, start the process group (each rank on its own GPU,
    cuda:LOCAL_RANK; a --device cuda:N naming another is refused)."""
    device = rank_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    group = init_from_env(device)
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    world, rank = group_size_and_rank(group)
    return Runtime(device, group, rank, world)


def load_generator(args: argparse.Namespace | ModelOptions, runtime: Runtime) -> tuple[Loaded, Generator]:
    """The model of --model on the runtime's device and its Generator; raises FileNotFoundError or
    ValueError for a bad model or tokenizer."""
    on_cuda = runtime.device.startswith("cuda")
    dtype = (torch.bfloat16 if on_cuda else None) if args.dtype == "auto" else DTYPES[args.dtype]
    loaded = load_model(args.model, args.tokenizer, device=runtime.device, dtype=dtype)
    generator = Generator(
        loaded.model, loaded.vocab, runtime.group, layout=args.layout, prefill_chunk=args.prefill_chunk
    )
    return loaded, generator
