"""Long-video question answering: accuracy of a model on questions about videos, overall and by
video duration.

    python -m lwm.eval.video_qa --model runs/X/hf --data qa.jsonl --out runs/X/eval
    python -m lwm.eval.video_qa --model M --data videomme.jsonl --video-dir videomme/data --codes codes/ --fps 1 --max-frames 512
    torchrun --nproc_per_node 2 -m lwm.eval.video_qa --model M --data qa.jsonl     # prompts split over 2 ranks (context parallel)

Data: JSON lines, one question each,

    {"video": "clips/a.mp4", "question": "What color is the circle?", "options": ["Red.", "Cyan."],
     "answer": "Cyan.", "duration": 95}

(`video` relative to the file's folder or absolute; `options` optional; `answer` an option's text or
its letter; `duration` in seconds or a bucket name; `id` optional), or Video-MME's field names:
`videoID` (the file is --video-dir/<videoID>.mp4), `question_id`, `options` like ["A. ...", "B. ..."],
`answer` a letter, `duration` "short"/"medium"/"long" (a line may also hold a video with a list of
`questions`; a .json file may hold a list of such objects). `vision` (a video id, as in the sample
data) is read like `videoID`.

Video: frames at --fps (1 by default), at most --max-frames spread evenly; codes come from the
lwm-tokenize cache (--codes) when the video is there (id: its path's hashed or stem id, or its
videoID), else the file is read and tokenized with the VQGAN (--vqgan). The prompt is LWM's chat
form, the question before the video:

    [BOS] "You are a helpful assistant. USER: {question}" <vision> frames </vision> "ASSISTANT:"

Multiple choice is scored two ways:
  LL      the log-likelihood of each option's text ("Cyan.") after the prompt of the bare question;
          the most likely option is the answer (the primary metric; the per-token mean is kept too)
  letter  the question lists the options and asks for the letter, as in training
          ("What color ...? A. Red. B. Cyan. Answer with the letter."); greedy generation restricted
          to text; the first standalone option letter in the output is the answer
Open questions (no options): greedy generation, normalized exact match (lowercase; punctuation,
articles and extra whitespace removed).

A question already written in the letter form (the sample data's multiple-choice rows) is cut back
to the bare question. Outputs in --out: video_qa.json (config, summary, one record per item),
video_qa.md (a table by duration bucket, and one by task where items have `task_type` or `kind`),
video_qa.records.jsonl (records appended as items finish, so a killed run keeps them). A bad item
(malformed line, missing or unreadable video, answer not among the options) is recorded with its
reason and the run goes on. Under torchrun every rank takes part in each prompt;
rank 0 reads the videos, writes and prints. Exit status: 0 if every item was scored, 1 if some
were recorded as errors, 2 for a usage error, 130 if interrupted (what was done is written).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lwm.arg_types import csv_list, positive_float, positive_int
from lwm.eval.plots import markdown_table
from lwm.infer.prompt import DEFAULT_VQGAN
from lwm.io import JsonlAppender, JsonlError, lines, write_atomic
from lwm.parallel.comm import broadcast_object_from_first, group_size_and_rank

# The rest of lwm.infer (and lwm.data under it) is imported where used: a usage error should not
# wait for it. (lwm.infer.prompt, for the bundled VQGAN's path, adds little to torch.)
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
LETTER_INSTRUCTION = "Answer with the letter."
METHODS = ("ll", "letter")


class ItemError(ValueError):
    """An item that cannot be evaluated; `kind` groups the reasons in the summary."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# ------------------------------------------------------------------------------------ text


def normalize(text: str) -> str:
    """Lowercase, punctuation to spaces, articles (a, an, the) dropped, whitespace collapsed."""
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in str(text).lower())
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def option_text(text: str) -> str:
    """An option as an answer is written in training: stripped, ending with a full stop."""
    text = text.strip()
    return text if text[-1:] in (".", "?", "!") else text + "."


def letter_question(question: str, options: list[str]) -> str:
    """'What color? A. Red. B. Cyan. Answer with the letter.' (the training form of multiple choice)."""
    listed = " ".join(f"{LETTERS[i]}. {option_text(o)}" for i, o in enumerate(options))
    return f"{question.strip()} {listed} {LETTER_INSTRUCTION}"


def bare_question(question: str, options: list[str]) -> str:
    """The question without its listed options and the instruction, where it is written in the letter
    form already (as in the sample data's multiple-choice rows); otherwise as given."""
    full, bare = " ".join(question.split()), " ".join(letter_question("", options).split())
    if full.lower().endswith(bare.lower()) and len(full) > len(bare):
        return full[: -len(bare)].strip()
    return question


