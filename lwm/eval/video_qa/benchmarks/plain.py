"""The plain form, this project's own: JSON lines (or a .json list), one question each,
`{video, question, options?, answer, duration?}`, or a video with a list of `questions` that inherit its
fields. `video` is relative to the file's folder, or absolute inside it or --video-dir; `videoID` or
`vision` name a video as --video-dir/<id>.mp4 or cached codes; `answer` an option's letter or its text
(lwm.eval.video_qa.items says how it is matched); `duration` seconds or a bucket name; `task_type` or `kind` its task; `id` or
`question_id` optional. A question already written in the letter form is cut back to the bare question.

Prompt: "{question} A. ... B. ... Answer with the letter." (lwm.data.choices, the training form);
reading: the first standalone option letter; none: wrong; accuracy over all questions. Its primary
metric is the options' log-likelihood (lwm.eval.video_qa.scoring)."""

from __future__ import annotations

from pathlib import Path

from lwm.eval.video_qa.benchmarks.base import Benchmark, Rules
from lwm.eval.video_qa.items import (
    Item,
    ItemError,
    answer_index,
    bad_item,
    duration_value,
    parse_options,
    text_field,
    video_file,
)
from lwm.eval.video_qa.text import bare_question, first_letter, letter_question


def recognise(obj: dict) -> bool:
    keys = set(obj)
    return "question" in keys or "answer" in keys or bool(keys & {"video", "videoID", "vision"})


def parse_item(obj, item_id: str, base_dir: Path, video_dir: Path | None = None) -> Item:
    """One question (a JSON object) -> an Item; raises ItemError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ItemError("malformed", f"expected a JSON object, got {type(obj).__name__}")
    item = Item(id=str(obj.get("question_id", obj.get("id", item_id))))
    item.question, item.answer = text_field(obj, "question"), text_field(obj, "answer")
    item.duration = duration_value(obj.get("duration"))
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
        item.video_roots = (str(base_dir),) + ((str(video_dir),) if video_dir is not None else ())
    elif isinstance(key, str) and key.strip():
        item.video_key = key.strip()
        if video_dir is not None:
            item.video = video_file(video_dir, item.video_key)
            item.video_roots = (str(video_dir),)
    else:
        raise ItemError("malformed", "no video: expected 'video' (a path) or 'videoID' (with --video-dir)")
    return item


def items(obj, item_id: str, source: Path, video_dir, subtitle_dir) -> list[Item]:
    """One object (a question, or a video with its questions) -> its Items, a bad one with its error. Also
    what reads an object of no known form, so that its error says what this form expects."""
    if isinstance(obj, dict) and isinstance(obj.get("questions"), list):
        shared = {k: v for k, v in obj.items() if k != "questions"}
        entries = [(q if not isinstance(q, dict) else {**shared, **q}, f"{item_id}.{k + 1}")
                   for k, q in enumerate(obj["questions"])]  # fmt: skip
    else:
        entries = [(obj, item_id)]
    out = []
    for entry, eid in entries:
        try:
            out.append(parse_item(entry, eid, source.resolve().parent, video_dir))
        except ItemError as e:
            out.append(bad_item(eid, e, entry))
    return out


class Plain(Rules):
    name, title = "plain", "Video QA"

    def prompt(self, item: Item, subtitles: str | None = None) -> str:
        return letter_question(item.question, item.options)

    def find(self, text: str, n: int) -> int | None:
        return first_letter(text, n)


BENCHMARK = Benchmark(
    name=None,
    files="JSON lines (or a .json list) of {video, question, options?, answer, duration?}",
    recognise=recognise,
    items=items,
    rules=Plain(),
    parquet=False,
)
