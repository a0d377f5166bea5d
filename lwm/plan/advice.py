"""The cheapest change that makes a stage fit where no larger cp does: the memory features a run
can turn on, tried one more at a time, cheapest first, each planned by running it (memory.plan_step).

The ladder, by what each costs at long context:
  1. activation checkpointing: the blocks' forward again in backward (a third more matmuls), and
     the saved activations fall from a layer's every tensor to its input;
  2. sequence-tiled norms (model.norm_chunk_size): the norms again, elementwise, nearly free;
  3. the blockwise MLP (model.mlp_chunk_size): the MLP's matmuls again;
  4. activation offload (parallel.activation_offload): each block's input to host memory and back,
     on a side stream, hidden by compute while the PCIe link keeps up;
  5. parameter offload (parallel.param_offload): the parameter shards, gradients and AdamW state
     to host memory (FSDP2's CPUOffloadPolicy); their copies run beside compute, and AdamW on the
     CPU adds seconds a step, which long context's minutes of attention make small;
  6. head groups (model.attn_head_groups): the attention's forward once more in backward (2 of its
     9 products), the dearest at long context, where attention is nearly all of the step.
A step of the ladder that changes nothing at this length (chunks longer than a rank's slice, a
setting already on, head groups under tensor parallelism) is skipped. Once a set fits, each earlier
step it still fits without is dropped (the dearest first), so the set named has no step to spare.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from lwm.core.config import ParallelConfig
from lwm.model import ModelConfig
from lwm.plan.devices import Device
from lwm.plan.memory import Mesh, StepMemory, mesh_dims

CHUNK = 16384  # tokens per chunk of the tiled norms and MLP: fp32 work of 256 MiB at dim 4096


@dataclass(frozen=True)
class Change:
    overrides: tuple[str, ...]  # what to add to the command line, all of them
    model: ModelConfig
    parallel: ParallelConfig


Step = tuple[str, dict, dict]  # (the override, its ModelConfig fields, its ParallelConfig fields)


def steps(model: ModelConfig, parallel: ParallelConfig, mesh: Mesh) -> list[Step]:
    """The ladder's steps for this mesh, cheapest first (the module docstring)."""
    local = mesh.seq_len // mesh.cp
    found: list[Step] = []
    if not parallel.activation_checkpointing:
        found.append(("parallel.activation_checkpointing=true", {}, {"activation_checkpointing": True}))
    if not model.norm_chunk_size and local > CHUNK:
        found.append((f"model.norm_chunk_size={CHUNK}", {"norm_chunk_size": CHUNK}, {}))
    if not model.mlp_chunk_size and local > CHUNK:
        found.append((f"model.mlp_chunk_size={CHUNK}", {"mlp_chunk_size": CHUNK}, {}))
    if not parallel.activation_offload:
        found.append(("parallel.activation_offload=true", {}, {"activation_offload": True}))
    if not parallel.param_offload:
        found.append(("parallel.param_offload=true", {}, {"param_offload": True}))
    groups = head_groups(model, parallel, mesh)
    if groups > 1:
        found.append((f"model.attn_head_groups={groups}", {"attn_head_groups": groups}, {}))
    return found


def with_steps(model: ModelConfig, parallel: ParallelConfig, chosen: list[Step]) -> Change:
    """The run with `chosen` steps on; raises ValueError where ParallelConfig refuses the set
    (activation offload without checkpointing)."""
    for _, model_fields, parallel_fields in chosen:
        model = model.replace(**model_fields)
        parallel = dataclasses.replace(parallel, **parallel_fields)
    return Change(tuple(override for override, _, _ in chosen), model, parallel)