def first_letter(text: str, n_options: int) -> int | None:
    """Index of the first standalone option letter (A .. the n-th) in generated text, or None."""
    m = re.search(rf"\b([A-{LETTERS[n_options - 1]}])\b", text)
    return None if m is None else LETTERS.index(m.group(1))


_PREFIX = re.compile(r"^\s*\(?([A-Z])[.):]\s*(.*)$", re.S)
_LETTER = re.compile(r"^\s*\(?([A-Z])\)?[.:]?\s*$")


def parse_options(raw) -> list[str]:
    """A list of option texts (or {"A": text, ...}) -> texts without letter prefixes ("A. Red" -> "Red")."""
    if isinstance(raw, dict):
        keys = sorted(raw)
        if keys != list(LETTERS[: len(keys)]):
            raise ItemError("malformed", f"options given as a mapping must have the keys A, B, ...; got {keys}")
        raw = [raw[k] for k in keys]
    if not isinstance(raw, list) or not 2 <= len(raw) <= len(LETTERS):
        raise ItemError("malformed", f"options must be a list of 2 to 26 texts, got {raw!r}")
    if not all(isinstance(o, str) and o.strip() for o in raw):
        raise ItemError("malformed", f"every option must be non-empty text, got {raw!r}")
    prefixed = [_PREFIX.match(o) for o in raw]
    if all(m and m.group(1) == LETTERS[i] and m.group(2).strip() for i, m in enumerate(prefixed)):
        raw = [m.group(2) for m in prefixed]
    options = [o.strip() for o in raw]
    normalized = [normalize(o) for o in options]
    if len(set(normalized)) < len(normalized):
        raise ItemError("malformed", f"options are not distinct: {options}")
    return options


def answer_index(answer: str, options: list[str]) -> int:
    """The option an answer names: by its text ("Cyan.", "B. Cyan") or by its letter ("B", "B.", "(B)")."""
    target = normalize(answer)
    for i, o in enumerate(options):
        if target in (normalize(o), normalize(f"{LETTERS[i]}. {o}")):
            return i
    m = _LETTER.match(answer)
    if m and LETTERS.index(m.group(1)) < len(options):
        return LETTERS.index(m.group(1))
    shown = ", ".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))
    raise ItemError("answer", f"answer {answer!r} is not among the options ({shown})")


# ------------------------------------------------------------------------------------ items


@dataclass
class Item:
    id: str
    question: str | None = None
    answer: str | None = None
    options: list[str] | None = None  # texts without letter prefixes; None for an open question
    answer_index: int | None = None
    video: str | None = None  # a file path, resolved
    video_key: str | None = None  # a video id (videoID / vision): cached codes, or --video-dir/<id>.mp4
    duration: float | str | None = None  # seconds, or a bucket name as given
    task: str | None = None  # the question's kind (Video-MME's task_type, or kind), for a breakdown
    error: str | None = None  # set for an item that cannot be evaluated
    error_kind: str | None = None


def _duration(value) -> float | str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value.strip()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ItemError("malformed", f"duration must be seconds >= 0 or a bucket name, got {value!r}")
    return float(value)


