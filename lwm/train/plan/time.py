"""How long a step takes: the step's exact work against a device's roofline.

Work, per rank and step (rank 0; with striped or zigzag every rank does the same):
  matmuls     2 x (the blocks' and the output head's parameters) x tokens, three times (forward,
              and backward's two products), once more with activation checkpointing (recompute);
              the chunked loss computes its head gradients in its forward, which this counts.
  attention   the score entries the ring schedule computes (lwm.parallel.schedule.block_work over
              every ring step) x heads x head_dim x 2 flops, for 2 products in forward, 5 in
              backward (FlashAttention's recomputed scores, dV, dP, dQ, dK), 2 more with recompute.
  memory      twice the bytes the step's other ops write (each written once, read once): norms,
              RoPE, activations' casts, the loss's softmax, AdamW (counted on the fake step).
  links       what the step sent: the ring's key/value blocks and dK/dV, FSDP's all-gathers and
              reduce-scatters (counted on the fake step).

Overlap, as the code does it: the ring sends the next block while the current one is computed, so
attention takes the longer of the two; FSDP2 prefetches the next layer's gather and reduces the
last one's gradients during compute, so the step takes the longer of compute and FSDP traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

from lwm.model import ModelConfig
from lwm.parallel.schedule import block_plan, block_work
from lwm.train.plan.devices import Device
from lwm.train.plan.memory import Mesh, StepMemory


def matmul_params(config: ModelConfig) -> int:
    """Parameters that take part in matmuls: the blocks' projections and the output head (the
    embedding is a lookup, norms are elementwise)."""
    attn = config.dim * config.head_dim * (2 * config.n_heads + 2 * config.n_kv_heads)
    return config.n_layers * (attn + 3 * config.dim * config.ffn_dim) + config.vocab_size * config.dim


def attention_entries(seq_len: int, cp: int, layout: str, mode: str, rank: int = 0) -> int:
    """Causal score entries one rank computes per sequence, head and layer."""
    if mode == "ulysses" or cp == 1:  # the whole sequence per head; heads are split (ulysses)
        return seq_len * (seq_len + 1) // 2
    local = seq_len // cp
    return sum(block_work(block_plan(layout, rank, (rank - s) % cp, local, True), local) for s in range(cp))


@dataclass
class Work:
    matmul_flops: float  # executed, recompute included
    attention_flops: float  # executed
    model_flops: float  # forward + backward without recompute: what MFU divides by
    hbm_bytes: float
    ring_bytes: float  # point-to-point, per rank
    fsdp_bytes: float  # all-gathers and reduce-scatters arriving at this rank


def step_work(config: ModelConfig, mesh: Mesh, memory: StepMemory, layout: str, mode: str, checkpointing: bool) -> Work:
    tokens = mesh.batch * mesh.seq_len // mesh.cp
    mm_model = 6 * matmul_params(config) * tokens
    heads = config.n_heads // mesh.cp if mode == "ulysses" else config.n_heads
    per_product = 2 * config.head_dim * heads * config.n_layers * mesh.batch
    entries = max(attention_entries(mesh.seq_len, mesh.cp, layout, mode, r) for r in range(mesh.cp))
    attn_model = 7 * per_product * entries
    recompute = 2 * matmul_params(config) * tokens, 2 * per_product * entries
    share = (mesh.world - 1) / mesh.world  # a collective's own shard does not travel
    sent = memory.sent
    return Work(
        matmul_flops=mm_model + (recompute[0] if checkpointing else 0),
        attention_flops=attn_model + (recompute[1] if checkpointing else 0),
        model_flops=mm_model + attn_model,
        hbm_bytes=2 * memory.written,
        ring_bytes=sent.get("p2p", 0),
        fsdp_bytes=share * (sent.get("all_gather", 0) + sent.get("reduce_scatter", 0)),
    )


@dataclass
class StepTime:
    seconds: float
    tokens_per_s_per_gpu: float
    mfu: float
    bound: str  # what sets the pace: compute | HBM | ring over NVLink/IB | FSDP over NVLink/IB
    parts: dict[str, float]  # seconds of each resource alone


def step_time(work: Work, mesh: Mesh, device: Device, node_size: int) -> StepTime:
    """The roofline with the code's overlaps (module docstring). A ring group or an FSDP group
    that spans nodes moves at the InfiniBand rate (cp groups are consecutive ranks)."""
    ring_link = "NVLink" if mesh.cp <= node_size else "IB"
    fsdp_link = "NVLink" if mesh.world <= node_size else "IB"
    rate = {"NVLink": device.nvlink_gbps * 1e9, "IB": device.ib_gbps * 1e9}
    parts = {
        "matmul": work.matmul_flops / (device.tflops * 1e12 * device.matmul_efficiency),
        "attention": work.attention_flops / (device.tflops * 1e12 * device.attention_efficiency),
        "hbm": work.hbm_bytes / (device.hbm_tbps * 1e12),
        f"ring ({ring_link})": work.ring_bytes / rate[ring_link],
        f"fsdp ({fsdp_link})": work.fsdp_bytes / rate[fsdp_link],
    }
    ring_key, fsdp_key = f"ring ({ring_link})", f"fsdp ({fsdp_link})"
    attention = max(parts["attention"], parts[ring_key])
    compute = parts["matmul"] + attention + parts["hbm"]
    seconds = max(compute, parts[fsdp_key])
    if seconds == parts[fsdp_key] and parts[fsdp_key] > compute:
        bound = fsdp_key
    elif parts[ring_key] > parts["attention"] and parts[ring_key] > parts["matmul"]:
        bound = ring_key
    else:
        bound = max(("compute", parts["matmul"] + parts["attention"]), ("HBM", parts["hbm"]), key=lambda kv: kv[1])[0]
    tokens = mesh.batch * mesh.seq_len / mesh.cp
    mfu = work.model_flops / (seconds * device.tflops * 1e12)
    return StepTime(seconds, tokens / seconds, mfu, bound, parts)
