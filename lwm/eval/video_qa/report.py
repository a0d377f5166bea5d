"""Video QA outputs: video_qa.json (config, summary, records), video_qa.md (the summary as tables by
duration bucket and by task, and each benchmark's own table), video_qa.records.jsonl (records appended
as items finish), and a benchmark's own results file where it has one and its questions were scored by
the letter method (lwm.eval.video_qa.benchmarks: Benchmark.results_file)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lwm.disk.writes import write_atomic
from lwm.eval.plots import markdown_table
from lwm.eval.video_qa.benchmarks import BENCHMARKS, Rules, named
from lwm.eval.video_qa.scoring import METHODS
from lwm.io import JsonlAppender


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def markdown(result: dict) -> str:
    """The summary as a markdown table: bucket, n, accuracy (LL), accuracy (letter), chance ..."""
    s, cfg = result["summary"], result.get("config", {})
    methods = cfg.get("methods", METHODS)
    open_items = s["all"]["open"] > 0
    cols = ["bucket", "n"] + (["accuracy (LL)"] if "ll" in methods else [])
    cols += (["accuracy (letter)"] if "letter" in methods else []) + ["chance"]
    cols += (["exact match (open)"] if open_items else []) + ["errors"]
    lines = ["# Long-video QA", ""]
    facts = [f"{k}: `{cfg[k]}`" for k in ("model", "data") if cfg.get(k)]
    sampling = f"frames at {cfg['fps']:g} fps" if cfg.get("fps") else "frames"
    if cfg.get("max_frames"):
        sampling += f", at most {cfg['max_frames']}"
    facts.append(sampling)
    facts.append(f"{s['items']} items, {s['scored']} scored, {s['errors']['total']} errors")
    if not result.get("complete", True):
        facts.append("**interrupted: partial results**")

    def row(name, st):
        cells = [name, st["n"]]
        cells += [_pct(st["accuracy_ll"])] if "ll" in methods else []
        cells += [_pct(st["accuracy_letter"])] if "letter" in methods else []
        return cells + [_pct(st["chance"])] + ([_pct(st["exact_match"])] if open_items else []) + [st["errors"]]

    lines += [
        "; ".join(facts) + ".",
        "",
        markdown_table(cols, [row(b, st) for b, st in s["buckets"].items()] + [row("**all**", s["all"])]),
    ]
    if s.get("tasks"):
        lines += ["", "By task:", "", markdown_table(["task", *cols[1:]], [row(t, st) for t, st in s["tasks"].items()])]
    lines += [
        "",
        "Accuracy (LL): the option with the highest log-likelihood after the bare question (primary for the "
        "plain form); accuracy (letter): the option letter generated after the question with its options listed "
        "(a benchmark's own prompt and rule for its questions, the primary there; see its table below). "
        "Accuracies are over multiple-choice items, exact match over open ones; n counts scored items.",
    ]
    if s["all"]["accuracy_ll_per_token"] is not None:
        lines.append(f"LL with per-token mean log-likelihood: {_pct(s['all']['accuracy_ll_per_token'])} overall.")
    if s["all"]["letter_unparsed"]:
        lines.append(
            f"Outputs with no option letter: {s['all']['letter_unparsed']} (wrong in the plain form; as its rule "
            "says for a benchmark's question)."
        )
    if s["errors"]["total"]:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["errors"]["by_kind"].items()))
        lines.append(f"Errors by kind: {kinds} (reasons per item in video_qa.json).")
    for name, bench in s.get("benchmarks", {}).items():
        lines += ["", *benchmark_markdown(bench, named(name).rules)]
    return "\n".join(lines) + "\n"


def benchmark_markdown(bench: dict, rules: Rules) -> list[str]:
    """A benchmark's own numbers: its overall score by its rule, then a table per breakdown."""
    method = "letter" if bench["method"] == "accuracy_letter" else "LL"
    how = "mean of the tasks' accuracies (M-Avg)" if bench["overall_rule"] == "task_mean" else "accuracy"
    a = bench["all"]
    out = [
        f"## {bench['title']}",
        "",
        f"Overall ({how}, the benchmark's prompt and answer rule, {method}): **{_pct(bench['overall'])}** "
        f"over {a['n']} scored questions ({a['errors']} errors); {rules.unparsed_text}: "
        f"{a['letter_unparsed']} outputs had none.",
    ]
    for key, groups in bench["breakdowns"].items():
        rows = [[g, st["n"], st["letter_counted"], _pct(st[bench["method"]]), st["letter_unparsed"], st["errors"]]
                for g, st in groups.items()]  # fmt: skip
        out += ["", markdown_table([key, "n", "counted", "accuracy", "no letter", "errors"], rows)]
    return out


def write_outputs(result: dict, out_dir) -> tuple[Path, ...]:
    """video_qa.json and video_qa.md, and each benchmark's own results file when it has questions here
    and the letter method ran -> the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / "video_qa.json", out_dir / "video_qa.md"
    write_atomic(js, json.dumps(result, indent=1, default=_jsonable) + "\n")
    write_atomic(md, markdown(result))
    written = [js, md]
    for bench in BENCHMARKS:
        rows = bench.results(result["records"]) if bench.results is not None else None
        if rows and "letter" in result.get("config", {}).get("methods", METHODS):
            written.append(out_dir / bench.results_file)
            write_atomic(written[-1], json.dumps(rows, indent=1, default=_jsonable) + "\n")
    return tuple(written)


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (Path, np.ndarray)):
        return str(x) if isinstance(x, Path) else x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


class RecordLog:
    """video_qa.records.jsonl: one line per finished item, flushed, so a killed run keeps them."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.out = JsonlAppender(path, default=_jsonable, truncate=True)  # this run's records only

    def __call__(self, rec: dict) -> None:
        self.out.append(rec)

    def close(self) -> None:
        self.out.close()
