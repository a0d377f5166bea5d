"""Video QA records summed up: duration buckets, and accuracy overall, by bucket and by task, with the
errors counted by kind; and for each benchmark its own overall number and breakdowns
(lwm.eval.video_qa.benchmarks says how each is made)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from lwm.eval.video_qa.benchmarks import named


@dataclass(frozen=True)
class Buckets:
    """Seconds -> a bucket name: bucket i holds edges[i-1] <= d < edges[i]. The default follows Video-MME
    (short < 2 min, medium 2-15 min, long > 15 min). A duration given as a name is its own bucket."""

    edges: tuple[float, ...] = (120.0, 900.0)
    names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        edges = tuple(float(e) for e in self.edges)
        if not edges or any(e <= 0 or not math.isfinite(e) for e in edges) or list(edges) != sorted(set(edges)):
            raise ValueError(f"bucket edges must be increasing positive seconds, got {list(self.edges)}")
        object.__setattr__(self, "edges", edges)
        names = self.names
        if names is None:
            names = (
                ("short", "medium", "long")
                if len(edges) == 2
                else tuple(
                    [f"<{edges[0]:g}s"] + [f"{a:g}-{b:g}s" for a, b in zip(edges, edges[1:])] + [f">={edges[-1]:g}s"]
                )
            )
        names = tuple(names)
        if len(names) != len(edges) + 1 or len(set(names)) != len(names):
            raise ValueError(f"{len(edges)} bucket edges need {len(edges) + 1} distinct names, got {list(names)}")
        object.__setattr__(self, "names", names)

    def of(self, duration: float | str | None) -> str:
        if duration is None:
            return "unknown"
        if isinstance(duration, str):
            return duration
        return self.names[sum(duration >= e for e in self.edges)]

    def order(self, seen) -> list[str]:
        """The buckets to show: the named ones in order, then other names as they came, then unknown."""
        extra = [b for b in dict.fromkeys(seen) if b not in self.names and b != "unknown"]
        return [b for b in self.names if b in seen] + extra + (["unknown"] if "unknown" in seen else [])


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]  # None: an output the benchmark's rule does not count
    return float(np.mean(values)) if values else None


def _stats(recs: list[dict]) -> dict:
    ok = [r for r in recs if r["error"] is None]
    mc, op = [r for r in ok if r["kind"] == "mc"], [r for r in ok if r["kind"] == "open"]
    ll, lt = [r["ll"] for r in mc if "ll" in r], [r["letter"] for r in mc if "letter" in r]
    return {
        "n": len(ok),
        "mc": len(mc),
        "open": len(op),
        "errors": len(recs) - len(ok),
        "accuracy_ll": _mean(x["correct"] for x in ll),
        "accuracy_ll_per_token": _mean(x["correct_per_token"] for x in ll),
        "accuracy_letter": _mean(x["correct"] for x in lt),
        "letter_unparsed": sum(x["predicted"] is None for x in lt),
        "letter_counted": sum(x["correct"] is not None for x in lt),
        "chance": _mean(1 / len(r["options"]) for r in mc),
        "exact_match": _mean(r["open"]["correct"] for r in op),
    }


def benchmark_summary(records: list[dict], name: str, methods=("ll", "letter")) -> dict:
    """One benchmark's records -> its overall number by its own rule, and its breakdowns."""
    rules = named(name).rules
    recs = [r for r in records if r.get("benchmark") == name]
    breakdowns = {}
    for key in rules.breakdowns:
        values = list(dict.fromkeys(r["groups"][key] for r in recs if key in r.get("groups", {})))
        breakdowns[key] = {v: _stats([r for r in recs if r.get("groups", {}).get(key) == v]) for v in values}
    method = "accuracy_letter" if "letter" in methods else "accuracy_ll"
    overall = _stats(recs)[method]
    if rules.overall == "task_mean":
        per_task = [st[method] for st in breakdowns.get("task", {}).values() if st[method] is not None]
        overall = float(np.mean(per_task)) if per_task else None
    return {
        "title": rules.title,
        "method": method,
        "overall": overall,
        "overall_rule": rules.overall,
        "unparsed": rules.unparsed,
        "all": _stats(recs),
        "breakdowns": breakdowns,
    }


def summarize(records: list[dict], buckets: Buckets = Buckets(), methods=("ll", "letter")) -> dict:
    """Accuracy overall and by bucket, and the errors counted by kind; each benchmark's own numbers."""
    order = buckets.order([r["bucket"] for r in records])
    ok = [r for r in records if r["error"] is None]
    return {
        "items": len(records),
        "scored": len(ok),
        "errors": {
            "total": len(records) - len(ok),
            "by_kind": dict(Counter(r["error_kind"] for r in records if r["error"] is not None)),
        },
        "primary_metric": "accuracy_ll",
        "max_prompt_tokens": max(
            (max(r.get("prompt_tokens", 0), r.get("letter", {}).get("prompt_tokens", 0)) for r in ok), default=0
        ),
        "buckets": {b: _stats([r for r in records if r["bucket"] == b]) for b in order},
        "all": _stats(records),
        "tasks": {
            t: _stats([r for r in records if r.get("task") == t])
            for t in sorted({r["task"] for r in records if r.get("task") is not None})
        },
        "benchmarks": {
            b: benchmark_summary(records, b, methods)
            for b in dict.fromkeys(r.get("benchmark") for r in records)
            if b is not None
        },
    }
