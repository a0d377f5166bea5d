"""How long a step takes: the step's exact work against a device's roofline.

Work, per rank and step (rank 0; with striped or zigzag every rank does the same):
  matmuls     2 x (the blocks' and the output head's parameters) x tokens, three times (forward,
              and backward's two products), once more with activation checkpointing (recompute);
              the chunked loss computes its head gradients in its forward, which this counts. The
              tilings that recompute in backward add theirs: the attention's projections once more
              under head groups (model.attn_head_groups), the MLP's under model.mlp_chunk_size.
  attention   the score entries the ring schedule computes (lwm.parallel.blocks.block_work over
              every ring step) x heads x head_dim x 2 flops, for 2 products in forward, 5 in
              backward (FlashAttention's recomputed scores, dV, dP, dQ, dK), 2 more with recompute (none where
              checkpointed blocks keep their attention: parallel.keep_attention),
              2 more again under head groups (each group's forward is recomputed in its backward; none
              either where the block keeps its attention); with parallel.keep_attention_blocks only those
              blocks are spared.
  memory      twice the bytes the step's other ops write (each written once, read once): norms,
              RoPE, activations' casts, the loss's softmax, AdamW (counted on the fake step, which
              runs eager); with compiled blocks (parallel.compile_blocks) less what inductor's
              fused kernels save in each block's norms, SwiGLU and RoPE (lwm.plan.compiled, per
              token and block, times each region's forward passes and its backward).
  links       what the step sent: the ring's key/value blocks and dK/dV, Ulysses' all-to-alls,
              tensor parallelism's all-reduces, FSDP's all-gathers and reduce-scatters (counted on
              the fake step).
  host        the bytes activation offload copies to the host and back (counted on the fake step)
              and, with parameter offload, FSDP2's copies of the parameter shards in and the
              gradients out (memory.state_copies), over the GPU's PCIe link.
  optimizer   with parameter offload, AdamW runs on the CPU: twice the bytes it writes (counted on
              the fake step, this rank's shards) at the rank's share of the node's host memory rate.

Tensor parallelism splits the blocks' projections and the heads over tp ranks; the embedding and
output head are whole on each (lwm.parallel.tensor), so each tp rank computes the head's matmuls
for all its tokens.

Overlap, as the code does it: the ring sends the next block while the current one is computed, so
attention takes the longer of the two; FSDP2 prefetches the next layer's gather and reduces the
last one's gradients during compute, so the step takes the longer of compute and FSDP traffic;
activation offload copies on a side stream while the next layer computes, so the step takes the
longer of compute and the host copies too (the part of the copies compute hides is reported).
Ulysses' all-to-alls and tensor parallelism's all-reduces sit between the ops that need them (no
overlap): they add to compute, as does the CPU's AdamW step (the GPU waits for it). FSDP2's copies
of offloaded parameters and gradients run on its all-gather and reduce-scatter streams, beside
compute, and count with activation offload's in the host part.
"""

from __future__ import annotations

from dataclasses import dataclass

from lwm.model import ModelConfig
from lwm.parallel.blocks import block_part, block_work
from lwm.parallel.kept import kept_count
from lwm.plan.compiled import CompiledSaving
from lwm.plan.devices import Device
from lwm.plan.memory import Mesh, StepMemory


def attention_params(config: ModelConfig) -> int:
    """The blocks' attention projections (wq, wk, wv, wo)."""
    return config.n_layers * config.dim * config.head_dim * (2 * config.n_heads + 2 * config.n_kv_heads)


def mlp_params(config: ModelConfig) -> int:
    """The blocks' MLP projections (w1, w3, w2)."""
    return config.n_layers * 3 * config.dim * config.ffn_dim


def block_params(config: ModelConfig) -> int:
    """The blocks' projections: what tensor parallelism splits."""
    return attention_params(config) + mlp_params(config)


def matmul_params(config: ModelConfig, tp: int = 1) -> int:
    """Parameters that take part in one tp rank's matmuls: its share of the blocks' projections and
    the whole output head (the embedding is a lookup, norms are elementwise)."""
    return block_params(config) // tp + config.vocab_size * config.dim


def recomputing_tilings(config: ModelConfig, local_len: int) -> dict[str, bool]:
    """Which of the model's tilings recompute their part once more in backward at a rank's slice of
    local_len tokens: head groups (their projections, RoPE and attention), the blockwise MLP and the tiled
    norms (each when the slice is longer than one chunk)."""
    return {
        "rope": config.attn_head_groups > 1,
        "mlp": 0 < config.mlp_chunk_size < local_len,
        "norms": 0 < config.norm_chunk_size < local_len,
    }


