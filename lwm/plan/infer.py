"""Context-parallel inference: the prefill's memory per rank from its fake run, its time from the
same roofline as training, and decoding's rate.

Prefill work per rank: 2 x matmul parameters x its tokens, the causal entries of its share of the
prompt (1 / cp of all of them: striped balance) x 2 products x 2 x head_dim x heads x layers; HBM
and ring traffic as counted on the fake prefill. Decoding reads every weight and this rank's cache
slice once per token; its ranks merge partial attention per layer (two small collectives, taken
as 10 us each on NVLink and 20 us across nodes).
"""

from __future__ import annotations

from dataclasses import asdict

from lwm.model import ModelConfig
from lwm.plan.devices import Device
from lwm.plan.fake import GPU_SETTINGS
from lwm.plan.memory import plan_prefill
from lwm.plan.time import matmul_params

PREFILL_CHUNK = 8192  # Generator's default: prompt tokens per rank per segment
LATENCY_S = {"NVLink": 10e-6, "IB": 20e-6}


def plan_inference(
    model: ModelConfig, seq_len: int, cp: int, device: Device, node_size: int, prefill_chunk: int = PREFILL_CHUNK
) -> dict:
    config = model.replace(max_seq_len=max(model.max_seq_len, seq_len))
    mem = plan_prefill(config, seq_len, cp, prefill_chunk, GPU_SETTINGS)
    tokens = seq_len / cp
    entries = seq_len * (seq_len + 1) / 2 / cp
    flops = 2 * matmul_params(config) * tokens + 4 * config.head_dim * config.n_heads * config.n_layers * entries
    link = "NVLink" if cp <= node_size else "IB"
    rate = (device.nvlink_gbps if link == "NVLink" else device.ib_gbps) * 1e9
    compute = 2 * matmul_params(config) * tokens / (device.tflops * 1e12 * device.matmul_efficiency) + (
        flops - 2 * matmul_params(config) * tokens
    ) / (device.tflops * 1e12 * device.attention_efficiency)
    ring = mem.sent.get("p2p", 0) / rate
    prefill_s = max(compute, ring) + 2 * mem.written / (device.hbm_tbps * 1e12)
    read = mem.parts["weights"] + mem.parts["kv_cache"]
    decode_hbm = read / (device.hbm_tbps * 1e12)
    decode_link = 2 * config.n_layers * LATENCY_S[link] if cp > 1 else 0.0
    fits = device.fits(mem.peak)
    return {
        "seq_len": seq_len,
        "cp": cp,
        "prefill_chunk": prefill_chunk,
        "peak_bytes": mem.peak,
        "needs_bytes": device.needs(mem.peak),
        "parts": mem.parts,
        "verdict": f"fits, {device.headroom_gib(mem.peak):.1f} GiB free" if fits else "does not fit",
        "prefill_s": prefill_s,
        "prefill_flops": flops,
        "prefill_bound": "ring" if ring > compute else "compute",
        "decode_tokens_per_s": 1 / (decode_hbm + decode_link),
        "decode_bound": "HBM" if decode_hbm > decode_link else f"latency ({link})",
        "memory": asdict(mem) | {"parts": mem.parts},
    }
