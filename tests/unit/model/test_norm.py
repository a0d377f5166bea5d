"""RMSNorm's two kernels: torch's own choice (F.rms_norm: fused on a CUDA tensor, composite
elsewhere) and the fused kernel called by name, which the planner's fake CPU tensors run as a GPU
does. The fused backward has no CPU kernel; tests/cuda_standins.py holds to its contract."""

from __future__ import annotations

import pytest
import torch
from cuda_standins import installed
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from lwm.model import ModelConfig, Transformer
from lwm.model.norm import RMSNorm
from lwm.parallel import compute_settings
from lwm.plan.fake import GPU_SETTINGS

DIM = 64


def _norm(dtype: torch.dtype, kernel: str) -> RMSNorm:
    norm = RMSNorm(DIM, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, DIM))
    norm.kernel = kernel
    return norm.to(dtype)


def _run(dtype: torch.dtype, kernel: str):
    torch.manual_seed(0)
    x = (torch.randn(2, 16, DIM, dtype=dtype) * 3).requires_grad_()
    grad = torch.randn(2, 16, DIM, dtype=dtype)
    norm = _norm(dtype, kernel)
    with installed() as calls:
        calls.clear()
        out = norm(x)
        out.backward(grad)
        used = dict(calls)
    return out.detach(), x.grad, norm.weight.grad, used


# dtype -> tolerance of the gradients: the two backward formulas order their sums differently
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-12), (torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_the_fused_kernel_equals_torchs_composite_on_cpu(dtype, rtol):
    auto, fused = _run(dtype, "auto"), _run(dtype, "fused")
    assert auto[3] == {} and fused[3] == {"fused rms_norm backward": 1}  # the fused path took the kernel
    assert torch.equal(auto[0], fused[0])  # the same forward (the CPU composite of the fused op)
    for a, f in zip(auto[1:3], fused[1:3]):
        torch.testing.assert_close(f, a, rtol=rtol, atol=rtol * a.abs().max().item())


@pytest.mark.parametrize("kernel", ["auto", "fused"])
def test_bf16_output_equals_transformers_llama_rmsnorm(kernel):
    torch.manual_seed(0)
    x = torch.randn(2, 16, DIM, dtype=torch.bfloat16) * 3
    reference = LlamaRMSNorm(DIM, eps=1e-5)
    with torch.no_grad():
        reference.weight.copy_(torch.linspace(0.5, 1.5, DIM))
    with torch.no_grad():
        assert torch.equal(_norm(torch.bfloat16, kernel)(x), reference.to(torch.bfloat16)(x))


@pytest.mark.parametrize("kernel", ["auto", "fused"])
def test_a_bf16_norm_on_a_gpu_saves_no_fp32_copy_of_its_input(kernel):
    """Torch's own dispatch of a CUDA tensor (fake: no GPU needed for the forward) and the named
    kernel save the same: the bf16 input, the fp32 rstd (one value a row) and the normalized
    output the weight multiplies. It used to cast the input to fp32 first, saving that copy."""
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with FakeTensorMode(), torch.device("cuda"):
        x = torch.empty(2, 16, DIM, dtype=torch.bfloat16, requires_grad=True)
        norm = RMSNorm(DIM, 1e-5)
        norm.weight = torch.nn.Parameter(torch.ones(DIM, dtype=torch.bfloat16))  # as FSDP2 gathers it
        norm.kernel = kernel
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            norm(x)
    rows = (2, 16, DIM)
    assert sorted(saved, key=str) == sorted(
        [(rows, torch.bfloat16), ((2, 16, 1), torch.float32), (rows, torch.bfloat16), ((DIM,), torch.bfloat16)],
        key=str,
    )


def test_the_planner_runs_the_norm_kernel_a_gpu_runs():
    assert compute_settings(torch.device("cuda"), 128) == GPU_SETTINGS
    assert compute_settings(torch.device("cpu"), 128).norm == "auto"


def test_set_norm_kernel_sets_every_norm_and_refuses_an_unknown_one():
    model = Transformer(ModelConfig.from_preset("debug"))
    model.set_norm_kernel("fused")
    kernels = {m.kernel for m in model.modules() if isinstance(m, RMSNorm)}
    assert kernels == {"fused"} and sum(isinstance(m, RMSNorm) for m in model.modules()) == 2 * len(model.layers) + 1
    with pytest.raises(ValueError, match="unknown norm kernel 'apex'; expected one of"):
        model.set_norm_kernel("apex")


def test_the_fused_kernel_runs_on_the_meta_device():
    """The CUDA path's two ops on meta tensors (their meta kernels): the shapes and dtypes a GPU gives."""
    with torch.device("meta"):
        x = torch.empty(2, 16, DIM, dtype=torch.bfloat16, requires_grad=True)
        norm = RMSNorm(DIM, 1e-5)
        norm.weight = torch.nn.Parameter(torch.ones(DIM, dtype=torch.bfloat16))
        norm.kernel = "fused"
        out = norm(x)
        out.sum().backward()
    assert (out.shape, out.dtype, out.device.type) == (x.shape, torch.bfloat16, "meta")
    assert (x.grad.shape, x.grad.dtype) == (x.shape, torch.bfloat16)
    assert (norm.weight.grad.shape, norm.weight.grad.dtype) == ((DIM,), torch.bfloat16)
