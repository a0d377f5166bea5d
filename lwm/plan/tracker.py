"""torch's FSDP2 memory tracker, made to report what a GPU would hold under fake tensors, and a
counter of the bytes a step moves (collectives, point-to-point, and written by other ops)."""

from __future__ import annotations

import itertools
from collections import Counter
from contextlib import contextmanager
from copy import deepcopy

import torch
from torch._guards import active_fake_mode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType, _FSDPState
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _UpdateType
from torch.distributed.tensor import DTensor
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
CATEGORY = {kind: name for name, kinds in PARTS.items() for kind in kinds}
# A tensor's device asked from C++ (about every other dispatch under fake tensors): makes no tensor, so
# the plan's modes pass it straight on.
DEVICE_OF = torch.ops.prim.device.default
WAIT_TENSOR = torch.ops._c10d_functional.wait_tensor.default
ALL_GATHER = torch.ops.c10d._allgather_base_.default
REDUCE_SCATTER = torch.ops.c10d._reduce_scatter_base_.default
SHORT_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


# What FSDP2's CPU offload keeps in host memory: the parameter shards, their gradients, AdamW's state.
HOST_STATES = (_FSDPRefType.SHARDED_PARAM, _FSDPRefType.SHARDED_GRAD, _FSDPRefType.OPT)


