"""What a plan prints and writes: a table, plan.json, and the plot of memory per GPU against
sequence length (a line per mesh, the device's memory across)."""

from __future__ import annotations

import json
from pathlib import Path

from tabulate import tabulate

from lwm.plan import tracker
from lwm.plan.devices import GIB, Device

AT_THE_PEAK = 3  # the breakdown's largest groups a stage's table line names (plan.json has them all)


def gib(n: float) -> str:
    return f"{n / GIB:.2f}" if n >= GIB / 10 else f"{n / GIB:.5f}"


def mesh_label(cp: int, dp: int, tp: int = 1) -> str:
    return f"cp {cp} x dp {dp}" + (f" x tp {tp}" if tp > 1 else "")


def stage_table(rows: list[dict]) -> str:
    head = ["stage", "tokens", "seqs/rank", "cp x dp", "peak GiB", "with margins"]
    head += ["verdict", "step s", "tok/s/GPU", "MFU", "bound"]
    body = [
        [
            r["stage"],
            r["seq_len"],
            r["batch"],
            f"{r['cp']} x {r['dp']}" + (f" x tp {r['tp']}" if r.get("tp", 1) > 1 else ""),
            gib(r["peak_bytes"]),
            gib(r["needs_bytes"]),
            r["verdict"],
            f"{r['time']['seconds']:.3g}",
            f"{r['time']['tokens_per_s_per_gpu']:.4g}",
            f"{r['time']['mfu']:.0%}",
            r["time"]["bound"],
        ]
        for r in rows
    ]
    return tabulate(body, head)


def parts_lines(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        lines.append(
            f"  {r['stage']}: " + ", ".join(f"{k} {gib(v)}" for k, v in r["parts"].items() if v) + " GiB at the peak"
        )
        if r.get("breakdown"):
            top = ", ".join(f"{tracker.label(b)} {gib(b['bytes'])}" for b in r["breakdown"][:AT_THE_PEAK])
            lines.append(f"    largest at the peak (GiB): {top}")
        if r.get("host_peak_bytes"):
            lines.append(
                f"    host: {gib(r['host_peak_bytes'])} GiB a rank, {gib(r['host_needs_per_node'])} GiB a node with margins"
                + (f"; copies {r['time']['host_hidden']:.0%} hidden by compute" if "time" in r else "")
            )
        if r.get("work", {}).get("compiled_saved_bytes"):
            w, t = r["work"], r["time"]
            lines.append(
                f"    compiled blocks: {w['compiled_saved_bytes'] / 1e9:.4g} GB less HBM traffic a step "
                f"(inductor's fused norms, SwiGLU and RoPE: lwm.plan.compiled), HBM {t['parts']['hbm']:.3g} s"
            )
        if "why" in r:
            searched = ", ".join(f"cp {cp}: {gib(peak)}" for cp, peak in r.get("searched", {}).items())
            lines.append(f"    {r['why']}" + (f" (planned peaks {searched} GiB)" if searched else ""))
        if r.get("fits_with"):
            f, t = r["fits_with"], r["fits_with"]["time"]
            lines.append(
                f"    at {mesh_label(f['cp'], f['dp'], f.get('tp', 1))}: peak {gib(f['peak_bytes'])} GiB "
                f"({gib(f['needs_bytes'])} with margins), "
                f"step {t['seconds']:.3g} s, {t['tokens_per_s_per_gpu']:.4g} tok/s/GPU, MFU {t['mfu']:.0%}, bound {t['bound']}"
            )
        if r.get("advice"):
            lines.append(f"    {advice_line(r['advice'])}")
    return lines


def advice_line(advice: dict) -> str:
    """The cheapest memory feature that makes a stage fit, in words, or what was tried."""
    if advice["overrides"] is None:
        tried = "; ".join(f"{o}: {gib(peak)}" for o, peak in advice["tried"].items())
        if advice.get("kind") == "kept":
            planned = f" (planned peaks: {tried} GiB)" if tried else ""
            return f"no fewer blocks keeping their attention (parallel.keep_attention_blocks) fit the host{planned}"
        return f"no memory feature makes it fit (planned peaks, each with those before it: {tried} GiB)"
    t = advice["time"]
    host = f", host {gib(advice['host_peak_bytes'])} GiB a rank" if advice["host_peak_bytes"] else ""
    return (
        f"fits with {' '.join(advice['overrides'])}: peak {gib(advice['peak_bytes'])} GiB "
        f"({gib(advice['needs_bytes'])} with margins){host}, step {t['seconds']:.3g} s, "
        f"{t['tokens_per_s_per_gpu']:.4g} tok/s/GPU, MFU {t['mfu']:.0%}"
    )


def longest_table(found: list[dict]) -> str:
    body = [
        [mesh_label(f["cp"], f["dp"], f.get("tp", 1)), f["longest"] or "none", f["next_up"] or "the planner's bound"]
        for f in found
    ]
    return tabulate(body, ["mesh", "longest that fits", "next up (does not fit)"])


def infer_lines(infer: dict) -> list[str]:
    p = infer["parts"]
    return [
        f"inference prefill of {infer['seq_len']} tokens over cp {infer['cp']} ({infer['prefill_chunk']} a rank at a time): "
        f"peak {gib(infer['peak_bytes'])} GiB per rank "
        f"(weights {gib(p['weights'])}, KV cache {gib(p['kv_cache'])}, temporaries {gib(p['temporaries'])}), "
        f"{infer['verdict']}",
        f"  prefill {infer['prefill_s']:.3g} s, decode {infer['decode_tokens_per_s']:.4g} tokens/s (bound: {infer['decode_bound']})",
    ]


def write_json(plan: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "plan.json"
    path.write_text(json.dumps(plan, indent=2))
    return path


def plot(curves: dict[str, dict[int, int]], device: Device, out: Path) -> Path:
    """curves: a label per mesh -> {seq_len: planned peak bytes}."""
    out.mkdir(parents=True, exist_ok=True)
    from matplotlib.figure import Figure  # not pyplot: no display, no global figure state; here: 0.8 s to import

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for label, points in curves.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] / GIB for x in xs], marker="o", label=label)
    ax.axhline(device.memory_gib, color="red", linestyle="--", label=f"{device.name} memory")
    usable = (device.memory_gib - device.reserved_gib) / (1 + device.fragmentation)
    ax.axhline(usable, color="orange", linestyle=":", label="tracked peak that fits (margins off)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("planned peak per GPU (GiB)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "memory.png"
    fig.savefig(path, dpi=120)
    return path
