"""parallel.attention_kernel (lwm/parallel/flash_impl.py): which FlashAttention a device gets, refusals that
name the setting, activation through torch's registry, and every flash call the ring, Ulysses and varlen
paths make (through tests/cuda_standins.py, bf16, forward and backward) held to torch's own support rules
for FlashAttention-3 and -4 (torch/nn/attention/_fa3.py, _fa4.py), as on an H100 and a B200."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch
import torch.nn.attention._fa3 as fa3
import torch.nn.attention._fa4 as fa4
import torch.nn.attention._registry as registry
from cuda_standins import installed
from document_refs import packings
from torch.utils._python_dispatch import TorchDispatchMode

from lwm.model import ModelConfig, Transformer
from lwm.model.documents import Documents
from lwm.parallel import apply_context_parallel, simulate_ring, ulysses_attention
from lwm.parallel.flash_impl import IMPL, MAJORS, activate, choose_kernel, installed_kernels

ALL = frozenset({"fa2", "fa3", "fa4"})
H100, B200, A100 = (9, 0), (10, 0), (8, 0)


@pytest.mark.parametrize(
    ("kernel", "capability", "installed", "chosen"),
    [
        ("auto", None, ALL, "fa2"),  # a CPU run: nothing to activate
        ("fa2", None, ALL, "fa2"),
        ("auto", A100, ALL, "fa2"),
        ("auto", H100, frozenset({"fa2"}), "fa2"),
        ("auto", H100, ALL, "fa3"),
        ("auto", H100, frozenset({"fa2", "fa4"}), "fa4"),
        ("auto", B200, ALL, "fa4"),
        ("auto", B200, frozenset({"fa2", "fa3"}), "fa2"),  # FlashAttention-3 is for 9.0 alone
        ("fa3", H100, ALL, "fa3"),
        ("fa4", H100, ALL, "fa4"),
        ("fa4", B200, ALL, "fa4"),
        ("fa2", B200, ALL, "fa2"),
        ("cudnn", A100, ALL, "cudnn"),  # in torch's CUDA builds: nothing to install
        ("cudnn", H100, frozenset({"fa2"}), "cudnn"),
        ("auto", H100, frozenset({"fa2"}), "fa2"),  # auto never picks cudnn: a run names it
    ],
)
def test_the_kernel_each_device_gets(kernel, capability, installed, chosen):
    assert choose_kernel(kernel, "cuda" if capability else "cpu", capability, installed) == chosen


@pytest.mark.parametrize(
    ("kernel", "capability", "installed", "message"),
    [
        (
            "fa3",
            None,
            ALL,
            r"^parallel.attention_kernel=fa3: FlashAttention-3 runs on CUDA GPUs of compute "
            r"capability 9.0; this run computes on cpu \(use auto or fa2\)$",
        ),  # fmt: skip
        ("fa4", A100, ALL, r"FlashAttention-4 needs compute capability 9.0 or 10.0; this GPU's is 8.0"),
        ("fa3", B200, ALL, r"FlashAttention-3 needs compute capability 9.0; this GPU's is 10.0"),
        ("fa3", H100, frozenset({"fa2"}), r"module flash_attn_interface is not installed; build it from"),
        (
            "fa4",
            H100,
            frozenset({"fa2"}),
            r"module flash_attn.cute.interface is not installed; pip install flash-attn-4",
        ),
        (
            "fa5",
            H100,
            ALL,
            r"parallel.attention_kernel must be one of \['auto', 'fa2', 'fa3', 'fa4', 'cudnn'\], got 'fa5'",
        ),
        ("cudnn", None, ALL, r"cuDNN attention runs on CUDA GPUs of compute capability 8.0 or later; this run .* cpu"),
        ("cudnn", (7, 5), ALL, r"cuDNN attention needs compute capability 8.0 or later; this GPU's is 7.5"),
    ],
)
def test_a_kernel_that_cannot_run_is_refused_naming_the_setting(kernel, capability, installed, message):
    with pytest.raises(ValueError, match=message):
        choose_kernel(kernel, "cuda" if capability else "cpu", capability, installed)


def test_the_capabilities_are_torchs_own(monkeypatch):
    """MAJORS is what torch's support checks accept: each major 7-12 is refused by torch exactly where it is
    not in the table (CUDA tensors and availability stood in; the capability check is the one that speaks)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    q = OnGPU(torch.empty(1, 2, 4, 8, dtype=torch.bfloat16))
    for major in range(7, 13):
        monkeypatch.setattr(fa3, "_get_device_major", lambda device, m=major: m)
        monkeypatch.setattr(fa4, "_get_device_major", lambda device, m=major: m)
        fa3_error = fa3._fa3_common_support_error(q, (q, q, q), 0.0, None, None, None, None)
        fa4_error = fa4._fa4_common_support_error(q, (q, q, q), None)
        assert (fa3_error is None) == (major in MAJORS["fa3"]), (major, fa3_error)
        assert (fa4_error is None) == (major in MAJORS["fa4"]), (major, fa4_error)


