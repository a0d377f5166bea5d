"""Which FlashAttention serves aten's flash kernels on a GPU (parallel.attention_kernel).

The ring, varlen and dense paths call aten's flash ops (lwm.parallel.kernels:
_scaled_dot_product_flash_attention and its backward; lwm.parallel.varlen: _flash_attention_forward and
_flash_attention_backward). Torch ships FlashAttention-2 behind them; its registry
(torch.nn.attention.activate_flash_attention_impl) puts FlashAttention-3 or -4 behind the very same ops in
this process, so choosing one changes no call:

    fa2   torch's own (on a CPU run, its CPU kernels: nothing is activated)
    fa3   FlashAttention-3, compute capability 9.0 (H100, H200), module flash_attn_interface
    fa4   FlashAttention-4, compute capability 9.0 or 10.0 (B200), module flash_attn.cute.interface
    cudnn cuDNN's attention (aten._scaled_dot_product_cudnn_attention, in torch's CUDA builds), compute
          capability 8.0 and later: the ring's blocks call it directly (lwm.parallel.kernels' cuda_cudnn),
          torch's own FlashAttention-2 serving the blocks outside its rules (packed documents run as their
          pieces, one call each)
    auto  the fastest installed FlashAttention this GPU supports: fa4 on 10.0, fa3 (else fa4) on 9.0, else fa2
          (never cudnn: name it)

The capability rules are torch's (torch/nn/attention/_fa3.py, _fa4.py: their support checks refuse any
other), and so are the rules on each call's arguments, which tests/unit/parallel/test_flash_impl.py runs
on every call the three paths make. The device is a parameter (device type and capability), never read
here, so the choice is the same function on a real GPU, in the planner and in the tests.
"""

from __future__ import annotations

import importlib.util

KERNELS = ("auto", "fa2", "fa3", "fa4", "cudnn")
IMPL = {"fa3": "FA3", "fa4": "FA4"}  # torch's registry names
MODULE = {"fa3": "flash_attn_interface", "fa4": "flash_attn.cute.interface"}  # what torch's registration imports
MAJORS = {"fa3": (9,), "fa4": (9, 10)}  # the compute capabilities torch's support checks accept
NAME = {"fa2": "FlashAttention-2", "fa3": "FlashAttention-3", "fa4": "FlashAttention-4", "cudnn": "cuDNN attention"}
CUDNN_MAJOR = 8  # torch's cuDNN attention needs compute capability 8.0 or later (sdp_utils.cpp)
INSTALL = {
    "fa3": "build it from flash-attention's hopper/ folder (docs/gpu.md)",
    "fa4": "pip install flash-attn-4 (docs/gpu.md)",
}


def installed_kernels() -> frozenset[str]:
    """The kernels this environment can activate: fa2 always, fa3 and fa4 where their module is found
    (found, not imported: importing FlashAttention-4 compiles nothing but loads CUDA libraries)."""
    found = {"fa2"}
    for kernel, module in MODULE.items():
        try:
            if importlib.util.find_spec(module) is not None:
                found.add(kernel)
        except ModuleNotFoundError:  # a parent package (flash_attn) is missing
            pass
    return frozenset(found)


def choose_kernel(kernel: str, device_type: str, capability: tuple[int, int] | None, installed: frozenset[str]) -> str:
    """fa2, fa3 or fa4 for a run on `device_type` ("cuda": with its compute `capability`); raises ValueError
    naming parallel.attention_kernel and what is missing where the one asked for cannot run."""
    if kernel not in KERNELS:
        raise ValueError(f"parallel.attention_kernel must be one of {list(KERNELS)}, got {kernel!r}")
    if device_type != "cuda" or capability is None:
        if kernel == "cudnn":
            raise ValueError(
                f"parallel.attention_kernel=cudnn: cuDNN attention runs on CUDA GPUs of compute capability "
                f"{CUDNN_MAJOR}.0 or later; this run computes on {device_type} (use auto or fa2)"
            )
        if kernel in IMPL:
            raise ValueError(
                f"parallel.attention_kernel={kernel}: {NAME[kernel]} runs on CUDA GPUs of compute capability "
                f"{' or '.join(f'{m}.0' for m in MAJORS[kernel])}; this run computes on {device_type} "
                "(use auto or fa2)"
            )
        return "fa2"
    major, minor = capability
    if kernel == "auto":
        order = ("fa4", "fa3") if major == 10 else ("fa3", "fa4")
        return next((k for k in order if k in installed and major in MAJORS[k]), "fa2")
    if kernel == "cudnn" and major < CUDNN_MAJOR:
        raise ValueError(
            f"parallel.attention_kernel=cudnn: cuDNN attention needs compute capability {CUDNN_MAJOR}.0 or later; "
            f"this GPU's is {major}.{minor} (use auto or fa2)"
        )
    if kernel in IMPL:
        if major not in MAJORS[kernel]:
            raise ValueError(
                f"parallel.attention_kernel={kernel}: {NAME[kernel]} needs compute capability "
                f"{' or '.join(f'{m}.0' for m in MAJORS[kernel])}; this GPU's is {major}.{minor} (use auto or fa2)"
            )
        if kernel not in installed:
            raise ValueError(
                f"parallel.attention_kernel={kernel}: {NAME[kernel]}'s module {MODULE[kernel]} is not installed; "
                f"{INSTALL[kernel]}, or use auto"
            )
    return kernel


def activate(kernel: str) -> None:
    """Put `kernel` behind aten's flash ops in this process (fa2, and cudnn, whose fallback it is: torch's own
    again)."""
    from torch.nn.attention import (
        activate_flash_attention_impl,
        current_flash_attention_impl,
        restore_flash_attention_impl,
    )

    current = current_flash_attention_impl()
    if kernel in ("fa2", "cudnn"):
        if current is not None:
            restore_flash_attention_impl()
    elif current != IMPL[kernel]:
        activate_flash_attention_impl(IMPL[kernel])
