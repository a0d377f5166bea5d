"""One video QA item -> its record: the video's codes in LWM's chat prompt, scored by each method.

Multiple choice: `ll`, the option with the highest log-likelihood after the bare question; `letter`,
the first option letter generated after the question with its options listed. An open question:
greedy generation, normalized exact match."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lwm.data.chat import chat_prompt
from lwm.eval.video_qa.items import Item, ItemError
from lwm.eval.video_qa.summary import Buckets
from lwm.eval.video_qa.text import LETTERS, first_letter, letter_question, normalize, option_text
from lwm.infer.sampling import GenerationConfig
from lwm.parallel.comm import PeerFailure, agree_on_failure, broadcast_object_from_first, group_size_and_rank

METHODS = ("ll", "letter")


@dataclass
class _Model:
    """The model as the methods ask it: a prompt of a question and codes, greedy text, log-likelihoods."""

    generator: object
    tokenizer: object
    vocab: object
    prompt_style: str

    def prompt(self, question: str, codes: np.ndarray) -> list[int]:
        return chat_prompt(self.tokenizer, self.vocab, question, codes, style=self.prompt_style)

    def generate(self, prompt: list[int], max_new_tokens: int) -> str:
        config = GenerationConfig(max_new_tokens=max_new_tokens, stop_tokens=[self.tokenizer.eos_id], restrict="text")
        return self.tokenizer.decode(self.generator.generate(prompt, config))


def _prepare(item: Item, source) -> dict:
    if item.error is not None:
        return {"error": item.error, "kind": item.error_kind}
    if source is None:
        return {"error": "no video source was given", "kind": "video_missing"}
    try:
        codes, info = source.load(item)
    except ItemError as e:
        return {"error": str(e), "kind": e.kind}
    except Exception as e:  # one bad video must not stop the run
        return {"error": f"{item.video or item.video_key}: {type(e).__name__}: {e}", "kind": "video_unreadable"}
    return {"codes": np.asarray(codes, dtype=np.int64), "info": info}


def _record(item: Item, prepared: dict, buckets: Buckets) -> dict:
    """What is known of the item before the model sees it; `correct` is filled in by the scoring."""
    info = prepared.get("info", {})
    duration = item.duration if item.duration is not None else info.get("video_seconds")
    return {
        "id": item.id,
        "video": item.video or item.video_key,
        "duration": duration,
        "bucket": buckets.of(duration),
        "kind": "mc" if item.options else "open",
        "task": item.task,
        "question": item.question,
        "options": item.options,
        "answer": item.answer,
        "answer_index": item.answer_index,
        **{k: v for k, v in info.items() if k != "video_seconds"},
        "correct": None,
        "error": prepared.get("error"),
        "error_kind": prepared.get("kind"),
    }


def _ll(model: _Model, prompt: list[int], item: Item) -> dict:
    conts = [model.tokenizer.encode(option_text(o)) for o in item.options]
    scores = model.generator.score(prompt, conts)
    per_token = [s / len(c) for s, c in zip(scores, conts)]
    best, best_norm = int(np.argmax(scores)), int(np.argmax(per_token))
    return {
        "scores": scores,
        "scores_per_token": per_token,
        "predicted": LETTERS[best],
        "correct": best == item.answer_index,
        "predicted_per_token": LETTERS[best_norm],
        "correct_per_token": best_norm == item.answer_index,
    }


def _letter(model: _Model, codes: np.ndarray, item: Item, letter_tokens: int) -> dict:
    prompt = model.prompt(letter_question(item.question, item.options), codes)
    text = model.generate(prompt, letter_tokens)
    pick = first_letter(text, len(item.options))
    return {
        "prompt_tokens": len(prompt),
        "output": text,
        "predicted": None if pick is None else LETTERS[pick],
        "correct": pick == item.answer_index,
    }


def _score(rec: dict, model: _Model, codes: np.ndarray, item: Item, methods, max_new_tokens, letter_tokens) -> None:
    """Fills in rec, method by method (what was scored before a failure stays)."""
    prompt = model.prompt(item.question, codes)
    rec["prompt_tokens"] = len(prompt)
    if item.options is None:
        text = model.generate(prompt, max_new_tokens)
        rec["open"] = {"output": text, "correct": normalize(text) == normalize(item.answer)}
        rec["correct"] = rec["open"]["correct"]
        return
    if "ll" in methods:
        rec["ll"] = _ll(model, prompt, item)
    if "letter" in methods:
        rec["letter"] = _letter(model, codes, item, letter_tokens)
    rec["correct"] = rec["ll" if "ll" in methods else "letter"]["correct"]


def evaluate_item(
    item: Item,
    generator,
    tokenizer,
    vocab,
    source,
    methods=METHODS,
    buckets: Buckets = Buckets(),
    max_new_tokens: int = 32,
    letter_tokens: int = 8,
    prompt_style: str = "native",
) -> dict:
    """One item -> its record. Every rank of the generator's group calls this; the group's first rank
    reads the video and the others get the codes from it. prompt_style: lwm.infer.prompt's.

    A failure is agreed by the group: one rank failing alone (out of memory for the cache, an error
    while building the prompt or after the group's last collective) makes every rank record the item
    as failed and go on, through one agree_on_failure round per item that meets the generator's
    meeting point (Generator._meet) or the others' round. A rank failing inside a collective (out of
    memory in the middle of a forward pass) is not covered: the others wait in that collective until
    the process group's timeout stops the run."""
    group = getattr(generator, "group", None)
    _, rank = group_size_and_rank(group)
    prepared = broadcast_object_from_first(_prepare(item, source) if rank == 0 else None, group)
    rec = _record(item, prepared, buckets)
    if rec["error"] is not None:
        return rec
    model = _Model(generator, tokenizer, vocab, prompt_style)
    error = None
    try:
        _score(rec, model, prepared["codes"], item, methods, max_new_tokens, letter_tokens)
    except PeerFailure as e:  # another rank failed, and said so where the generator waited for it
        return _failed(rec, e)
    except Exception as e:  # a failed prompt (too long, out of memory ...) is recorded; the run goes on
        error = e
    try:  # every rank hears of a failure on any rank, and records it
        agree_on_failure(error, group, getattr(generator, "device", None))
    except Exception as e:
        _failed(rec, e)
    return rec


def _failed(rec: dict, error: Exception) -> dict:
    rec["error"], rec["error_kind"] = f"{type(error).__name__}: {error}", "model"
    return rec
