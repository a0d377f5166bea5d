"""Activation offload: each checkpointed block's input waits in host memory between forward and
backward, and comes back one layer ahead of the backward that needs it.

Under activation checkpointing (PyTorch's non-reentrant checkpoint, lwm/parallel/parallelize.py)
a block keeps only its checkpoint's inputs until backward: the residual stream x (B, S, dim) and
RoPE's cos/sin. The checkpoint keeps them as saved variables, so PyTorch's
`torch.autograd.graph.saved_tensors_hooks` entered around a wrapped block's forward sees exactly
those (the ops inside the block use the checkpoint's own hooks). The tensors that require grad (the
residual stream) are packed; cos/sin are constants shared by every block and stay where they are.

PyTorch's `torch.autograd.graph.save_on_cpu` packs the same way, but it copies on the current
stream and brings each tensor back only when backward asks for it, so the compute waits for every
copy in both directions. Here the copies run on a side stream and the previous block's input is
fetched while this block is recomputed, which is why the overlap is written out.

The policy, the same program points on every copy engine (the planner runs SyncCopyEngine under
fake tensors to plan what CudaCopyEngine's run holds, so nothing may depend on when a stream ends):

  forward, block i's input packed: the compute stream first waits for block i-1's copy-out and
      drops block i-1's device tensor (until then the caching allocator must not reuse it); then
      block i's copy-out into a host buffer starts. The last block's input has no next pack: it
      stays on the device until backward, which uses it as it is (no copy-in, so backward starts
      without waiting; its cost is one layer input of device memory through the head and loss,
      and one copy-out that is not read back).
  backward, block i's input unpacked: the compute stream waits for its copy-in (or, for the last
      block, its copy-out), its host buffer goes back to the pool, and the copy-in of block i-1's
      input starts, so it overlaps block i's recompute and backward. A block whose input was not
      fetched ahead (another order) fetches it there and waits.

Host buffers come from a pool keyed by (shape, dtype), kept across steps (pinned allocation is
slow). A buffer goes back to the pool only after the compute stream has waited for every copy that
touched it; the host does not wait, and the next copy into the buffer runs on the same side stream,
after them.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from lwm.model import Transformer
from lwm.parallel import kept


class CopyEngine(Protocol):
    """Copies between the compute device and the host; `copy` starts one and returns the event that
    says it ended (None where copies end at once), `wait` makes the compute stream wait for it."""

    host: torch.device

    def host_buffer(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor: ...

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> object | None: ...

    def wait(self, event: object | None) -> None: ...


class SyncCopyEngine:
    """Plain copies in program order: CPU runs (host `cpu`: the mechanism runs, for exactness tests)
    and the planner (host `meta`: under fake tensors torch's memory tracker counts the meta device
    apart, so the host's memory is the tracker's meta peak)."""

    def __init__(self, host: torch.device | str):
        self.host = torch.device(host)

    def host_buffer(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.host)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def wait(self, event: None) -> None:
        pass


class CudaCopyEngine:
    """Copies on a side CUDA stream into pinned host memory. The stream, event and allocation
    functions are parameters so that tests run this code on CPU with stand-ins
    (tests/offload_standins.py)."""

    def __init__(
        self,
        device: torch.device | str,
        host: torch.device | str = "cpu",
        new_stream: Callable = torch.cuda.Stream,
        current_stream: Callable = torch.cuda.current_stream,
        use_stream: Callable[..., AbstractContextManager] = torch.cuda.stream,
        empty: Callable[..., torch.Tensor] = torch.empty,
    ):
        self.device, self.host = torch.device(device), torch.device(host)
        self._current_stream, self._use_stream, self._empty = current_stream, use_stream, empty
        self.side = new_stream(self.device)

    def host_buffer(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return self._empty(shape, dtype=dtype, device=self.host, pin_memory=True)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> object:
        # Out: src was made by the compute stream. In: dst was just allocated on the compute stream,
        # whose queued kernels may still use that memory. Either way the side stream starts after them.
        self.side.wait_event(self._current_stream(self.device).record_event())
        with self._use_stream(self.side):
            dst.copy_(src, non_blocking=True)
        return self.side.record_event()

    def wait(self, event: object) -> None:
        self._current_stream(self.device).wait_event(event)


@dataclass(eq=False)
class _Saved:
    """One packed block input. `device_tensor`: the input until it is dropped at the next pack, then
    the fetched copy; `earlier`: the input packed before it in the same forward (fetched next)."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    host: torch.Tensor | None
    device_tensor: torch.Tensor | None
    copied_out: object | None
    earlier: _Saved | None
    copied_in: object | None = None
    fetching: bool = False
    unpacked: bool = False


