"""What lmms-eval's own Video-MME, LongVideoBench and MLVU functions cannot do for a local download:
find its videos where the download put them (lmms-eval's look under $HF_HOME in the Hub copies' layout),
and read LongVideoBench's and MLVU's JSON files as released into the fields lmms-eval's prompt and scoring
functions take. The download folders come from lwm.eval.lmms_run (LWM_LMMS_<BENCHMARK> in the environment).
"""

from __future__ import annotations

import os
from pathlib import Path

from lwm.eval.video_qa.items import video_file
from lwm.eval.video_qa.text import LETTERS

ENV = {"videomme": "LWM_LMMS_VIDEOMME", "longvideobench": "LWM_LMMS_LONGVIDEOBENCH", "mlvu": "LWM_LMMS_MLVU"}

# MLVU's multiple-choice tasks, as its json/ and video/ folders name them; 8_sub_scene and 9_summary
# are open answers scored by GPT-4 in MLVU, not read here.
MLVU_TASKS = ("1_plotQA", "2_needle", "3_ego", "4_count", "5_order", "6_anomaly_reco", "7_topic_reasoning")


def root(benchmark: str) -> Path:
    value = os.environ.get(ENV[benchmark])
    if not value:
        raise ValueError(
            f"{ENV[benchmark]} is not set: the {benchmark} download folder is given to python -m lwm.eval.lmms_run "
            f"(--{benchmark} DIR), which fills the task file and sets it"
        )
    return Path(value)


def videomme_doc_to_visual(doc) -> list[str]:
    """<download>/data/<videoID>.mp4 (.MP4, .mkv), as the release's videos_chunked_*.zip unpack."""
    return [video_file(root("videomme") / "data", doc["videoID"])]


def longvideobench_process_docs(dataset):
    """lvb_val.json's `candidates` as the option0..option4 fields ("N/A" after the last) that the
    validation parquet has and lmms-eval's LongVideoBench functions read."""

    def options(doc):
        if doc.get("option0") is not None:
            return {}
        given = list(doc.get("candidates") or [])
        return {f"option{i}": given[i] if i < len(given) else "N/A" for i in range(5)}

    return dataset.map(options)


def longvideobench_doc_to_visual(doc) -> list[str]:
    return [str(root("longvideobench") / "videos" / doc["video_path"])]


def mlvu_process_docs(dataset):
    """MLVU's json/<n>_<task>.json questions as lmms-eval's MLVU functions read them: the options after the
    question as "(A) ..." lines, the answer as its letter, task_type, and the video's path under video/."""

    def fields(doc):
        options = list(doc["candidates"])
        lines = [f"({LETTERS[i]}) {o}" for i, o in enumerate(options)]
        task = doc["question_type"]
        folder = next((t for t in MLVU_TASKS if t.split("_", 1)[1] == task), "")
        return {
            "question": "\n".join([doc["question"], *lines]),
            "answer": LETTERS[options.index(doc["answer"])],
            "task_type": task,
            "video_name": f"{folder}/{doc['video']}" if folder else doc["video"],
        }

    return dataset.filter(lambda doc: bool(doc.get("candidates"))).map(fields)


def mlvu_doc_to_visual(doc) -> list[str]:
    """<download>/video/<n>_<task>/<video>, or <download>/video/<video> where the videos lie in one folder."""
    videos = root("mlvu") / "video"
    by_task = videos / doc["video_name"]
    return [str(by_task if by_task.is_file() else videos / Path(doc["video_name"]).name)]
