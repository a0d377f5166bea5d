"""python -m lwm.eval.lmms_run: lmms-eval with an exit status (1 when the lwm model refuses its arguments
or a task has no results, where `python -m lmms_eval` exits 0), and the task files shipped in
lwm/eval/lmms_tasks reading Video-MME, LongVideoBench and MLVU from local downloads, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lwm.eval.lmms_run import main, write_tasks

pytest.importorskip("lmms_eval")

OPTIONS = ["A. A red circle.", "B. A blue square.", "C. Two shapes.", "D. Nothing moves."]


def _downloads(root: Path) -> dict[str, str]:
    """The three benchmarks as released, one question each (videos are empty files: nothing decodes them here)."""
    vmme = root / "Video-MME"
    (vmme / "data").mkdir(parents=True)
    (vmme / "videomme").mkdir()
    (vmme / "data" / "vidA.mp4").write_bytes(b"")
    row = {"video_id": "000", "duration": "short", "domain": "Knowledge", "sub_category": "Literature & Art",
           "url": "https://example.com/vidA", "videoID": "vidA", "question_id": "000-0",
           "task_type": "Attribute Perception", "question": "What is shown?", "options": OPTIONS, "answer": "A"}  # fmt: skip
    pq.write_table(pa.Table.from_pylist([row]), vmme / "videomme" / "test-00000-of-00001.parquet")

    lvb = root / "LongVideoBench"
    (lvb / "videos").mkdir(parents=True)
    lvb_row = {"video_id": "v1", "video_path": "v1.mp4", "subtitle_path": "v1_en.json", "duration": 12.0,
               "duration_group": 15, "question_category": "S2E", "starting_timestamp_for_subtitles": 0.0,
               "id": "lvb-1", "question": "Which shape?", "candidates": ["circle", "square"], "correct_choice": 1}  # fmt: skip
    (lvb / "lvb_val.json").write_text(json.dumps([lvb_row]))

    mlvu = root / "MLVU"
    (mlvu / "json").mkdir(parents=True)
    (mlvu / "video" / "1_plotQA").mkdir(parents=True)
    (mlvu / "video" / "1_plotQA" / "m.mp4").write_bytes(b"")
    mc = {"video": "m.mp4", "duration": 100.0, "question": "What happens?", "candidates": ["a fall", "a jump"],
          "answer": "a jump", "question_type": "plotQA"}  # fmt: skip
    (mlvu / "json" / "1_plotQA.json").write_text(json.dumps([mc]))
    summary = {
        "video": "s.mp4",
        "duration": 100.0,
        "question": "Summarize.",
        "answer": "...",
        "question_type": "summary",
    }
    (mlvu / "json" / "9_summary.json").write_text(json.dumps([summary]))  # open answers: not this task's
    return {"videomme": str(vmme), "longvideobench": str(lvb), "mlvu": str(mlvu)}


def test_the_shipped_task_files_read_the_local_downloads(tmp_path, monkeypatch):
    from lmms_eval.tasks import TaskManager, get_task_dict

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    roots = _downloads(tmp_path)
    for var in ("LWM_LMMS_VIDEOMME", "LWM_LMMS_LONGVIDEOBENCH", "LWM_LMMS_MLVU"):
        monkeypatch.delenv(var, raising=False)  # write_tasks sets them; monkeypatch restores them after
    folder = write_tasks(roots, tmp_path / "tasks")
    manager = TaskManager("WARNING", include_path=str(folder), include_defaults=False)
    tasks = get_task_dict(["lwm_videomme_local", "lwm_longvideobench_local", "lwm_mlvu_local"], manager)

    def first(name):
        task = tasks[name]
        docs = list(task.test_docs())
        return task, docs

    task, docs = first("lwm_videomme_local")
    assert len(docs) == 1 and task.doc_to_visual(docs[0]) == [f"{roots['videomme']}/data/vidA.mp4"]
    assert "What is shown?\nA. A red circle." in task.doc_to_text(docs[0])

    task, docs = first("lwm_longvideobench_local")
    assert task.doc_to_visual(docs[0]) == [f"{roots['longvideobench']}/videos/v1.mp4"]
    assert "Which shape?\nA. circle\nB. square" in task.doc_to_text(docs[0]) and task.doc_to_target(docs[0]) == 1

    task, docs = first("lwm_mlvu_local")
    assert len(docs) == 1  # the summary task's question is not a multiple-choice one
    assert task.doc_to_visual(docs[0]) == [f"{roots['mlvu']}/video/1_plotQA/m.mp4"]
    assert "What happens?\n(A) a fall\n(B) a jump" in task.doc_to_text(docs[0]) and docs[0]["answer"] == "B"


def test_a_missing_download_folder_is_refused_naming_it(tmp_path, capsys):
    assert main(["--mlvu", str(tmp_path / "nope"), "--", "--model", "lwm", "--tasks", "lwm_mlvu_local"]) == 2
    assert f"--mlvu {tmp_path / 'nope'}: no such folder" in capsys.readouterr().err


def test_the_models_refusal_exits_non_zero(tmp_path):
    """python -m lmms_eval logs the lwm model's refusal and exits 0; lwm.eval.lmms_run exits 1 saying why."""
    roots = _downloads(tmp_path)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "lwm.eval.lmms_run", "--videomme", roots["videomme"], "--", "--model", "lwm"]
    cmd += ["--model_args", f"pretrained={tmp_path / 'missing'}", "--tasks", "lwm_videomme_local", "--batch_size", "1"]
    cmd += ["--output_path", str(tmp_path / "out")]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    assert f"lmms-eval failed: ValueError: model_args pretrained={tmp_path / 'missing'}: no such folder" in proc.stderr


def test_a_task_without_results_fails_and_all_with_results_pass(monkeypatch):
    """The exit status from what lmms-eval's evaluation returns: a task asked and not in its results fails."""
    from argparse import Namespace

    from lmms_eval import __main__ as harness

    from lwm.eval import lmms_run

    def evaluate(done):
        def cli_evaluate():  # lmms-eval's loop: each evaluation through cli_evaluate_single, errors logged
            try:
                harness.cli_evaluate_single(Namespace(tasks="a,b"))
            except Exception:
                pass

        monkeypatch.setattr(harness, "cli_evaluate", cli_evaluate)
        monkeypatch.setattr(harness, "cli_evaluate_single", lambda args: ({"results": done}, None))
        return lmms_run.run(["--tasks", "a,b"])

    assert evaluate({"a": {}, "b": {}}) == []
    assert evaluate({"a": {}}) == ["task b: no results"]