class ActivationOffload:
    """The pack/unpack pair of saved_tensors_hooks, with the policy of this module's docstring.
    Tensors under `min_bytes`, and those that do not require grad, are left as they are."""

    def __init__(self, engine: CopyEngine, min_bytes: int = 0):
        self.engine, self.min_bytes = engine, min_bytes
        self._pool: dict[tuple[torch.Size, torch.dtype], list[torch.Tensor]] = {}
        self.host_bytes = 0  # host memory its buffers hold: made as needed, kept in the pool, never freed
        self._last: _Saved | None = None  # the latest input packed in this forward
        self._hooks: list[saved_tensors_hooks] = []

    def new_pass(self) -> None:
        """A forward starts: its inputs are chained apart from the previous forward's."""
        self._last = None

    def saving(self) -> saved_tensors_hooks:
        """The hooks to enter around a checkpointed block's forward."""
        return saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t: torch.Tensor):
        if not t.requires_grad or t.nbytes < self.min_bytes:
            return t
        self._drop_last()
        src = t.detach()  # a copy into the buffer must not join the graph
        host = self._take(t.shape, t.dtype)
        saved = _Saved(t.shape, t.dtype, t.device, host, src, self.engine.copy(host, src), self._last)
        self._last = saved
        return saved

    def unpack(self, saved) -> torch.Tensor:
        if not isinstance(saved, _Saved):
            return saved
        if saved.unpacked:
            raise RuntimeError(
                "activation offload: a block's input was unpacked twice; a second backward through "
                "the same graph (retain_graph=True) is not supported with offload"
            )
        if saved.device_tensor is None:  # not fetched ahead: fetch it now, and wait below
            self._fetch(saved)
        self._ready(saved)
        x, saved.device_tensor, saved.unpacked = saved.device_tensor, None, True
        self._give(saved)
        earlier, saved.earlier = saved.earlier, None
        if earlier is not None and not earlier.unpacked and not earlier.fetching:
            self._fetch(earlier)  # one layer ahead: overlaps this block's recompute and backward
        return x

    def _drop_last(self) -> None:
        last = self._last
        if last is not None and last.device_tensor is not None and not last.fetching:
            self.engine.wait(last.copied_out)  # before the allocator may reuse the memory it reads
            last.device_tensor = None

    def _fetch(self, saved: _Saved) -> None:
        # Allocated on the compute stream, which frees it after use: no record_stream needed.
        dst = torch.empty(saved.shape, dtype=saved.dtype, device=saved.device)
        saved.device_tensor, saved.fetching = dst, True
        saved.copied_in = self.engine.copy(dst, saved.host)

    def _ready(self, saved: _Saved) -> None:
        """The compute stream waits until the tensor it is about to use has arrived (fetched), or
        until the host buffer is written (the last input, used where it is)."""
        self.engine.wait(saved.copied_in if saved.fetching else saved.copied_out)

    def _take(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        free = self._pool.get((shape, dtype))
        if free:
            return free.pop()
        buffer = self.engine.host_buffer(shape, dtype)
        self.host_bytes += buffer.nbytes
        return buffer

    def _give(self, saved: _Saved) -> None:
        """The host buffer back to the pool: its copy in (or out) has been waited on."""
        self._pool.setdefault((saved.shape, saved.dtype), []).append(saved.host)
        saved.host = None

    def keep(self, t: torch.Tensor) -> _KeptOnHost:
        """A block's kept attention tensor (lwm.parallel.kept) to a host buffer; the compute stream waits
        for the copy at once, so the device tensor may go (one attention output a layer: the copy is
        small beside the attention that made it)."""
        host, src = self._take(t.shape, t.dtype), t.detach()  # src held until the wait: the copy reads it
        self.engine.wait(self.engine.copy(host, src))
        return _KeptOnHost(self, host, t.device)

    def _enter(self, module, args) -> None:
        hooks, store = self.saving(), kept.storing(self)
        hooks.__enter__()
        store.__enter__()
        self._hooks.append((hooks, store))

    def _exit(self, module, args, output) -> None:
        hooks, store = self._hooks.pop()
        store.__exit__(None, None, None)
        hooks.__exit__(None, None, None)


@dataclass(eq=False)
class _KeptOnHost:
    """A kept tensor in one of the offload's host buffers; back() fetches it, waited on, and returns the buffer."""

    offload: ActivationOffload
    host: torch.Tensor | None
    device: torch.device

    def back(self) -> torch.Tensor:
        engine, host = self.offload.engine, self.host
        dst = torch.empty(host.shape, dtype=host.dtype, device=self.device)
        engine.wait(engine.copy(dst, host))
        self.offload._pool.setdefault((host.shape, host.dtype), []).append(host)  # its copy has been waited on
        self.host = None
        return dst


def apply_activation_offload(model: Transformer, offload: ActivationOffload) -> Transformer:
    """Offload each checkpointed block's input (apply_activation_checkpointing first): a forward
    pre/post hook pair on each wrapped block enters and leaves `offload.saving()`, and the model's
    forward starts a new pass. Hooks only: state-dict keys and parameter names are unchanged."""
    for i, layer in enumerate(model.layers):
        if not isinstance(layer, CheckpointWrapper):
            raise ValueError(
                f"activation offload moves checkpointed blocks' inputs; block {i} is not checkpointed "
                "(apply activation checkpointing first)"
            )
        layer.register_forward_pre_hook(offload._enter)
        layer.register_forward_hook(offload._exit, always_call=True)
    model.register_forward_pre_hook(lambda module, args: offload.new_pass())
    return model