def head_groups(model: ModelConfig, parallel: ParallelConfig, mesh: Mesh) -> int:
    """The most head groups (up to 8) the mesh runs: they divide the kv heads, need tp 1, and keep
    each group's heads divisible by Ulysses' all-to-all; 1 where none do."""
    if model.attn_head_groups > 1:
        return 1  # already on
    for groups in (8, 4, 2):
        if model.n_kv_heads % groups:
            continue
        try:
            mesh_dims(mesh, parallel).check_model(model.n_heads, model.n_kv_heads, groups)
        except ValueError:
            continue
        return groups
    return 1


@dataclass
class Advice:
    change: Change | None  # the first of the ladder that fits (None: none does)
    memory: StepMemory | None  # its planned step
    tried: dict[str, int]  # the overrides of each step planned -> its planned peak


def fits_node(device: Device, memory: StepMemory, ranks_per_node: int) -> bool:
    """The planned step fits the device, and its node's host with `ranks_per_node` ranks offloading as it does."""
    return device.fits(memory.peak) and device.host_fits(memory.host_peak, ranks_per_node)


def cheapest_fit(
    model: ModelConfig,
    parallel: ParallelConfig,
    mesh: Mesh,
    plan: Callable[[ModelConfig, ParallelConfig], StepMemory],
    device: Device,
    ranks_per_node: int,
) -> Advice:
    """Plan the ladder's steps, one more at a time, until a set fits on `device` and on its node's
    host memory with `ranks_per_node` ranks offloading; then drop each earlier step the set still
    fits without, the dearest first (at short lengths parameter offload alone may fit, where the
    ladder reached it through checkpointing and activation offload)."""
    advice = Advice(None, None, {})

    def fits(chosen: list[Step]):
        change = with_steps(model, parallel, chosen)
        memory = plan(change.model, change.parallel)
        advice.tried[" ".join(change.overrides)] = memory.peak
        return memory if fits_node(device, memory, ranks_per_node) else None

    found = steps(model, parallel, mesh)
    for n in range(1, len(found) + 1):  # one more step at a time, until a set fits
        memory = fits(found[:n])
        if memory is not None:
            break
    else:
        return advice
    chosen = found[:n]
    for step in reversed(chosen[:-1]):  # the dearest first
        fewer = [s for s in chosen if s is not step]
        try:
            with_steps(model, parallel, fewer)
        except ValueError:  # another chosen step needs it (activation offload: checkpointing)
            continue
        if (smaller := fits(fewer)) is not None:
            chosen, memory = fewer, smaller
    advice.change, advice.memory = with_steps(model, parallel, chosen), memory
    return advice


def fewer_kept_blocks(
    model: ModelConfig,
    parallel: ParallelConfig,
    mesh: Mesh,
    plan: Callable[[ModelConfig, ParallelConfig], StepMemory],
    device: Device,
    ranks_per_node: int,
    memory: StepMemory,
    attempts: int = 3,
) -> Advice:
    """Where the blocks' kept attention outputs overfill the node's host memory (`memory`, the step planned
    with them): the most blocks that keep theirs and fit (parallel.keep_attention_blocks), each count
    guessed from one block's output (a rank's tokens x heads x head_dim in bf16, its fp32 logsumexp) and
    planned, at most `attempts` of them."""
    advice = Advice(None, None, {})
    kept = parallel.kept_blocks(model.n_layers)
    block = mesh.batch * mesh.seq_len // mesh.cp * model.n_heads // mesh.tp * (model.head_dim * 2 + 4)
    for blocks in range(kept - 1, 0, -1):
        if len(advice.tried) == attempts:
            break
        if not device.host_fits(memory.host_peak - (kept - blocks) * block, ranks_per_node):
            continue
        change = Change(
            (f"parallel.keep_attention_blocks={blocks}",),
            model,
            dataclasses.replace(parallel, keep_attention_blocks=blocks),
        )
        planned = plan(change.model, change.parallel)
        advice.tried[change.overrides[0]] = planned.peak
        if fits_node(device, planned, ranks_per_node):
            advice.change, advice.memory = change, planned
            break
    return advice
