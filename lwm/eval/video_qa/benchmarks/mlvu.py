"""MLVU, as released and as its multiple-choice evaluation asks.

Files: one task's JSON (json/1_plotQA.json: video, duration, question, candidates, answer as text,
question_type), or the json/ folder for every task. Videos: --video-dir/<the file's stem>/<video>
(default the json folder's ../video). The tasks without candidates (sub_scene, summary) are scored by
GPT-4 in MLVU: skipped here.

Prompt: "Carefully watch this video and pay attention to every detail. Based on your observations,
select the best option that accurately addresses the question.\\nQuestion: {question}\\nOptions:\\n(A)
...\\n...\\nOnly give the best option.", the answer begun with "Best option:(". Reading: the output up to
its first ")" must be the letter; anything else is wrong. Overall: M-Avg, the mean of the tasks'
accuracies, and a table by task."""

from __future__ import annotations

import re
from pathlib import Path

from lwm.eval.video_qa.benchmarks.base import Benchmark, Rules
from lwm.eval.video_qa.items import Item, ItemError, answer_index, bad_item, duration_value, text_field
from lwm.eval.video_qa.text import LETTERS

SYSTEM = (
    "Carefully watch this video and pay attention to every detail. Based on your observations, "
    "select the best option that accurately addresses the question."
)
POST = "Only give the best option."
ANSWER_START = "Best option:("

# ------------------------------------------------------------------------------------ reading


def recognise(obj: dict) -> bool:
    return "candidates" in obj and "video" in obj


def skip(obj: dict) -> str | None:
    """MLVU's open tasks (sub_scene, summary): no candidates; MLVU scores them with GPT-4."""
    if "video" in obj and "candidates" not in obj and "question_type" in obj:
        return "MLVU generation tasks (no candidates; MLVU scores them with GPT-4)"
    return None


def task_of(path: Path) -> str:
    """A task's file stem without its number: 1_plotQA -> plotQA."""
    return re.sub(r"^\d+_", "", path.stem)


def items(obj: dict, item_id: str, source: Path, video_dir, subtitle_dir) -> list[Item]:
    """One question of a task's file -> its Item (MLVU has no subtitles)."""
    item = Item(id=str(obj.get("question_id", obj.get("id", item_id))), benchmark="mlvu")
    task = obj.get("question_type") or task_of(source)
    item.meta = {k: obj.get(k) for k in ("video", "duration", "question_type", "candidates", "answer")}
    item.meta["task_file"] = source.name
    item.groups, item.task = {"task": str(task)}, str(task)
    item.question = obj.get("question") if isinstance(obj.get("question"), str) else None
    try:
        item.duration = duration_value(obj.get("duration"))
        name = text_field(obj, "video")
        folder = Path(video_dir) if video_dir is not None else source.parent.parent / "video"
        by_task = folder / source.stem / name
        item.video = str(by_task if by_task.is_file() or not (folder / name).is_file() else folder / name)
        item.video_key = Path(name).stem
        item.video_roots = (str(folder),)
        item.question, item.answer = text_field(obj, "question"), text_field(obj, "answer")
        raw = obj.get("candidates")
        if not isinstance(raw, list) or len(raw) < 2 or not all(isinstance(c, str) and c.strip() for c in raw):
            raise ItemError("options", f"MLVU candidates must be a list of at least 2 texts, got {raw!r}")
        item.options = [c.strip() for c in raw]
        item.answer_index = answer_index(item.answer, item.options, letters=False)  # MLVU's answers are texts
    except ItemError as e:
        return [bad_item(item.id, e, partial=item)]
    return [item]


# ------------------------------------------------------------------------------------ prompt and answer


class MLVU(Rules):
    name, title = "mlvu", "MLVU"
    breakdowns = ("task",)
    overall = "task_mean"
    answer_start = ANSWER_START

    def prompt(self, item: Item, subtitles: str | None = None) -> str:
        listed = [f"({LETTERS[i]}) {o}" for i, o in enumerate(item.options)]
        return "\n".join([SYSTEM, f"Question: {item.question}", "Options:", *listed, POST])

    def find(self, text: str, n: int) -> int | None:
        s = text.strip()
        s = s[: s.index(")")] if ")" in s else s
        return LETTERS.index(s) if len(s) == 1 and s in LETTERS[:n] else None


BENCHMARK = Benchmark(
    name="mlvu",
    files="MLVU (a task's JSON, json/1_plotQA.json ..., or the json/ folder)",
    recognise=recognise,
    items=items,
    rules=MLVU(),
    skip=skip,
)