def tiling_recompute(config: ModelConfig, local_len: int, tp: int = 1) -> tuple[int, int]:
    """(matmul parameters recomputed once more per token, extra attention forwards) of the model's
    tilings in training: head groups rerun the attention's projections and forward in backward,
    the blockwise MLP its projections."""
    attn, mlp = attention_params(config) // tp, mlp_params(config) // tp
    tiled = recomputing_tilings(config, local_len)
    return (attn if tiled["rope"] else 0) + (mlp if tiled["mlp"] else 0), int(tiled["rope"])


def region_passes(config: ModelConfig, local_len: int, checkpointing: bool) -> dict[str, int]:
    """Forward passes a step runs of each compiled region of a block: once, again in the checkpointed
    block's recompute, and once more where a tiling recomputes it in backward."""
    return {name: 1 + int(checkpointing) + int(again) for name, again in recomputing_tilings(config, local_len).items()}


def attention_entries(seq_len: int, cp: int, layout: str, mode: str, rank: int = 0) -> int:
    """Causal score entries one rank computes per sequence, head and layer."""
    if mode == "ulysses" or cp == 1:  # the whole sequence per head; heads are split (ulysses)
        return seq_len * (seq_len + 1) // 2
    local = seq_len // cp
    return sum(block_work(block_part(layout, rank, (rank - s) % cp, local, True), local) for s in range(cp))


@dataclass
class Work:
    matmul_flops: float  # executed, recompute included
    attention_flops: float  # executed
    model_flops: float  # forward + backward without recompute: what MFU divides by
    hbm_bytes: float
    ring_bytes: float  # point-to-point, per rank
    fsdp_bytes: float  # all-gathers and reduce-scatters arriving at this rank
    tp_bytes: float = 0.0  # tensor parallelism's all-reduces, sent per rank (a ring all-reduce's 2 (tp - 1) / tp)
    a2a_bytes: float = 0.0  # Ulysses' all-to-alls, sent per rank
    host_bytes: float = 0.0  # offload: copied to the host and back, per rank
    host_optimizer_bytes: float = 0.0  # parameter offload: AdamW's memory traffic on the CPU, per rank
    compiled_saved_bytes: float = 0.0  # compiled blocks: HBM traffic their fused kernels take off hbm_bytes