def parse_item(obj, item_id: str, base_dir: Path, video_dir: Path | None = None) -> Item:
    """One question (a JSON object) -> an Item; raises ItemError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ItemError("malformed", f"expected a JSON object, got {type(obj).__name__}")
    item = Item(id=str(obj.get("question_id", obj.get("id", item_id))))
    question, answer = obj.get("question"), obj.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ItemError("malformed", f"'question' must be non-empty text, got {question!r}")
    if not isinstance(answer, str) or not answer.strip():
        raise ItemError("malformed", f"'answer' must be non-empty text, got {answer!r}")
    item.question, item.answer = question.strip(), answer.strip()
    item.duration = _duration(obj.get("duration"))
    task = obj.get("task_type", obj.get("kind"))
    item.task = str(task).strip() if isinstance(task, (str, int)) and str(task).strip() else None
    if obj.get("options") is not None:
        item.options = parse_options(obj["options"])
        item.answer_index = answer_index(item.answer, item.options)
        item.question = bare_question(item.question, item.options)
    video = obj.get("video")
    key = obj.get("videoID", obj.get("vision"))
    if isinstance(video, str) and video.strip():
        path = Path(video.strip()).expanduser()
        item.video = str(path if path.is_absolute() else base_dir / path)
    elif isinstance(key, str) and key.strip():
        item.video_key = key.strip()
        if video_dir is not None:
            item.video = str(Path(video_dir) / f"{item.video_key}.mp4")
    else:
        raise ItemError("malformed", "no video: expected 'video' (a path) or 'videoID' (with --video-dir)")
    return item


def _bad(item_id: str, e: Exception, obj=None) -> Item:
    item = Item(id=item_id, error=str(e), error_kind=getattr(e, "kind", "malformed"))
    if isinstance(obj, dict):  # keep what can be kept, for the record
        item.id = str(obj.get("question_id", obj.get("id", item_id)))
        item.question = obj.get("question") if isinstance(obj.get("question"), str) else None
        item.answer = obj.get("answer") if isinstance(obj.get("answer"), str) else None
        try:
            item.duration = _duration(obj.get("duration"))
        except ItemError:
            pass
    return item


def _expand(obj, item_id: str, base_dir: Path, video_dir: Path | None) -> list[Item]:
    """A question, or a Video-MME video with a list of questions (each inherits the video's fields)."""
    if isinstance(obj, dict) and isinstance(obj.get("questions"), list):
        shared = {k: v for k, v in obj.items() if k != "questions"}
        entries = [
            ({**shared, **q} if isinstance(q, dict) else q, f"{item_id}.{k + 1}")
            for k, q in enumerate(obj["questions"])
        ]
    else:
        entries = [(obj, item_id)]
    items = []
    for entry, eid in entries:
        try:
            items.append(parse_item(entry, eid, base_dir, video_dir))
        except ItemError as e:
            items.append(_bad(eid, e, entry))
    return items


def read_items(path, video_dir=None) -> list[Item]:
    """All items of a JSON-lines file (or a .json list); a bad line becomes an Item with its error."""
    path = Path(path)
    base, name = path.resolve().parent, path.name
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        except json.JSONDecodeError:
            data = None
        if isinstance(data, list):
            return [it for k, obj in enumerate(data) for it in _expand(obj, f"{name}:{k + 1}", base, video_dir)]
    items = []
    for line in lines(path):
        n = line.number
        try:
            obj = line.parse()
        except JsonlError as e:  # a bad line, the last one included, is a recorded item: the run goes on
            items.append(Item(id=f"{name}:{n}", error=f"line {n} is {e.reason}", error_kind="malformed"))
            continue
        items.extend(_expand(obj, f"{name}:{n}", base, video_dir))
    return items


# ------------------------------------------------------------------------------------ buckets


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


# ------------------------------------------------------------------------------------ video codes


class VideoSource:
    """(T, 256) codes of an item's video: from the lwm-tokenize cache when it holds the video, else read
    and tokenized with the VQGAN (loaded at the first video that needs it)."""

    def __init__(
        self,
        codes_dir=None,
        vqgan=DEFAULT_VQGAN,
        fps: float | None = 1.0,
        max_frames: int | None = None,
        ids: str = "auto",
        device="cpu",
    ):
        from lwm.data.codes import CodeStore

        self.store = CodeStore(codes_dir) if codes_dir is not None else None
        self.vqgan_path, self.fps, self.max_frames, self.ids, self.device = vqgan, fps, max_frames, ids, device
        self._vqgan = None

    def cache_id(self, item: Item) -> str | None:
        if self.store is None:
            return None
        from lwm.vision.tokenize import video_id

        candidates = []
        if item.video is not None:
            candidates += [video_id(item.video, s) for s in (("hashed", "stem") if self.ids == "auto" else (self.ids,))]
        if item.video_key is not None:
            candidates.append(item.video_key)
        return next((c for c in candidates if self.store.path(c).is_file()), None)

    def vqgan(self):
        if self._vqgan is None:
            from lwm.vision.checkpoint import load_vqgan

            if self.vqgan_path is None or not Path(self.vqgan_path).exists():
                raise ItemError(
                    "vqgan",
                    f"the video is not in the code cache and the VQGAN checkpoint "
                    f"{self.vqgan_path} to tokenize it does not exist (--vqgan)",
                )
            try:
                self._vqgan = load_vqgan(self.vqgan_path, preset="tiny").to(self.device).eval()
            except Exception as e:
                raise ItemError(
                    "vqgan", f"cannot load the VQGAN checkpoint {self.vqgan_path}: {type(e).__name__}: {e}"
                ) from e
        return self._vqgan

    def load(self, item: Item) -> tuple[np.ndarray, dict]:
        """codes (T, 256) and what to record about them: where they came from, frames, the video's length."""
        cid = self.cache_id(item)
        if cid is not None:
            try:
                codes = self.store.load(cid, max_frames=self.max_frames, fps=self.fps)
            except (FileNotFoundError, ValueError) as e:
                raise ItemError("codes", f"cached codes of {cid}: {e}") from e
            seconds = self.store.meta.get(cid, {}).get("video", {}).get("duration")
            return codes, {"codes_from": "cache", "cache_id": cid, "frames": len(codes), "video_seconds": seconds}
        if item.video is None:
            raise ItemError(
                "video_missing",
                f"video {item.video_key!r} is not in the code cache and there is no "
                f"file for it (pass --video-dir, or --codes holding it)",
            )
        from lwm.infer.prompt import video_codes
        from lwm.vision.video import Video, VideoError

        if not os.path.exists(item.video):
            raise ItemError("video_missing", f"{item.video}: no such file")
        vq = self.vqgan()
        try:
            codes = video_codes(item.video, vq, fps=self.fps, max_frames=self.max_frames)
            seconds = Video(item.video, vq.config.resolution).duration if item.duration is None else None
        except VideoError as e:
            raise ItemError("video_unreadable", str(e)) from e
        return codes, {"codes_from": "video", "frames": len(codes), "video_seconds": seconds}


# ------------------------------------------------------------------------------------ the run


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
    reads the video and the others get the codes from it. prompt_style: lwm.infer.prompt's."""
    from lwm.infer.prompt import chat_prompt
    from lwm.infer.sampling import GenerationConfig

    group = getattr(generator, "group", None)
    _, rank = group_size_and_rank(group)
    prepared = broadcast_object_from_first(_prepare(item, source) if rank == 0 else None, group)
    info = prepared.get("info", {})
    duration = item.duration if item.duration is not None else info.get("video_seconds")
    rec = {
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
    if rec["error"] is not None:
        return rec
    codes, eos = prepared["codes"], tokenizer.eos_id
    try:
        prompt = chat_prompt(tokenizer, vocab, item.question, codes, style=prompt_style)
        rec["prompt_tokens"] = len(prompt)
        if item.options is None:
            out = generator.generate(
                prompt, GenerationConfig(max_new_tokens=max_new_tokens, stop_tokens=[eos], restrict="text")
            )
            text = tokenizer.decode(out)
            rec["open"] = {"output": text, "correct": normalize(text) == normalize(item.answer)}
            rec["correct"] = rec["open"]["correct"]
            return rec
        if "ll" in methods:
            conts = [tokenizer.encode(option_text(o)) for o in item.options]
            scores = generator.score(prompt, conts)
            per_token = [s / len(c) for s, c in zip(scores, conts)]
            best, best_norm = int(np.argmax(scores)), int(np.argmax(per_token))
            rec["ll"] = {
                "scores": scores,
                "scores_per_token": per_token,
                "predicted": LETTERS[best],
                "correct": best == item.answer_index,
                "predicted_per_token": LETTERS[best_norm],
                "correct_per_token": best_norm == item.answer_index,
            }
        if "letter" in methods:
            lprompt = chat_prompt(
                tokenizer, vocab, letter_question(item.question, item.options), codes, style=prompt_style
            )
            out = generator.generate(
                lprompt, GenerationConfig(max_new_tokens=letter_tokens, stop_tokens=[eos], restrict="text")
            )
            text = tokenizer.decode(out)
            pick = first_letter(text, len(item.options))
            rec["letter"] = {
                "prompt_tokens": len(lprompt),
                "output": text,
                "predicted": None if pick is None else LETTERS[pick],
                "correct": pick == item.answer_index,
            }
        rec["correct"] = rec["ll" if "ll" in methods else "letter"]["correct"]
    except Exception as e:  # a failed prompt (too long, out of memory ...) is recorded; the run goes on
        rec["error"], rec["error_kind"] = f"{type(e).__name__}: {e}", "model"
    return rec


def _mean(values) -> float | None:
    values = list(values)
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
        "chance": _mean(1 / len(r["options"]) for r in mc),
        "exact_match": _mean(r["open"]["correct"] for r in op),
    }


def summarize(records: list[dict], buckets: Buckets = Buckets()) -> dict:
    """Accuracy overall and by bucket, and the errors counted by kind."""
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
    }


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
    is called on that rank as each item finishes. Items may also be JSON objects (parsed here, paths
    relative to the working directory). Ctrl-C stops early with what was done."""
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {list(methods)}")
    from tqdm import tqdm

    _, rank = group_size_and_rank(getattr(generator, "group", None))
    items = [
        x
        for k, it in enumerate(items)
        for x in ([it] if isinstance(it, Item) else _expand(it, f"item {k + 1}", Path.cwd(), None))
    ]
    records, complete = [], True
    bar = tqdm(items, desc="video QA", unit="q", disable=not progress or rank != 0, dynamic_ncols=True, mininterval=1.0)
    try:
        for item in bar:
            rec = evaluate_item(
                item, generator, tokenizer, vocab, source, methods, buckets, max_new_tokens, letter_tokens, prompt_style
            )
            records.append(rec)
            if rank == 0:
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
    return {"config": config or {}, "summary": summarize(records, buckets), "records": records, "complete": complete}


# ------------------------------------------------------------------------------------ reports


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
        "Accuracy (LL): the option with the highest log-likelihood after the bare question (primary); "
        "accuracy (letter): the first option letter generated after the question with its options listed. "
        "Accuracies are over multiple-choice items, exact match over open ones; n counts scored items.",
    ]
    if s["all"]["accuracy_ll_per_token"] is not None:
        lines.append(f"LL with per-token mean log-likelihood: {_pct(s['all']['accuracy_ll_per_token'])} overall.")
    if s["all"]["letter_unparsed"]:
        lines.append(f"Outputs with no option letter (counted wrong): {s['all']['letter_unparsed']}.")
    if s["errors"]["total"]:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["errors"]["by_kind"].items()))
        lines.append(f"Errors by kind: {kinds} (reasons per item in video_qa.json).")
    return "\n".join(lines) + "\n"


def write_outputs(result: dict, out_dir) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / "video_qa.json", out_dir / "video_qa.md"
    write_atomic(js, json.dumps(result, indent=1, default=_jsonable) + "\n")
    write_atomic(md, markdown(result))
    return js, md


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


# ------------------------------------------------------------------------------------ command line


def build_parser() -> argparse.ArgumentParser:
    from lwm.infer.runtime import add_model_args

    p = argparse.ArgumentParser(
        prog="video_qa.py",
        description="Long-video question answering accuracy.",
        epilog="Exit status: 0 if every item was scored, 1 if some were recorded as errors, "
        "2 for a usage error, 130 if interrupted.",
    )
    add_model_args(p)
    p.add_argument("--data", required=True, help="JSON lines of questions (or a .json list); see the module's doc")
    p.add_argument("--video-dir", help="folder of <videoID>.mp4 for Video-MME style items")
    p.add_argument("--codes", help="an lwm-tokenize output folder with cached codes")
    p.add_argument(
        "--ids",
        choices=["auto", "hashed", "stem"],
        default="auto",
        help="how cached codes are named (lwm-tokenize --ids); auto tries both",
    )
    p.add_argument(
        "--vqgan",
        help="VQGAN checkpoint (tiny preset) or diffusers folder for videos not in the cache "
        "(default: the model folder's vqgan/, else the bundled tiny VQGAN)",
    )
    p.add_argument("--fps", type=positive_float, default=1.0, help="frames per second (default 1)")
    p.add_argument("--max-frames", type=positive_int, help="at most this many frames, spread evenly")
    p.add_argument(
        "--methods", type=csv_list, default=list(METHODS), help="multiple-choice scoring: ll, letter or ll,letter"
    )
    p.add_argument(
        "--bucket-edges",
        type=csv_list,
        default=["120", "900"],
        help="duration bucket edges in seconds (default 120,900)",
    )
    p.add_argument(
        "--bucket-names", type=csv_list, help="names of the buckets (one more than edges; default short,medium,long)"
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=32, help="tokens generated for an open question")
    p.add_argument("--letter-tokens", type=positive_int, default=8, help="tokens generated for the letter")
    p.add_argument("--limit", type=positive_int, help="only the first N items")
    p.add_argument(
        "--max-duration",
        type=float,
        help="skip items whose given duration (seconds) is longer, e.g. what a CPU cannot prefill in reasonable time",
    )
    p.add_argument("--out", default="runs/eval", help="output folder (default runs/eval)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _usage_error(parser, message: str):
    if _rank() == 0:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not Path(args.model).exists():
        _usage_error(parser, f"--model {args.model}: no such file or folder")
    if not Path(args.data).is_file():
        _usage_error(parser, f"--data {args.data}: no such file")
    if args.video_dir and not Path(args.video_dir).is_dir():
        _usage_error(parser, f"--video-dir {args.video_dir}: no such folder")
    if args.codes and not (Path(args.codes) / "tokens").is_dir():
        _usage_error(parser, f"--codes {args.codes}: no tokens/ folder (expected the output of lwm-tokenize)")
    if args.vqgan is not None and not Path(args.vqgan).exists():
        _usage_error(parser, f"--vqgan {args.vqgan}: no such file or folder")
    bad = [m for m in args.methods if m not in METHODS]
    if bad or not args.methods:
        _usage_error(parser, f"--methods: expected ll, letter or ll,letter, got {','.join(args.methods)!r}")
    try:
        edges = tuple(float(e) for e in args.bucket_edges)
        buckets = Buckets(edges, tuple(args.bucket_names) if args.bucket_names else None)
    except ValueError as e:
        _usage_error(parser, f"--bucket-edges/--bucket-names: {e}")
    try:
        items = read_items(args.data, args.video_dir)
    except OSError as e:
        _usage_error(parser, f"--data {args.data}: {e}")
    if args.max_duration is not None:
        n = len(items)
        items = [it for it in items if not (isinstance(it.duration, (int, float)) and it.duration > args.max_duration)]
        if len(items) < n and _rank() == 0:
            print(
                f"skipping {n - len(items)} items longer than --max-duration {args.max_duration:g} s", file=sys.stderr
            )
    if args.limit:
        items = items[: args.limit]
    if not items:
        _usage_error(parser, f"--data {args.data}: no items")
    if any(it.video_key and not it.video for it in items) and not args.codes:
        _usage_error(
            parser, f"--data {args.data} names videos by videoID: pass --video-dir (folder of <videoID>.mp4) or --codes"
        )
    out = Path(args.out)
    if _rank() == 0:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            _usage_error(parser, f"--out {args.out}: {e}")

    from lwm.infer.runtime import load_generator, start

    runtime = start(args.device)
    device, group = runtime.device, runtime.group
    try:
        loaded, generator = load_generator(args, runtime)
    except (FileNotFoundError, ValueError) as e:
        _usage_error(parser, str(e))
    args.vqgan = str(args.vqgan or loaded.vqgan or DEFAULT_VQGAN)
    source = (
        VideoSource(args.codes, args.vqgan, fps=args.fps, max_frames=args.max_frames, ids=args.ids, device=device)
        if _rank() == 0
        else None
    )
    world = runtime.world
    config = {
        "model": str(args.model),
        "data": str(args.data),
        "video_dir": args.video_dir,
        "codes": args.codes,
        "vqgan": args.vqgan,
        "fps": args.fps,
        "max_frames": args.max_frames,
        "methods": list(args.methods),
        "bucket_edges": list(buckets.edges),
        "bucket_names": list(buckets.names),
        "max_new_tokens": args.max_new_tokens,
        "letter_tokens": args.letter_tokens,
        "limit": args.limit,
        "max_duration": args.max_duration,
        "world_size": world,
        "layout": args.layout,
        "device": device,
        "dtype": str(loaded.model.output.weight.dtype).removeprefix("torch."),
        "model_max_seq_len": loaded.model.config.max_seq_len,
    }
    log = RecordLog(out / "video_qa.records.jsonl") if _rank() == 0 else None
    started = time.perf_counter()
    try:
        result = run_video_qa(
            generator,
            loaded.tokenizer,
            loaded.vocab,
            items,
            source,
            methods=tuple(args.methods),
            buckets=buckets,
            max_new_tokens=args.max_new_tokens,
            letter_tokens=args.letter_tokens,
            prompt_style=loaded.prompt,
            on_record=log,
            progress=not args.no_progress,
            config=config,
        )
    finally:
        if log is not None:
            log.close()
    result["config"]["seconds"] = round(time.perf_counter() - started, 3)
    s = result["summary"]
    if _rank() == 0:
        js, md = write_outputs(result, out)
        print(markdown(result))
        if s["max_prompt_tokens"] > loaded.model.config.max_seq_len:
            print(
                f"warning: prompts up to {s['max_prompt_tokens']} tokens, longer than the model's max_seq_len "
                f"{loaded.model.config.max_seq_len}",
                file=sys.stderr,
            )
        print(f"wrote {js} and {md}")
    if group is not None:
        import torch.distributed as dist

        dist.destroy_process_group()
    if not result["complete"]:
        return 130
    return 1 if s["errors"]["total"] else 0


if __name__ == "__main__":
    sys.exit(main())
