"""torch's FSDP2 memory tracker, made to report what a GPU would hold under fake tensors, and a
counter of the bytes a step moves (collectives, point-to-point, and written by other ops)."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from copy import deepcopy

import torch
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.utils._python_dispatch import TorchDispatchMode

# The tracker's categories, grouped as the plan reports them.
PARTS = {
    "parameters": (_FSDPRefType.SHARDED_PARAM, _FSDPRefType.UNSHARDED_PARAM, _FSDPRefType.BUFFER),
    "gradients": (_FSDPRefType.SHARDED_GRAD, _FSDPRefType.UNSHARDED_GRAD),
    "optimizer": (_FSDPRefType.OPT,),
    "activations": (_FSDPRefType.ACT,),  # saved in forward and made again by recomputation
    "temporaries": (_FSDPRefType.TEMP,),  # made in backward: gradients of activations, kernels' scratch
    "communication": (_FSDPRefType.ALL_GATHER, _FSDPRefType.REDUCE_SCATTER),
    "inputs": (_FSDPRefType.INP,),
}


class PlanTracker(FSDPMemTracker):
    """FSDPMemTracker that leaves out DTensor's shape propagation, keeps only the device totals'
    peak, and can restart it.

    DTensor computes an op's output metadata by running it on global-shape tensors under the
    active fake mode; the tracker skips those only when they run under another fake mode than the
    one it was entered in, so under the planner's FakeTensorMode it counted them: in gradient
    clipping a phantom of the whole unsharded fp32 gradient (25 GiB at 7b)."""

    def __init__(self, module, optimizer=None):
        super().__init__(module, optimizer)
        self._propagating = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._propagating:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    @contextmanager
    def skipping_propagation(self):
        original = ShardingPropagator._propagate_tensor_meta_non_cached

        def propagate(prop, *args, **kwargs):
            self._propagating += 1
            try:
                return original(prop, *args, **kwargs)
            finally:
                self._propagating -= 1

        ShardingPropagator._propagate_tensor_meta_non_cached = propagate
        try:
            with self:
                yield self
        finally:
            ShardingPropagator._propagate_tensor_meta_non_cached = original

    def _update_peak_stats(self, peak_state) -> None:
        """The device totals' peak only. torch's also walks every module's statistics after every
        op to keep per-module peaks, which the plan does not report: 15-25% of a 7b plan's time
        (the peak and its parts are the same, checked on debug, tiny and 7b steps)."""
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                self._peak_mem[dev] = snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(snap)

    def restart_peak(self) -> None:
        """The peak from now on (the tracker has no public reset of it; module stats reset too)."""
        self.reset_mod_stats()
        self._peak_mem_snap = deepcopy(self.get_tracker_snapshot("current"))
        self._peak_mem = {dev: snap["Total"] for dev, snap in self._peak_mem_snap.items()}

    def peak(self) -> tuple[int, dict[str, int]]:
        """(peak bytes, its parts) on the one device the step ran on."""
        snaps = self.get_tracker_snapshot("peak")
        if len(snaps) != 1:
            raise RuntimeError(f"expected one device in the tracker's peak, got {list(snaps)}")
        (snap,) = snaps.values()
        parts = {name: sum(snap.get(k, 0) for k in kinds) for name, kinds in PARTS.items()}
        return snap["Total"], parts


class PeakTracker(MemTracker):
    """MemTracker's device totals without its per-module statistics, which refuse a module called
    more than once per iteration (the prefill runs every layer once per segment)."""

    def _pre_fw_hook(self, module, inputs) -> None:
        pass

    def _post_fw_hook(self, module, inputs, outputs) -> None:
        pass

    def _pre_bw_hook(self, module, args) -> None:
        pass

    def _post_bw_hook(self, module, args) -> None:
        pass


# Ops whose cost is their arithmetic (timed from the work counts), or that move nothing in memory.
COMPUTE_OPS = ("mm", "addmm", "bmm", "matmul", "linear", "_scaled_dot_product")


class WorkCounter(TorchDispatchMode):
    """Bytes a step moves: per rank, out of each collective and point-to-point send, and written to
    memory by every op that is not a matmul, attention kernel, view or collective (elementwise,
    reductions, copies, the optimizer): the HBM traffic the roofline charges."""

    def __init__(self):
        super().__init__()
        self.sent: Counter = Counter()  # "all_gather" | "reduce_scatter" | "all_reduce" | "all_to_all" | "p2p" -> bytes
        self.written = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.namespace in ("c10d", "_c10d_functional"):  # functional: DTensor's (tensor parallelism)
            self._count_comm(name, args)
        elif not name.startswith(COMPUTE_OPS):
            self.written += sum(_written(func, i, t) for i, t in enumerate(_tensors(out)))
        return out

    def _count_comm(self, name: str, args) -> None:
        if name == "send":
            self.sent["p2p"] += sum(t.nbytes for t in args[0])
        elif name == "_allgather_base_":
            self.sent["all_gather"] += args[0].nbytes  # the gathered output: (w - 1) / w of it arrives
        elif name == "_reduce_scatter_base_":
            self.sent["reduce_scatter"] += args[1].nbytes
        elif name.startswith("allreduce"):
            self.sent["all_reduce"] += sum(t.nbytes for t in args[0])
        elif name == "all_reduce":  # functional: tensor parallelism's partial sums
            self.sent["all_reduce"] += args[0].nbytes
        elif name == "alltoall_base_":  # Ulysses: the input, of which (g - 1) / g leaves the rank
            self.sent["all_to_all"] += args[1].nbytes


def _tensors(out) -> list:
    return [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]


def _written(func, index: int, t: torch.Tensor) -> int:
    returns = func._schema.returns
    alias = returns[index].alias_info if index < len(returns) else None
    if alias is not None and not alias.is_write:  # a view: no bytes move
        return 0
    return t.nbytes