def test_installed_means_the_module_is_found(tmp_path, monkeypatch):
    assert installed_kernels() >= {"fa2"}
    (tmp_path / "flash_attn_interface.py").write_text("")
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    for name in ("flash_attn/__init__.py", "flash_attn/cute/__init__.py", "flash_attn/cute/interface.py"):
        (tmp_path / name).write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("flash_attn")]:
        monkeypatch.delitem(sys.modules, name)
    assert installed_kernels() == ALL


def test_activation_goes_through_torchs_registry(monkeypatch):
    """activate puts the registered implementation behind aten's flash ops and fa2 restores torch's own: the
    registry's register function is what runs (stood in here, as the real one imports the kernels)."""
    log = []

    class Handle:
        def remove(self):
            log.append("removed")

    monkeypatch.setattr(registry, "_FLASH_ATTENTION_IMPLS", {"FA3": lambda: log.append("FA3") or Handle()})
    monkeypatch.setattr(registry, "_FLASH_ATTENTION_ACTIVE", None)
    activate("fa3")
    assert registry.current_flash_attention_impl() == IMPL["fa3"] and log == ["FA3"]
    activate("fa3")  # already active: registered once
    activate("fa2")
    assert registry.current_flash_attention_impl() is None and log == ["FA3", "removed"]
    activate("fa3")
    activate("cudnn")  # cuDNN's own op, with torch's FlashAttention-2 for what it does not take
    assert registry.current_flash_attention_impl() is None and log == ["FA3", "removed", "FA3", "removed"]


# ------------------------------------------------------------------ the paths' calls under torch's support rules


class OnGPU:
    """A tensor as torch's support checks read it on a GPU: its dtype, rank and shape, on cuda:0."""

    is_cuda = True
    device = torch.device("cuda", 0)

    def __init__(self, t: torch.Tensor):
        self.dtype, self.shape, self._dim = t.dtype, t.shape, t.dim()

    def dim(self) -> int:
        return self._dim


class FlashCalls(TorchDispatchMode):
    """Each call of aten's flash ops, its arguments by the op's schema names."""

    OPS = {
        "_scaled_dot_product_flash_attention": "forward",
        "_flash_attention_forward": "forward",
        "_scaled_dot_product_flash_attention_backward": "backward",
        "_flash_attention_backward": "backward",
    }

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name in self.OPS:
            named = {a.name: v for a, v in zip(func._schema.arguments, args)} | (kwargs or {})
            self.calls.append((name, self.OPS[name], named))
        return func(*args, **(kwargs or {}))


RULES = {
    ("fa3", "forward"): fa3._fa3_forward_support_error,
    ("fa3", "backward"): fa3._fa3_backward_support_error,
    ("fa4", "forward"): fa4._fa4_forward_support_error,
    ("fa4", "backward"): fa4._fa4_backward_support_error,
}


def support_errors(calls, kernel: str) -> list[str]:
    """torch's verdict on each call for `kernel`: its support function given the call's arguments by name
    (the names torch's implementations pass on; an argument the call does not have is None)."""
    errors = []
    for name, direction, named in calls:
        rule = RULES[kernel, direction]
        given = {k: OnGPU(v) if isinstance(v, torch.Tensor) else v for k, v in named.items()}
        given.setdefault("dropout_p", 0.0)
        given.setdefault("return_debug_mask", False)
        args = {p: given.get(p) for p in inspect.signature(rule).parameters}
        if (error := rule(**args)) is not None:
            errors.append(f"{name}: {error}")
    return errors


def _qkv(S=32):
    torch.manual_seed(0)
    return [torch.randn(1, h, S, 16, dtype=torch.bfloat16, requires_grad=True) for h in (4, 2, 2)]


