"""The benchmarks video QA reads, asks and scores as released, one module each, behind this registry:

  videomme        Video-MME (its parquet or JSON; the README's prompt, the scorer's answer rule, .srt
                  subtitles before the question, videomme_results.json)
  longvideobench  LongVideoBench (lvb_val.json or parquet; its loader's prompt and rule, JSON subtitles
                  among the frames)
  mlvu            MLVU (a task's JSON or the json/ folder; its prompt, rule and M-Avg)
  plain           this project's JSON lines

Each module's BENCHMARK (a benchmarks.base.Benchmark) says how to recognise its files, read an entry
into Items, its Rules for the letter method, and where it has them its subtitles and its own results
file. A JSON object is read by the first benchmark here that recognises it, in the order above; one
that none recognises is read as the plain form, whose errors say what it expects."""

from __future__ import annotations

from pathlib import Path

from lwm.eval.video_qa.benchmarks import longvideobench, mlvu, plain, videomme
from lwm.eval.video_qa.benchmarks.base import Benchmark, Rules
from lwm.eval.video_qa.items import Item

BENCHMARKS: tuple[Benchmark, ...] = (videomme.BENCHMARK, longvideobench.BENCHMARK, mlvu.BENCHMARK, plain.BENCHMARK)
_BY_NAME = {b.name: b for b in BENCHMARKS}


def benchmark_of(obj) -> Benchmark | None:
    """The benchmark whose entry a JSON object is, or None for none."""
    if not isinstance(obj, dict):
        return None
    return next((b for b in BENCHMARKS if b.recognise(obj)), None)


def skipped(obj) -> str | None:
    """Why a benchmark's entry is not evaluated here (MLVU's open tasks), or None."""
    if not isinstance(obj, dict):
        return None
    for b in BENCHMARKS:
        why = b.skip(obj) if b.skip is not None else None
        if why is not None:
            return why
    return None


def read_entry(obj, item_id: str, source: Path, video_dir=None, subtitle_dir=None) -> list[Item]:
    """One JSON object of `source` -> its Items (a bad one: an Item with its error), by its benchmark."""
    return (benchmark_of(obj) or plain.BENCHMARK).items(obj, item_id, source, video_dir, subtitle_dir)


def named(name: str | None) -> Benchmark:
    """The benchmark of an item's or record's `benchmark` (None: the plain form)."""
    return _BY_NAME[name]


def rules_for(item: Item) -> Rules:
    return _BY_NAME[item.benchmark].rules


__all__ = ["BENCHMARKS", "Benchmark", "Rules", "benchmark_of", "named", "read_entry", "rules_for", "skipped"]
