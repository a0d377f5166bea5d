"""The NCCL communication contract, checked in the gloo test workers.

gloo on CPU accepts tensors that NCCL refuses, so a multi-process test passing here says little
about a torchrun job on GPUs. tests/conftest.py makes every `run_distributed` worker run its
function under `checked`, which wraps the torch.distributed entry points the project uses and
refuses, naming the rule, the op and the tensor:

    device  a tensor not on the compute device
    host    a tensor that a GPU run would hold on the host (below); launch.init_from_env starts
            NCCL alone on CUDA, and such a group has no CPU backend
    dtype   a dtype outside ProcessGroupNCCL's table (torch/csrc/distributed/c10d/NCCLUtils.hpp,
            `ncclDataType`); complex is refused too (NCCL takes it only through view_as_real, and
            not for MAX / MIN)
    dense   a sparse or non-contiguous tensor (ProcessGroupNCCL.cpp `check_gpu_single_tensor`
            raises for collectives; for send / receive it only warns and leaves matching layouts
            to the user, so it is refused here too)
    sizes   mismatched sizes or dtypes between the tensors of one call, or between a send from
            rank a to rank b and the receive rank b posts for it (compared through the group's
            store, counted per (group, a, b) pair as NCCL matches them in order); a receive from
            any source (NCCL has none)

Host tensors: in the gloo tests the compute device is the CPU, so "on the CPU in a GPU run" is
emulated. A TorchFunctionMode tags the tensors that project code (modules named lwm.*) makes with
a factory and no device= argument, with .cpu() or torch.from_numpy, and what is computed from them;
an explicit move (.to(device), .to(tensor), .cuda()) clears the tag. Test code and torch's own code
stand in for the caller that put its tensors on the device, so their tensors are never tagged.
Object collectives (broadcast_object_list, all_gather_object) are left alone: NCCL moves their
tensors to the current device itself. Functional collectives (DTensor's) are not wrapped.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

NCCL_DTYPES = frozenset(
    {torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64}
    | {torch.bool, torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e5m2fnuz, torch.float8_e4m3fnuz}
)
PROJECT = ["lwm."]  # module name prefixes whose device-less tensors are host tensors; a checker test adds its own
FACTORY_NAMES = (
    "tensor as_tensor zeros ones empty full arange range rand randn randint randperm eye linspace logspace "
    "empty_strided scalar_tensor"
).split()
FACTORIES = frozenset(getattr(torch, name) for name in FACTORY_NAMES)
MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda})

HOST = WeakIdKeyDictionary()  # tensor -> True: on the host in a GPU run
_state = threading.local()  # .device: the compute device; .exempt: inside an object collective
ORIGINALS: dict[str, object] = {}  # name -> the unwrapped torch.distributed function, while installed


class ContractError(RuntimeError):
    """A tensor handed to torch.distributed that NCCL would refuse."""


def _from_project() -> bool:
    """Whether the torch call being handled comes from project code: the first frame outside this
    module and outside any mode's __torch_function__ (a subclass's included)."""
    frame = sys._getframe(1)
    while frame.f_globals.get("__name__") == __name__ or frame.f_code.co_name == "__torch_function__":
        frame = frame.f_back
    name = frame.f_globals.get("__name__", "")
    return any(name.startswith(prefix) for prefix in PROJECT)


def _tensors(out):
    return [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]


def _tag(out) -> None:
    for t in _tensors(out):
        HOST[t] = True


def _names_device(args, kwargs) -> bool:
    """Whether a .to(...) call names a device (a device, a string, an index or a tensor to follow)."""
    if kwargs.get("device") is not None:
        return True
    return any(isinstance(a, (str, torch.device, torch.Tensor)) or type(a) is int for a in args)


class HostTensors(TorchFunctionMode):
    """Tags host tensors in HOST (see the module's docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        first = args[0] if args else None
        if isinstance(first, (list, tuple)) and first:
            first = first[0]  # cat, stack: the first tensor of the list
        if func in FACTORIES:
            if isinstance(first, torch.Tensor):  # tensor(t) / as_tensor(t) keep t's device
                if first in HOST:
                    _tag(out)
            elif kwargs.get("device") is None and _from_project():
                _tag(out)
        elif func in MOVES and (func is torch.Tensor.cuda or _names_device(args[1:], kwargs)):
            if first in HOST:  # a move makes a new tensor on a GPU; here it may return first itself
                out = out.view_as(out) if out is first else out
                HOST.pop(out, None)
        elif func is torch.Tensor.cpu:
            if _from_project():
                out = out.view_as(out) if out is first else out
                _tag(out)
        elif isinstance(first, torch.Tensor) and first in HOST:
            _tag(out)
        return out


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}, strides {tuple(t.stride())}"


def _contiguous(t: torch.Tensor) -> bool:
    """Contiguous, or channels-last contiguous (what ProcessGroupNCCL accepts via suggest_memory_format,
    which is not called here: it imports sympy, a second per worker)."""
    channels_last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
    return t.is_contiguous() or (channels_last is not None and t.is_contiguous(memory_format=channels_last))


def check_tensor(call: str, t: torch.Tensor, dense: bool = True) -> None:
    """Raise ContractError if NCCL (on an NCCL-only group) would refuse t in `call`."""
    device = _state.device
    if t.device.type != device.type:
        raise ContractError(f"{call}: rule 'device': the tensor is not on the compute device {device} ({_describe(t)})")
    if t in HOST:
        raise ContractError(
            f"{call}: rule 'host': on a GPU this tensor would be on the CPU; NCCL-only groups carry only device "
            f"tensors; make it with device= or move it ({_describe(t)})"
        )
    if t.dtype not in NCCL_DTYPES:
        raise ContractError(f"{call}: rule 'dtype': NCCL carries no {t.dtype} ({_describe(t)})")
    if t.layout != torch.strided or (dense and not _contiguous(t)):
        raise ContractError(f"{call}: rule 'dense': NCCL takes only dense, contiguous tensors ({_describe(t)})")


