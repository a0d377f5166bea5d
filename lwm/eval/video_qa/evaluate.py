"""The evaluation loop: every item scored by the model, one record each, summed up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from lwm.eval.video_qa.files import Reader
from lwm.eval.video_qa.items import Item, check_unique_ids
from lwm.eval.video_qa.scoring import METHODS, evaluate_item
from lwm.eval.video_qa.summary import Buckets, summarize
from lwm.ranks import is_rank0


def run_video_qa(
    generator,
    tokenizer,
    vocab,
    items: list[Item],
    source=None,
    *,
    methods=METHODS,
    buckets: Buckets = Buckets(),
    max_new_tokens: int = 32,
    letter_tokens: int = 8,
    prompt_style: str = "native",
    on_record=None,
    progress: bool = True,
    config: dict | None = None,
) -> dict:
    """Evaluate the items -> {"config", "summary", "records", "complete"}. generator: a
    lwm.infer.Generator (or anything with .score/.generate and .group); source: a VideoSource (or
    anything with .load(item) -> (codes, info)), used on the group's first rank only; on_record(record)
    is called on rank 0 (lwm.ranks.is_rank0: the rank that writes and prints) as each item finishes.
    Items may also be JSON objects (parsed here, paths relative to the working directory and kept in it). An id given
    twice raises DuplicateIdError (a ValueError) before any item is evaluated. Ctrl-C stops early with
    what was done."""
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {list(methods)}")

    first = is_rank0()
    reader = Reader()
    items = [
        x
        for k, it in enumerate(items)
        for x in ([it] if isinstance(it, Item) else reader.adapt(it, f"item {k + 1}", Path.cwd() / "items"))
    ]
    check_unique_ids(items)  # a question given twice would be scored, counted and written twice
    records, complete = [], True
    bar = tqdm(items, desc="video QA", unit="q", disable=not progress or not first, dynamic_ncols=True, mininterval=1.0)
    try:
        for item in bar:
            rec = evaluate_item(
                item, generator, tokenizer, vocab, source, methods, buckets, max_new_tokens, letter_tokens, prompt_style
            )
            records.append(rec)
            if first:
                if on_record is not None:
                    on_record(rec)
                done = [r["correct"] for r in records if r["correct"] is not None]
                bar.set_postfix_str(f"acc {np.mean(done):.3f}" if done else "", refresh=False)
                if rec["error"] is not None:
                    bar.write(f"{rec['id']}: {rec['error_kind']}: {rec['error']}")
    except KeyboardInterrupt:
        complete = False
    finally:
        bar.close()
    return {
        "config": config or {},
        "summary": summarize(records, buckets, methods),
        "records": records,
        "complete": complete,
    }