def _paths():
    """Forward and backward of the ring over two simulated ranks, Ulysses at one rank, and a bf16 model's
    step with packed documents (the varlen kernel), each on the flash backend."""
    for layout in ("striped", "zigzag"):
        simulate_ring(*_qkv(), 2, True, layout, backend="cuda_flash").sum().backward()
    ulysses_attention(*_qkv(), None, True, "striped", backend="cuda_flash").sum().backward()
    cfg = ModelConfig.from_preset("debug")
    tokens = torch.randint(0, cfg.vocab_size, (2, 65))
    model = apply_context_parallel(Transformer(cfg).to(torch.bfloat16), backend="cuda_flash")
    seg = Documents(packings(2, 64, seed=2), 64)
    model(
        tokens[:, :-1], targets=tokens[:, 1:], loss_coeff=torch.full((2, 64), 1 / 128), segment_ids=seg
    ).loss.backward()


@pytest.mark.parametrize(("kernel", "major"), [("fa3", 9), ("fa4", 9), ("fa4", 10)])
def test_every_flash_call_of_the_paths_is_one_the_kernel_supports(monkeypatch, kernel, major):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fa3 if kernel == "fa3" else fa4, "_get_device_major", lambda device: major)
    with installed(), FlashCalls() as seen:
        _paths()
    assert {name for name, _, _ in seen.calls} == set(FlashCalls.OPS), "each of the four ops called"
    assert support_errors(seen.calls, kernel) == []


def test_a_call_the_kernel_refuses_would_be_caught(monkeypatch):
    """fp32 inputs and an fp16 logsumexp, as torch reads them: refused by both kernels' rules."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fa3, "_get_device_major", lambda device: 9)
    q = torch.empty(1, 4, 8, 16)
    lse = torch.empty(1, 4, 8, dtype=torch.float16)
    calls = [
        ("_scaled_dot_product_flash_attention", "forward", {"query": q, "key": q, "value": q}),
        (
            "_flash_attention_backward",
            "backward",
            dict(
                grad_out=q.bfloat16(),
                query=q.bfloat16(),
                key=q.bfloat16(),
                value=q.bfloat16(),
                out=q.bfloat16(),
                logsumexp=lse,
            ),
        ),  # fmt: skip
    ]
    assert support_errors(calls, "fa3") == [
        "_scaled_dot_product_flash_attention: inputs must be one of "
        "(torch.float8_e4m3fn, torch.float16, torch.bfloat16)",
        "_flash_attention_backward: logsumexp dtype must be float32",
    ]


def test_cudnn_is_the_blocks_backend_on_a_gpu_and_the_run_hands_it_over(monkeypatch):
    """parallel.attention_kernel=cudnn: a GPU's blocks call cuDNN's attention (lwm.parallel.kernels' cuda_cudnn),
    the planner's fake step too; the other settings act through the flash ops; LWMModule on a mesh hands the
    run's setting to compute_settings."""
    import dataclasses

    import lwm.train.module as module_file
    from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
    from lwm.parallel import ParallelDims
    from lwm.parallel.parallelize import compute_settings
    from lwm.plan.fake import gpu_settings

    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert compute_settings(gpu, 128, "cudnn").backend == "cuda_cudnn"
    assert [compute_settings(gpu, 128, k).backend for k in ("auto", "fa2", "fa3", "fa4")] == ["cuda_flash"] * 4
    assert compute_settings(cpu, 128, "cudnn").backend == "cpu_flash"  # refused before a CPU run starts anyway
    assert gpu_settings("cudnn") == compute_settings(gpu, 128, "cudnn") and gpu_settings("fa3").backend == "cuda_flash"
    seen = []
    monkeypatch.setattr(module_file, "compute_settings", lambda *a: seen.append(a) or compute_settings(*a))
    monkeypatch.setattr(module_file, "build_parallel_model", lambda *a, **k: None)
    monkeypatch.setattr(module_file, "build_meshes", lambda *a: type("M", (), {"cp_group": None})())
    monkeypatch.setattr(module_file.peers, "register", lambda: None)
    monkeypatch.setattr(module_file.dist, "get_rank", lambda: 0)
    stage = dataclasses.replace(StageConfig("a", seq_len=32, rope_theta=1e4, steps=1, lr=1e-3), cp=1)
    config = ModelConfig.from_preset("debug")
    parallel = ParallelConfig(attention_kernel="cudnn")
    module = module_file.LWMModule(config, stage, OptimConfig(), parallel, dims=ParallelDims(1, 1, 1))
    module._device_mesh = type("Mesh", (), {"size": lambda self: 1})()
    module.configure_model()
    assert seen[0][2] == "cudnn"
