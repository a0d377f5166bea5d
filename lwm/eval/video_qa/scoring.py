"""One video QA item -> its record: the video's codes in LWM's chat prompt, scored by each method.

Multiple choice: `ll`, the option with the highest log-likelihood after the bare question; `letter`,
the letter generated after the question with its options listed, in the item's benchmark's prompt and
read back by its rule (lwm.eval.video_qa.benchmarks). An open question: greedy generation, normalized
exact match. With subtitles, the lines at the sampled frames' times go where the benchmark puts them
(before the question, or between the frames) in both methods' prompts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from lwm.data.chat import chat_prompt
from lwm.eval.trials import group_of
from lwm.eval.video_qa.benchmarks import named, rules_for
from lwm.eval.video_qa.items import Item, ItemError
from lwm.eval.video_qa.subtitles import SubtitleError
from lwm.eval.video_qa.summary import Buckets
from lwm.eval.video_qa.text import LETTERS, normalize, option_text
from lwm.infer.sampling import GenerationConfig
from lwm.parallel.comm import broadcast_object_from_first, group_size_and_rank, run_agreed

METHODS = ("ll", "letter")


@dataclass
class VideoPrompt:
    """The model as the methods ask it: a prompt of a question and codes, greedy text, log-likelihoods."""

    generator: object
    tokenizer: object
    vocab: object
    prompt_style: str

    def prompt(
        self, question: str, codes: np.ndarray, between: list | None = None, answer_start: str = ""
    ) -> list[int]:
        """The chat prompt of a question and the frames; `between`: (frames before it, text) put among the
        frames, after that frame's <eof> (before the first frame for 0); `answer_start`: text that begins
        the answer, after the chat form's ASSISTANT:."""
        ids = chat_prompt(self.tokenizer, self.vocab, question, codes, style=self.prompt_style)
        if between:
            frame = codes.shape[1] + 1  # 256 codes and <eof>
            first = int(np.argmax(self.vocab.is_vision(np.asarray(ids))))  # the first frame's first code
            for before, text in sorted(between, key=lambda b: b[0], reverse=True):  # from the end: indices hold
                at = first + before * frame
                ids[at:at] = self.tokenizer.encode(text + "\n")
        if answer_start:
            ids += self.tokenizer.encode(" " + answer_start)
        return ids

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
    info = dict(info)
    times = info.pop("timestamps", None)
    prepared = {"codes": np.asarray(codes, dtype=np.int64), "info": info}
    if item.subtitles is not None:
        try:
            prepared["subtitles"] = _subtitles(item, times, len(codes), getattr(source, "fps", None), info)
        except SubtitleError as e:
            return {"error": str(e), "kind": "subtitles", "info": info}
    return prepared


def _subtitles(item: Item, times, n_frames: int, fps, info: dict) -> dict:
    """The item's subtitle lines at its frames' times, as its benchmark places them: {"prefix": text} or
    {"between": [(frames before, text), ...]}. Frames without recorded times (a cache made without them)
    are taken at k / fps."""
    if times is None:
        times = np.arange(n_frames) / (fps or 1.0)
        info["subtitle_times"] = "k / fps (the cache has no timestamps)"
    return named(item.benchmark).subtitles(item, times, info)


def _record(item: Item, prepared: dict, buckets: Buckets) -> dict:
    """What is known of the item before the model sees it; `correct` is filled in by the scoring."""
    info = prepared.get("info", {})
    duration = item.duration if item.duration is not None else info.get("video_seconds")
    return {
        "id": item.id,
        "benchmark": item.benchmark,
        "video": item.video or item.video_key,
        "duration": duration,
        "bucket": buckets.of(duration),
        "kind": "mc" if item.options else "open",
        "task": item.task,
        "groups": dict(item.groups),
        "meta": dict(item.meta),
        "question": item.question,
        "options": item.options,
        "answer": item.answer,
        "answer_index": item.answer_index,
        **{k: v for k, v in info.items() if k != "video_seconds"},
        "correct": None,
        "error": prepared.get("error"),
        "error_kind": prepared.get("kind"),
    }


def _ll(model: VideoPrompt, prompt: list[int], item: Item) -> dict:
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


def _letter(model: VideoPrompt, codes: np.ndarray, item: Item, letter_tokens: int, subs: dict) -> dict:
    """The benchmark's prompt, greedy text, its rule's reading of the letter. `correct` is None for an
    output the rule does not count (a benchmark's scorer may skip an output with no letter)."""
    rules = rules_for(item)
    question = rules.prompt(item, subs.get("prefix"))
    prompt = model.prompt(question, codes, subs.get("between"), rules.answer_start)
    text = model.generate(prompt, letter_tokens)
    pick = rules.pick(item, text)
    letter = lambda k: None if k is None else LETTERS[k] if k < len(LETTERS) else None  # noqa: E731
    return {
        "prompt_tokens": len(prompt),
        "output": text,
        "predicted": letter(pick.found),
        "scored": letter(pick.scored),
        "random": pick.found is None and pick.scored is not None,
        "correct": (pick.scored == item.answer_index) if pick.counted else None,
    }


def _score(
    rec: dict, model: VideoPrompt, codes: np.ndarray, item: Item, methods, max_new_tokens, letter_tokens, subs: dict
) -> None:
    """Fills in rec, method by method (what was scored before a failure stays)."""
    question = item.question if not subs.get("prefix") else f"{subs['prefix']}\n{item.question}"
    prompt = model.prompt(question, codes, subs.get("between"))
    rec["prompt_tokens"] = len(prompt)
    if item.options is None:
        text = model.generate(prompt, max_new_tokens)
        rec["open"] = {"output": text, "correct": normalize(text) == normalize(item.answer)}
        rec["correct"] = rec["open"]["correct"]
        return
    if "ll" in methods:
        rec["ll"] = _ll(model, prompt, item)
    if "letter" in methods:
        rec["letter"] = _letter(model, codes, item, letter_tokens, subs)
    rec["correct"] = rec[primary_method(item.benchmark, methods)]["correct"]


def primary_method(benchmark: str | None, methods) -> str:
    """A benchmark's items are scored first by its own rule (letter); the plain form's by log-likelihood."""
    if benchmark is not None:
        return "letter" if "letter" in methods else "ll"
    return "ll" if "ll" in methods else "letter"


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
    reads the video and the others get the codes from it. prompt_style: lwm.data.chat.chat_prompt's style.

    A failure is agreed by the group: one rank failing alone (out of memory for the cache, an error
    while building the prompt or after the group's last collective) makes every rank record the item
    as failed and go on, through one round per item (lwm.parallel.comm.run_agreed) that meets the
    generator's meeting point (Generator._meet) or the others' round. A rank failing inside a
    collective (out of memory in the middle of a forward pass) is not covered: the others wait in
    that collective until the process group's timeout stops the run."""
    group, _ = group_of(generator)
    _, rank = group_size_and_rank(group)
    prepared = broadcast_object_from_first(_prepare(item, source) if rank == 0 else None, group)
    rec = _record(item, prepared, buckets)
    if rec["error"] is not None:
        return rec
    model = VideoPrompt(generator, tokenizer, vocab, prompt_style)
    subs = prepared.get("subtitles", {})
    score = partial(_score, rec, model, prepared["codes"], item, methods, max_new_tokens, letter_tokens, subs)
    _, error = run_agreed(score, *group_of(generator))
    return rec if error is None else _failed(rec, error)


def _failed(rec: dict, error: Exception) -> dict:
    rec["error"], rec["error_kind"] = f"{type(error).__name__}: {error}", "model"
    return rec