def step_work(
    config: ModelConfig,
    mesh: Mesh,
    memory: StepMemory,
    layout: str,
    mode: str,
    checkpointing: bool,
    all_to_all: int = 0,
    states_on_host: bool = False,
    keep_attention: bool | int = False,
    compiled: CompiledSaving | None = None,
) -> Work:
    """all_to_all: the size of Ulysses' groups (hybrid's ulysses; 0: the whole cp group);
    states_on_host: parameter offload (the optimizer's writes are the CPU's, not HBM's); keep_attention:
    checkpointed blocks keep their attention's output, so their recompute (and their head groups') runs no
    attention forward: True every block, a number the first that many (lwm.parallel.kept_count);
    compiled: what compiled blocks save (lwm.plan.compiled_saving of this config and tp; None: eager)."""
    tokens = mesh.batch * mesh.seq_len // mesh.cp
    executed = 6 * matmul_params(config, mesh.tp) * tokens
    useful = 6 * (block_params(config) + config.vocab_size * config.dim) / mesh.tp * tokens  # the head once
    heads = config.n_heads // mesh.tp // (mesh.cp if mode == "ulysses" else 1)
    per_product = 2 * config.head_dim * heads * config.n_layers * mesh.batch
    entries = max(attention_entries(mesh.seq_len, mesh.cp, layout, mode, r) for r in range(mesh.cp))
    attn_model = 7 * per_product * entries
    recompute = 2 * matmul_params(config, mesh.tp) * tokens, 2 * per_product * entries
    tiled_params, tiled_forwards = tiling_recompute(config, mesh.seq_len // mesh.cp, mesh.tp)
    recomputing = 1 - kept_count(keep_attention, config.n_layers) / config.n_layers if checkpointing else 1
    tiled = 2 * tiled_params * tokens, recomputing * tiled_forwards * 2 * per_product * entries
    fsdp = mesh.world // mesh.tp  # FSDP2 shards over dp x cp; a collective's own shard does not travel
    sent = memory.sent
    on_host = memory.optimizer_written if states_on_host else 0
    passes = region_passes(config, mesh.seq_len // mesh.cp, checkpointing)
    fused = compiled.per_token(passes) * tokens * config.n_layers if compiled else 0
    return Work(
        matmul_flops=executed + (recompute[0] if checkpointing else 0) + tiled[0],
        attention_flops=attn_model + (recomputing * recompute[1] if checkpointing else 0) + tiled[1],
        model_flops=useful + attn_model,
        hbm_bytes=2 * (memory.written - on_host) - fused,
        ring_bytes=sent.get("p2p", 0),
        fsdp_bytes=(fsdp - 1) / fsdp * (sent.get("all_gather", 0) + sent.get("reduce_scatter", 0)),
        tp_bytes=2 * (mesh.tp - 1) / mesh.tp * sent.get("all_reduce", 0),
        a2a_bytes=(1 - 1 / (all_to_all or mesh.cp)) * sent.get("all_to_all", 0),
        host_bytes=sent.get("host", 0),
        host_optimizer_bytes=2 * on_host,
        compiled_saved_bytes=fused,
    )


@dataclass
class StepTime:
    seconds: float
    tokens_per_s_per_gpu: float
    mfu: float
    bound: str  # what sets the pace: compute | HBM | ring, fsdp, all-to-all or tp over NVLink/IB
    parts: dict[str, float]  # seconds of each resource alone
    host_hidden: float = 1.0  # the share of the host copies' time that compute hides (1: all, or none made)


def step_time(work: Work, mesh: Mesh, device: Device, node_size: int) -> StepTime:
    """The roofline with the code's overlaps (module docstring). A group that spans nodes moves at
    the InfiniBand rate: ranks are numbered tp innermost, then cp, then dp (lwm.parallel.dims), so
    a tp group is tp consecutive ranks, a cp group cp x tp of them, FSDP's group all of them."""
    rate = {"NVLink": device.nvlink_gbps * 1e9, "IB": device.ib_gbps * 1e9}

    def link(span: int) -> str:
        return "NVLink" if span <= node_size else "IB"

    ring_key = f"ring ({link(mesh.cp * mesh.tp)})"
    fsdp_key = f"fsdp ({link(mesh.world)})"
    parts = {
        "matmul": work.matmul_flops / (device.tflops * 1e12 * device.matmul_efficiency),
        "attention": work.attention_flops / (device.tflops * 1e12 * device.attention_efficiency),
        "hbm": work.hbm_bytes / (device.hbm_tbps * 1e12),
        ring_key: work.ring_bytes / rate[link(mesh.cp * mesh.tp)],
        fsdp_key: work.fsdp_bytes / rate[link(mesh.world)],
    }
    serial = {}  # links nothing overlaps, present only where the mesh has them
    if work.a2a_bytes:
        serial[f"all-to-all ({link(mesh.cp * mesh.tp)})"] = work.a2a_bytes / rate[link(mesh.cp * mesh.tp)]
    if work.tp_bytes:
        serial[f"tp ({link(mesh.tp)})"] = work.tp_bytes / rate[link(mesh.tp)]
    if work.host_optimizer_bytes:  # the node's host memory rate, shared by its ranks
        share = device.host_mem_gbps * 1e9 / min(mesh.world, node_size)
        serial["optimizer (host)"] = work.host_optimizer_bytes / share
    parts.update(serial)
    if work.host_bytes:
        parts["host (PCIe)"] = work.host_bytes / (device.pcie_gbps * 1e9)
    host = parts.get("host (PCIe)", 0.0)
    attention = max(parts["attention"], parts[ring_key])
    compute = parts["matmul"] + attention + parts["hbm"] + sum(serial.values())
    seconds = max(compute, parts[fsdp_key], host)
    slowest_link = max(serial, key=serial.get, default=None)
    if host > max(compute, parts[fsdp_key]):
        bound = "host (PCIe)"
    elif seconds == parts[fsdp_key] and parts[fsdp_key] > compute:
        bound = fsdp_key
    elif parts[ring_key] > parts["attention"] and parts[ring_key] > parts["matmul"]:
        bound = ring_key
    elif slowest_link and serial[slowest_link] > max(parts["matmul"], parts["attention"]):
        bound = slowest_link
    else:
        bound = max(("compute", parts["matmul"] + parts["attention"]), ("HBM", parts["hbm"]), key=lambda kv: kv[1])[0]
    tokens = mesh.batch * mesh.seq_len / (mesh.cp * mesh.tp)  # a tp group's ranks share their tokens
    mfu = work.model_flops / (seconds * device.tflops * 1e12)
    hidden = min(host, compute) / host if host else 1.0
    return StepTime(seconds, tokens / seconds, mfu, bound, parts, hidden)