class PlanTracker(FSDPMemTracker):
    """FSDPMemTracker that leaves out DTensor's shape propagation, keeps only the device totals'
    peak, and can restart it. `device` is the compute device (where the model's parameters are):
    its peak is the plan's peak; another device (the host that activation offload copies to: the
    meta device under the planner) has its own peak, host_peak.

    host_states: the run offloads its states (parallel.param_offload); they are counted on `host`,
    as is everything the optimizer step makes (AdamW runs on the CPU). Under the planner the
    device's tensors are fake CPU ones and FSDP2's copies to "cpu" change nothing, so the tracker
    places them: a reduce-scatter's output leaves the device when it becomes the gradient (FSDP2
    copies it out and drops it). Not counted: the fp32 copy of one parameter shard that FSDP2 brings
    in before casting it for the all-gather (freed at once: at most the largest shard of a layer,
    224 MiB for llama3_8b's MLP on one GPU, or the root's embedding and head at the step's start).

    DTensor computes an op's output metadata by running it on global-shape tensors under the
    active fake mode; the tracker skips those only when they run under another fake mode than the
    one it was entered in, so under the planner's FakeTensorMode it counted them: in gradient
    clipping a phantom of the whole unsharded fp32 gradient (25 GiB at 7b)."""

    def __init__(
        self,
        module,
        optimizer,
        device: torch.device | str,
        host_states: bool = False,
        host: torch.device | str = "meta",
    ):
        super().__init__(module, optimizer)
        self.device, self.host, self.host_states = torch.device(device), torch.device(host), host_states
        self._propagating = 0
        # Where the peak is: each storage stamped with what made it when first counted, and a log of
        # (origin, kind, bytes) changes whose prefix up to the peak's index is the peak's live set.
        self._op: str | None = None  # the op being dispatched
        self._dtype: torch.dtype | None = None  # the tensor whose storage is being counted
        self._log: list[tuple[tuple, object, int]] = []
        self._peak_at = 0
        self._stepping = False  # from restart_peak on: what the measured step makes
        self._entered: dict[str, int] = {}  # module -> when its forward or backward last began
        self._entries = itertools.count()  # strictly increasing: a module entered later wins a tie
        self._recomputing: set[str] = set()  # modules whose forward runs inside backward
        self._counter: WorkCounter | None = None  # counting(): the step's work, counted here

    def __enter__(self):
        if self._depth == 0:
            self._mod_tracker.register_user_hooks(self._on_forward, self._on_forward_end, self._on_backward)
        return super().__enter__()

    def __exit__(self, *args) -> None:
        super().__exit__(*args)
        if self._depth == 0:
            self._mod_tracker.clear_user_hooks()

    def _on_forward(self, module, inputs) -> None:
        name = self._mod_tracker.get_known_fqn(module)
        self._entered[name] = next(self._entries)
        if self._mod_tracker.is_bw:  # activation checkpointing reruns it
            self._recomputing.add(name)

    def _on_forward_end(self, module, inputs, outputs) -> None:
        self._recomputing.discard(self._mod_tracker.get_known_fqn(module))

    def _on_backward(self, module, grad_outputs) -> None:
        self._entered[self._mod_tracker.get_known_fqn(module)] = next(self._entries)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        """FSDPMemTracker's accounting in one pass, and the step's work counted (`counting`): a plan
        dispatches ~10^6 ops, and each mode over the fake one costs about as much as torch's
        tracking (the two modes and torch's generic output walk were 45% of a layer's plan time)."""
        if self._propagating or func is DEVICE_OF:
            return func(*args, **(kwargs or {}))
        if DTensor in types:  # DTensor runs its local ops, which come back here
            return NotImplemented
        outer, self._op = self._op, func.overloadpacket.__name__
        try:
            if func is WAIT_TENSOR and active_fake_mode():  # as torch's tracker: the wait makes no tensor
                out = args[0]
            else:
                out = func(*args, **(kwargs or {}))
            if active_fake_mode() is self._fake_mode_on_entry:
                self._account(func, args, out)
        finally:
            self._op = outer
        if self._counter is not None:
            self._counter.count(func, args, out)
        return out

    def _account(self, func, args, out) -> None:
        """torch's FSDPMemTracker.__torch_dispatch__ after the op (torch 2.14): gathered and
        reduce-scattered buffers, then the outputs under the phase's kind."""
        if self._in_opt:
            reftype = _FSDPRefType.OPT
        elif self._mod_tracker.is_bw and not self._in_ac:
            reftype = _FSDPRefType.TEMP
        else:
            reftype = _FSDPRefType.ACT
        if func is ALL_GATHER and self._fsdp_state in (_FSDPState.PRE_FW, _FSDPState.PRE_BW):
            self._update_and_maybe_create_winfos(args[0], _FSDPRefType.ALL_GATHER, update_existing=True)
        elif func is REDUCE_SCATTER and self._fsdp_state == _FSDPState.POST_BW:
            self._update_and_maybe_create_winfos(args[1], _FSDPRefType.REDUCE_SCATTER, update_existing=True)
        for t in _tensors(out):
            self._track(reftype, t)
        self._update_peak_stats(None)

    @contextmanager
    def counting(self, counter: WorkCounter):
        """Count the step's work into `counter` from this mode, as WorkCounter's own would."""
        self._counter = counter
        try:
            yield counter
        finally:
            self._counter = None

    def _track(self, reftype, t) -> None:
        self._dtype = t.dtype
        super()._track(reftype, t)

    def _update_and_maybe_create_winfos(self, t, reftype, update_existing=False):
        self._dtype = t.dtype
        return super()._update_and_maybe_create_winfos(t, reftype, update_existing)

    def _origin(self) -> tuple[str, str, str, str]:
        """(module, phase, op, dtype) of what is running now: the module the step entered last of
        those it is in (its path in the model), forward, backward, recompute (a checkpointed block's forward
        rerun in backward) or optimizer; the op; the dtype of the tensor being counted. What exists
        before the measured step (parameters, AdamW's state) is "held"."""
        dtype = SHORT_DTYPES.get(self._dtype, str(self._dtype).removeprefix("torch."))
        if not self._stepping:  # parameters, optimizer state: made before the measured step
            return "model", "held", "-", dtype
        inside = [n for n in self._mod_tracker.parents if "." in n]  # not Global, not the root
        module = _readable(max(inside, key=lambda n: self._entered.get(n, -1)).split(".", 1)[1]) if inside else "model"
        if self._in_opt:
            phase = "optimizer"
        elif self._mod_tracker.is_bw:
            phase = "recompute" if self._recomputing else "backward"
        else:
            phase = "forward"
        return module, phase, self._op or "-", dtype

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
        if getattr(winfo, "origin", None) is None:
            winfo.origin = self._origin()
            winfo.made_by_optimizer = self._in_opt
        where = self._where(winfo.reftype, winfo)
        if u_type == _UpdateType.REF and self._where(old_reftype, winfo) != where:  # out to the host
            kind, winfo.reftype = winfo.reftype, old_reftype
            self._place(_UpdateType.DEL, winfo, self._where(old_reftype, winfo))
            winfo.reftype = kind
            self._place(_UpdateType.ADD, winfo, where)
        else:
            self._place(u_type, winfo, where, old_mem_consumed, old_reftype)

    def _where(self, kind, winfo) -> torch.device:
        if self.host_states and (kind in HOST_STATES or winfo.made_by_optimizer):
            return self.host
        return winfo.device

    def _place(self, u_type, winfo, where: torch.device, old_mem_consumed=None, old_reftype=None) -> None:
        """torch's update of the snapshot, on `where`, and the breakdown's log on the compute device."""
        real, winfo.device = winfo.device, where
        try:
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
        finally:
            winfo.device = real
        origin = winfo.origin
        if where != self.device:  # the breakdown is the compute device's
            return
        if u_type == _UpdateType.ADD:
            self._log.append((origin, winfo.reftype, winfo.mem_consumed))
        elif u_type == _UpdateType.DEL:
            self._log.append((origin, winfo.reftype, -winfo.mem_consumed))
        elif u_type == _UpdateType.REF:
            self._log.append((origin, old_reftype, -winfo.mem_consumed))
            self._log.append((origin, winfo.reftype, winfo.mem_consumed))
        elif u_type == _UpdateType.SIZE:
            self._log.append((origin, winfo.reftype, winfo.mem_consumed - old_mem_consumed))

    def held_as_gradients(self, model) -> None:
        """Count the parameters' gradients as gradients now (torch's tracker files a gradient made
        outside backward as an activation until FSDP2's next forward hook looks at it)."""
        for p in model.parameters():
            if p.grad is not None:
                self._update_and_maybe_create_winfos(p.grad, _FSDPRefType.SHARDED_GRAD, update_existing=True)

    def breakdown(self) -> list[dict]:
        """The tensors live at the peak, grouped by what made them (module, phase, op, dtype) and by
        the tracker's category, largest first; their bytes add up to the peak."""
        groups: Counter = Counter()
        for origin, kind, nbytes in self._log[: self._peak_at]:
            groups[(*origin, CATEGORY[kind])] += nbytes
        rows = [
            {"module": m, "phase": p, "op": o, "dtype": d, "category": c, "bytes": n}
            for (m, p, o, d, c), n in groups.items()
            if n
        ]
        return sorted(rows, key=lambda r: (-r["bytes"], r["module"], r["phase"], r["op"], r["category"]))

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
                if dev == self.device:
                    self._peak_at = len(self._log)

    def restart_peak(self) -> None:
        """The peak from now on (the tracker has no public reset of it; module stats reset too)."""
        self.reset_mod_stats()
        self._peak_mem_snap = deepcopy(self.get_tracker_snapshot("current"))
        self._peak_mem = {dev: snap["Total"] for dev, snap in self._peak_mem_snap.items()}
        self._peak_at = len(self._log)
        self._stepping = True

    def peak(self) -> tuple[int, dict[str, int]]:
        """(peak bytes, its parts) on the compute device."""
        snaps = self.get_tracker_snapshot("peak")
        if self.device not in snaps:
            raise RuntimeError(f"the tracker saw nothing on the compute device {self.device}, only on {list(snaps)}")
        snap = snaps[self.device]
        parts = {name: sum(snap.get(k, 0) for k in kinds) for name, kinds in PARTS.items()}
        return snap["Total"], parts

    def host_peak(self, host: torch.device | str) -> int:
        """Peak bytes on `host` (0: nothing was put there)."""
        return self.get_tracker_snapshot("peak").get(torch.device(host), {}).get(_TOTAL_KEY, 0)


