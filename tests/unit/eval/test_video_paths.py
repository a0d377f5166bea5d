"""Video QA items whose video leads out of the video root (`..`, an absolute path, a symlink pointing
elsewhere) are failures of their own, naming the item and the path, never opened or decoded; the batch
goes on with the others."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from char_tokenizer import Tok  # the tests' helper: tests/char_tokenizer.py

from lwm.data.vocab import Vocab
from lwm.eval import video_qa as vqa
from lwm.eval.video_qa import cli
from lwm.eval.video_qa.files import read_items

OPTIONS = ["Red", "Blue"]


def _write(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    """bench/ with its videos/, and a secret/ beside it that a link in videos/ points to."""
    bench, secret = tmp_path / "bench", tmp_path / "secret"
    (bench / "videos").mkdir(parents=True)
    secret.mkdir()
    (secret / "private.mp4").write_bytes(b"not yours")
    os.symlink(secret / "private.mp4", bench / "videos" / "link.mp4")
    (bench / "videos" / "a.mp4").write_bytes(b"")
    return bench, secret


def _question(video: str, q: str, key: str = "video") -> dict:
    return {"id": q, key: video, "question": f"{q}?", "options": OPTIONS, "answer": "Red"}


class Recording:
    """A video source that records what it is asked to load."""

    def __init__(self):
        self.loaded = []

    def load(self, item):
        self.loaded.append(item.video)
        return np.zeros((2, 256), np.int64), {"codes_from": "stub", "frames": 2, "video_seconds": 3.0}


class FirstOption:
    group = None

    def score(self, prompt, continuations):
        return [0.0] + [-1.0] * (len(continuations) - 1)

    def generate(self, prompt, config):
        return Tok().encode("A.")


def test_videos_out_of_the_root_are_failures_naming_the_item_and_never_loaded(tmp_path):
    bench, secret = _tree(tmp_path)
    data = _write(
        bench / "qa.jsonl",
        [
            _question("videos/a.mp4", "inside"),
            _question("../../secret/private.mp4", "dotdot"),
            _question("/etc/passwd", "absolute"),
            _question("videos/link.mp4", "symlink"),
            _question(str(bench / "videos" / "a.mp4"), "absolute-inside"),
            _question("../../secret/private", "by-id", key="videoID"),  # --video-dir/<id>.mp4
        ],
    )
    items = {it.id: it for it in read_items(data, video_dir=bench / "videos")}
    assert items["inside"].error is None and items["absolute-inside"].error is None
    for name, given in [("dotdot", "../../secret/private.mp4"), ("absolute", "/etc/passwd"), ("symlink", "link.mp4")]:
        item = items[name]
        assert item.error_kind == "video_outside", name
        assert f"item {name}:" in item.error and given in item.error and "outside" in item.error
    assert items["by-id"].error_kind == "video_outside" and "private" in items["by-id"].error

    source = Recording()
    result = vqa.run_video_qa(FirstOption(), Tok(), Vocab(Tok.vocab_size), list(items.values()), source, progress=False)
    assert sorted(source.loaded) == sorted([str(bench / "videos" / "a.mp4")] * 2)  # only the two inside
    records = {r["id"]: r for r in result["records"]}
    assert result["complete"] and len(records) == 6
    assert {i for i, r in records.items() if r["error_kind"] == "video_outside"} == {
        "dotdot",
        "absolute",
        "symlink",
        "by-id",
    }
    assert records["inside"]["correct"] is True and records["absolute-inside"]["error"] is None


def test_the_benchmarks_forms_are_confined_to_their_video_folders(tmp_path):
    bench, _ = _tree(tmp_path)
    lvb = {"video_id": "v", "video_path": "../../secret/private.mp4", "duration": 3.0, "id": "lvb1",
           "question": "Q?", "candidates": ["x", "y"], "correct_choice": 0}  # fmt: skip
    mlvu = {"question_id": "m1", "video": "../../../secret/private.mp4", "question": "Q?",
            "candidates": ["x", "y"], "answer": "x"}  # fmt: skip
    (lvb_item,) = read_items(_write(bench / "lvb" / "lvb.json", [lvb]))
    (mlvu_item,) = read_items(_write(bench / "mlvu" / "json" / "1_plotQA.json", [mlvu]))
    for item in (lvb_item, mlvu_item):
        assert item.error_kind == "video_outside" and "private.mp4" in item.error, item.error


def test_a_refused_video_is_not_probed_for_its_length(tmp_path, monkeypatch):
    bench, _ = _tree(tmp_path)
    (item,) = read_items(_write(bench / "qa.jsonl", [{**_question("/etc/passwd", "abs"), "duration": "long"}]))
    probed = []
    monkeypatch.setattr(cli, "probe_seconds", lambda path: probed.append(path))
    assert cli._seconds(item, {}) is None and probed == []
