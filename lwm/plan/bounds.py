"""What the planner can plan on this machine, checked before any fake work: a world, a length, a
batch or a parallel size beyond these is refused naming the limit and the option.

Fake tensors hold no memory on the device, but the planner is not free on the host:
- the fake process group's mesh is built there, in time linear in the world (65,536 ranks: 12 s
  a planned step); torch's process groups take an int32 world;
- the whole sequence is cut there, as the datamodule cuts it (make_batch: about 30 bytes a token
  of real host memory, 1 GB at the limit), and a prefill's prompt is made there too;
- every op of the real step runs in Python, each 1-40 ms under fake tensors and the tracker, so the
  step's loops set its time: the loss's chunks over a rank's tokens (a dozen ops each), and in every
  block, forward, recompute and backward, the ring's steps (cp per head group), the MLP's and the
  norms' sequence chunks.
The limits hold the largest plans in docs/planning.md, planned in 1-5 minutes (16M tokens on 32 GPUs;
7.3M on 8 with 8 head groups: 6,144 ring steps, 16,128 MLP and norm chunks and 896 loss chunks, 90 s on 2
cores; qwen3_8b at 16M on 32: 13,824 ring steps).
"""

from __future__ import annotations

from lwm.model import ModelConfig
from lwm.plan.memory import Mesh

MAX_WORLD = 16384  # GPUs: the fake group's mesh is built on the host, linear in the world
MAX_SEQ_LEN = 2**25  # tokens of one sequence (or prompt), made whole on the host: about 1 GB
MAX_LOSS_CHUNKS = 8192  # the loss's chunks over a rank's tokens in one step: 1.5-5 minutes
MAX_RING_STEPS = 16384  # the ring's steps in one step, every layer and pass: each 10-20 ms
MAX_CHUNK_PASSES = 65536  # the MLP's and norms' chunks in one step, every layer and pass: each 2-5 ms

# How to make each count smaller, for the messages.
_FEWER_TOKENS = "a shorter --seq-len (or stage seq_len), a smaller --batch or a larger --cp"


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def check_world(world: int, what: str) -> None:
    if world > MAX_WORLD:
        raise ValueError(
            f"{what}: a world of {world} GPUs, more than the {MAX_WORLD} the planner builds a mesh for "
            "(its fake process group is made on this machine, in time linear in the world)"
        )


def check_length(seq_len: int, what: str) -> None:
    if seq_len > MAX_SEQ_LEN:
        raise ValueError(
            f"{what}: {seq_len} tokens, more than the {MAX_SEQ_LEN} the planner plans (the sequence is made "
            "whole in this machine's memory)"
        )


def loss_chunks(mesh: Mesh, model: ModelConfig) -> int:
    """The loss's chunks on rank 0 in one step: its tokens (every sequence's slice) by loss_chunk_size."""
    return _ceil(mesh.batch * _ceil(mesh.seq_len, mesh.cp), model.loss_chunk_size)


def ring_steps(mesh: Mesh, model: ModelConfig) -> int:
    """The ring's steps on rank 0 in one step, an upper bound: cp for each head group in every layer's
    forward, recompute and backward (fewer under Ulysses)."""
    return 3 * model.n_layers * mesh.cp * max(1, model.attn_head_groups)


def chunk_passes(mesh: Mesh, model: ModelConfig) -> int:
    """The MLP's and the two norms' chunks over rank 0's slice in one step, in every layer's forward,
    recompute and backward."""
    local = _ceil(mesh.seq_len, mesh.cp)
    mlp = _ceil(local, model.mlp_chunk_size) if model.mlp_chunk_size else 1
    norm = _ceil(local, model.norm_chunk_size) if model.norm_chunk_size else 1
    return 3 * model.n_layers * (mlp + 2 * norm)


def check_step(mesh: Mesh, model: ModelConfig, what: str) -> None:
    """Refuses a training step the planner cannot plan in this machine's time and memory."""
    check_world(mesh.world, what)
    check_length(mesh.seq_len, what)
    chunks = loss_chunks(mesh, model)
    if chunks > MAX_LOSS_CHUNKS:
        raise ValueError(
            f"{what}: {chunks} loss chunks a step on a rank ({mesh.batch} x {mesh.seq_len} tokens / cp {mesh.cp} "
            f"/ model.loss_chunk_size {model.loss_chunk_size}), more than the {MAX_LOSS_CHUNKS} the planner runs "
            f"in minutes (each chunk's ops run one by one under fake tensors); {_FEWER_TOKENS}, or a larger "
            "model.loss_chunk_size"
        )
    steps = ring_steps(mesh, model)
    if steps > MAX_RING_STEPS:
        raise ValueError(
            f"{what}: {steps} ring steps a step (3 passes x {model.n_layers} layers x cp {mesh.cp} x "
            f"{max(1, model.attn_head_groups)} head groups), more than the {MAX_RING_STEPS} the planner runs in "
            "minutes (each step's ops run one by one under fake tensors); a smaller --cp or fewer "
            "model.attn_head_groups"
        )
    passes = chunk_passes(mesh, model)
    if passes > MAX_CHUNK_PASSES:
        raise ValueError(
            f"{what}: {passes} MLP and norm chunks a step (3 passes x {model.n_layers} layers over "
            f"{_ceil(mesh.seq_len, mesh.cp)} tokens a rank in model.mlp_chunk_size {model.mlp_chunk_size} / "
            f"model.norm_chunk_size {model.norm_chunk_size}), more than the {MAX_CHUNK_PASSES} the planner runs in "
            f"minutes; larger chunk sizes, {_FEWER_TOKENS}"
        )


def plannable(mesh: Mesh, model: ModelConfig) -> bool:
    try:
        check_step(mesh, model, "")
    except ValueError:
        return False
    return True


def longest_plannable(mesh: Mesh, model: ModelConfig, granule: int) -> int:
    """The longest multiple of `granule` the planner plans on `mesh` (its seq_len ignored); 0: none."""
    lo, hi = 0, MAX_SEQ_LEN // granule + 1  # lo plannable (0: trivially), hi not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if plannable(Mesh(mid * granule, mesh.cp, mesh.dp, mesh.batch, mesh.tp), model):
            lo = mid
        else:
            hi = mid
    return lo * granule


def check_prefill(seq_len: int, cp: int, model: ModelConfig, prefill_chunk: int, what: str) -> None:
    """Refuses a prefill the planner cannot plan: the prompt is made whole on the host, and each
    segment of prefill_chunk tokens a rank runs every layer (a ring of cp steps)."""
    check_world(cp, what)
    check_length(seq_len, what)
    steps = model.n_layers * _ceil(seq_len, prefill_chunk * cp) * cp
    if steps > MAX_RING_STEPS:
        raise ValueError(
            f"{what}: {steps} ring steps a prefill ({model.n_layers} layers x segments of --prefill-chunk "
            f"{prefill_chunk} tokens a rank x cp {cp}), more than the {MAX_RING_STEPS} the planner runs "
            "in minutes; a larger --prefill-chunk, a shorter --infer or a smaller --cp"
        )