def _readable(path: str) -> str:
    """A module's path as the model names it: `layers.1._checkpoint_wrapped_module.attention` ->
    `layers.1.attention`."""
    return ".".join(p for p in path.split(".") if p not in ("_checkpoint_wrapped_module", "_fsdp_wrapped_module"))


def label(row: dict) -> str:
    """One breakdown row in words: `layers.1.attention backward: mm fp32 temporaries`."""
    return f"{row['module']} {row['phase']}: {row['op']} {row['dtype']} {row['category']}"


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
    """Bytes a step moves: per rank, out of each collective and point-to-point send, between the
    device and the host (a copy from one device to another: activation offload), and written to
    memory by every op that is not a matmul, attention kernel, view or collective (elementwise,
    reductions, copies, the optimizer): the HBM traffic the roofline charges."""

    def __init__(self):
        super().__init__()
        # "all_gather" | "reduce_scatter" | "all_reduce" | "all_to_all" | "p2p" | "host" -> bytes
        self.sent: Counter = Counter()
        self.written = 0
        self.optimizer_written = 0  # the part of `written` the optimizer step wrote (on the CPU under param offload)
        self.in_optimizer = False  # set by the optimizer's step hooks (count_optimizer)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.count(func, args, out)
        return out

    def count(self, func, args, out) -> None:
        """Count one op that ran: `out` is what it returned."""
        kind, views = _OPS.get(func) or _OPS.setdefault(func, _classify(func))
        if kind == "comm":
            self._count_comm(func.overloadpacket.__name__, args)
        elif kind == "copy" and args[0].device != args[1].device:  # offload: to the host and back
            self.sent["host"] += args[0].nbytes
        elif kind != "compute":
            nbytes = sum(_written(t) for t, view in _returned(out, views) if not view)
            self.written += nbytes
            self.optimizer_written += nbytes if self.in_optimizer else 0

    def count_optimizer(self, optimizer) -> list:
        """Mark `optimizer`'s steps (their writes are optimizer_written); returns the hooks' handles."""

        def enter(*args) -> None:
            self.in_optimizer = True

        def leave(*args) -> None:
            self.in_optimizer = False

        return [optimizer.register_step_pre_hook(enter), optimizer.register_step_post_hook(leave)]

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
    """The tensors an op returned: itself, or those in its tuple or list (nested: _fused_adam's)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if not isinstance(out, (tuple, list)):
        return []
    return [t for o in out for t in ([o] if isinstance(o, torch.Tensor) else _tensors(o))]


def _returned(out, views: tuple[bool, ...]):
    """(tensor, whether it is a view) for each tensor an op returned; a list return's flag covers all its
    tensors (split, chunk and unbind return one list of views)."""
    outs = out if isinstance(out, (tuple, list)) and len(views) > 1 else (out,)
    for o, view in itertools.zip_longest(outs, views, fillvalue=False):
        for t in _tensors(o):
            yield t, view


# What WorkCounter does with each op, worked out on its first call (a plan dispatches ~10^6 ops).
_OPS: dict = {}


def _classify(func) -> tuple[str, tuple[bool, ...]]:
    """(kind, per return whether it is a view: its bytes do not move). Kinds: comm, a collective or
    point-to-point op (functional: DTensor's, tensor parallelism); copy, a copy (host traffic when it
    crosses devices, else written); compute, timed from its arithmetic, or moves nothing (a tensor's
    device); written, its outputs' bytes are HBM traffic."""
    name = func.overloadpacket.__name__
    views = tuple(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)
    if func.namespace in ("c10d", "_c10d_functional"):
        return "comm", views
    if name == "copy_":
        return "copy", views
    return ("compute" if name.startswith(COMPUTE_OPS) or func is DEVICE_OF else "written"), views


def _written(t: torch.Tensor) -> int:
    # A DTensor op (AdamW and clipping on FSDP2's shards) writes this rank's shard, not the global shape.
    return t.to_local().nbytes if isinstance(t, DTensor) else t.nbytes