def _same(call: str, what: str, a: torch.Tensor, b: torch.Tensor, numel: int | None = None) -> None:
    ok = a.dtype == b.dtype and (a.shape == b.shape if numel is None else b.numel() == numel)
    if not ok:
        want = f"shape {tuple(a.shape)}" if numel is None else f"{numel} elements"
        raise ContractError(f"{call}: rule 'sizes': {what} must have {want} and dtype {a.dtype} ({_describe(b)})")


# ------------------------------------------------------------------------------------ send / receive


_counts: dict[tuple, int] = {}


def _p2p_key(group, src: int, dst: int) -> str:
    """The store key of the next message from global rank src to dst on `group`."""
    name = (group or c10d._get_default_group()).group_name
    n = _counts.get((name, src, dst), 0)
    _counts[(name, src, dst)] = n + 1
    return f"comm_contract/p2p/{name}/{src}/{dst}/{n}"


def _peer(group, peer, group_peer, what: str, call: str) -> int:
    if peer is None and group_peer is None:
        raise ContractError(f"{call}: rule 'sizes': NCCL has no receive from any source; name the {what}")
    return peer if peer is not None else dist.get_global_rank(group or c10d._get_default_group(), group_peer)


def _signature(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}"


def _send(call: str, tensor, dst=None, group=None, group_dst=None, **_):
    check_tensor(call, tensor)
    key = _p2p_key(group, dist.get_rank(), _peer(group, dst, group_dst, "destination", call))
    c10d._get_default_store().set(key, _signature(tensor))


def _recv(call: str, tensor, src=None, group=None, group_src=None, **_):
    check_tensor(call, tensor)
    src = _peer(group, src, group_src, "source", call)
    sent = c10d._get_default_store().get(_p2p_key(group, src, dist.get_rank())).decode()
    if sent != _signature(tensor):
        raise ContractError(
            f"{call}: rule 'sizes': rank {src} sent {sent}; rank {dist.get_rank()} receives into {_describe(tensor)}"
        )


# ------------------------------------------------------------------------------------ collectives


def _one(call, tensor, **_):
    check_tensor(call, tensor)


def _all_gather(call, tensor_list, tensor, **_):
    check_tensor(call, tensor)
    for i, out in enumerate(tensor_list):  # copied out of a flat buffer: need not be contiguous
        check_tensor(call, out, dense=False)
        _same(call, f"output {i}", tensor, out)


def _gather_into(call, output_tensor, input_tensor, group=None, **_):
    for t in (output_tensor, input_tensor):
        check_tensor(call, t)
    _same(call, "the output", input_tensor, output_tensor, numel=input_tensor.numel() * dist.get_world_size(group))


def _scatter_from(call, output, input, group=None, **_):
    for t in (output, input):
        check_tensor(call, t)
    _same(call, "the input", output, input, numel=output.numel() * dist.get_world_size(group))


def _all_to_all(call, output, input, **_):
    for t in (output, input):
        check_tensor(call, t)
    if output.dtype != input.dtype:
        raise ContractError(f"{call}: rule 'sizes': output dtype {output.dtype} differs from input {input.dtype}")


CHECKS = {  # name -> check(call, **the call's arguments by name)
    "isend": _send,
    "send": _send,
    "irecv": _recv,
    "recv": _recv,
    "all_reduce": _one,
    "broadcast": _one,
    "all_gather": _all_gather,
    "all_gather_into_tensor": _gather_into,
    "all_gather_single": _gather_into,  # what FSDP2 calls
    "reduce_scatter_tensor": _scatter_from,
    "reduce_scatter_single": _scatter_from,
    "all_to_all_single": _all_to_all,
}
EXEMPT = ("broadcast_object_list", "all_gather_object")  # NCCL moves their tensors itself


def _checked_call(name: str, original):
    check, signature = CHECKS.get(name), inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if getattr(_state, "exempt", False):
            return original(*args, **kwargs)
        if check is None:  # an object collective: what it calls inside is NCCL's business
            _state.exempt = True
            try:
                return original(*args, **kwargs)
            finally:
                _state.exempt = False
        check(name, **signature.bind(*args, **kwargs).arguments)
        return original(*args, **kwargs)

    return wrapper


def _from_numpy(original):
    @functools.wraps(original)
    def from_numpy(array):
        out = original(array)
        if _from_project():
            HOST[out] = True
        return out

    return from_numpy


@contextlib.contextmanager
def contract(device: torch.device):
    """Within: the entry points are checked and host tensors tagged. Patched in torch.distributed and
    distributed_c10d alike, so P2POp accepts the wrapped isend / irecv and batch_isend_irecv calls them."""
    _state.device, _state.exempt = torch.device(device), False
    saved = {"from_numpy": torch.from_numpy}
    torch.from_numpy = _from_numpy(saved["from_numpy"])
    for name in (*CHECKS, *EXEMPT):
        ORIGINALS[name] = original = getattr(c10d, name)
        wrapped = _checked_call(name, original)
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)
    try:
        with HostTensors():
            yield
    finally:
        torch.from_numpy = saved["from_numpy"]
        for name, original in ORIGINALS.items():
            setattr(c10d, name, original)
            setattr(dist, name, original)
        ORIGINALS.clear()


def checked(fn, rank: int, world_size: int, *args):
    """A run_distributed worker body: fn(rank, world_size, *args) under the contract, on the CPU."""
    with contract(torch.device("cpu")):
        return fn(rank, world_size, *args)
