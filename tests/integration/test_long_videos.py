"""lwm/synth/make_long_videos.py: the long-video QA set's durations, questions, determinism and resumption."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import av  # noqa: F401  (the generator writes its videos with PyAV)
import numpy as np
import pytest

from lwm.io import read_jsonl
from lwm.synth import language
from lwm.synth import make_long_videos as long_videos
from lwm.synth import scene as scene_lib

DURATIONS = [4, 6]
PER = 2


def _args(out: Path, seed: int = 0, durations=DURATIONS, per: int = PER) -> list[str]:
    return ["--out", str(out), "--durations", *map(str, durations), "--per-duration", str(per), "--seed", str(seed)]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """Made through the command line, as users do."""
    out = tmp_path_factory.mktemp("long") / "lv"
    run = subprocess.run(
        [sys.executable, "-m", "lwm.synth.make_long_videos", *_args(out)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert f"[{len(DURATIONS) * PER}/{len(DURATIONS) * PER}] long_0006s_01" in run.stdout  # progress
    return out


def test_videos_have_the_requested_durations(made):
    from lwm.video.reader import read_video

    records = read_jsonl(made / "videos.jsonl")
    assert [r["id"] for r in records] == [f"long_{d:04d}s_{j:02d}" for d in DURATIONS for j in range(PER)]
    assert sorted(p.name for p in (made / "videos").glob("*.mp4")) == sorted(f"{r['id']}.mp4" for r in records)
    for r in records:
        frames, seconds = read_video(made / r["path"], fps=1.0, resolution=64)
        assert frames.shape == (r["duration"], 64, 64, 3) and r["frames"] == r["duration"] and r["fps"] == 1
        np.testing.assert_allclose(seconds, np.arange(r["duration"]), atol=1e-3)
        assert all(e["kind"] == "start" and 0 < e["t"] < r["duration"] for e in r["events"])


def test_qa_rows(made):
    """Video-MME-style rows; each question, listed with its options, is a sample multiple-choice question about
    something true in every part of the video, and its letter points at the right answer."""
    records = {r["path"]: r for r in read_jsonl(made / "videos.jsonl")}
    rows = read_jsonl(made / "qa.jsonl")
    assert {r["video"] for r in rows} == set(records)
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert set(r) == {"video", "id", "duration", "kind", "question", "options", "answer"}
        v = records[r["video"]]
        assert (made / r["video"]).is_file() and r["duration"] == v["duration"] and r["id"].startswith(f"{v['id']}_q")
        texts = [o[3:] for o in r["options"]]
        assert [o[:3] for o in r["options"]] == ["A. ", "B. ", "C. ", "D. "] and len(set(texts)) == 4
        assert r["answer"] in ("A", "B", "C", "D") and set(texts) <= set(language.CHOICES[r["kind"]])
        assert all(t.endswith(".") for t in texts)  # listed as in training: "A. Red." (video_qa/text.py option_text)
        question, right = r["question"], texts["ABCD".index(r["answer"])]
        shapes = {o["shape"]: o for o in v["objects"]}
        if r["kind"] == "count":
            assert question == "How many different shapes are shown in the video?"
            assert right == ["One.", "Two.", "Three."][len(v["objects"]) - 1]
        elif r["kind"] == "color":
            shape = re.fullmatch(r"What color is the (\w+)\?", question).group(1)
            assert right == shapes[shape]["color"].capitalize() + "."
        elif r["kind"] == "motion":
            shape = re.fullmatch(r"How does the (\w+) move\?", question).group(1)
            assert not any(e["object"] == v["objects"].index(shapes[shape]) for e in v["events"])
            assert (
                right
                == {
                    "still": "It does not move.",
                    "left": "Left and right.",
                    "right": "Left and right.",
                    "up": "Up and down.",
                    "down": "Up and down.",
                }[shapes[shape]["motion"]]
            )
        else:
            assert r["kind"] == "digit" and question == "Which digit is shown?" and right == f"{v['digit']}."
    assert {r["kind"] for r in rows} >= {"count", "color"}


def test_shapes_stay_on_screen():
    """Every shape is drawn in its one color in every frame (palette colors are unique within a video)."""
    for j in range(6):
        scene, _ = long_videos.make_video(3, 40, j, fps=1)
        frames = scene_lib.render(scene)  # (40, 64, 64, 3)
        assert frames.shape == (40, 64, 64, 3)
        for o in scene.objects:
            on_screen = (frames == np.array(scene_lib.PALETTE[o.color], np.uint8)).all(-1).any((1, 2))  # (T,)
            assert on_screen.all(), (scene, o)


def test_same_questions_at_every_duration():
    """Video j shows the same shapes and asks the same questions (same options and letters) at every length."""
    for j in range(4):
        asked = [long_videos.make_video(0, d, j, fps=1)[1] for d in (6, 32, 3600)]
        assert asked[0] == asked[1] == asked[2] and asked[0]


def test_deterministic_and_seeded(made, tmp_path):
    from lwm.video.reader import read_video

    again = long_videos.main(_args(tmp_path / "again"))
    other = long_videos.main(_args(tmp_path / "other", seed=1))
    for name in ("qa.jsonl", "videos.jsonl"):
        assert (made / name).read_bytes() == (again / name).read_bytes(), name
        assert (made / name).read_bytes() != (other / name).read_bytes(), name
    for path in sorted((made / "videos").glob("*.mp4")):
        a, b = (read_video(d / "videos" / path.name, fps=1.0, resolution=64)[0] for d in (made, again))
        np.testing.assert_array_equal(a, b)


def test_reruns_skip_and_resume(tmp_path, capsys):
    out = long_videos.main(_args(tmp_path / "lv"))
    videos = sorted((out / "videos").glob("*.mp4"))
    mtimes = {p.name: p.stat().st_mtime_ns for p in videos}
    qa = (out / "qa.jsonl").read_bytes()
    long_videos.main(_args(out))
    assert "is complete" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in videos} == mtimes

    videos[0].unlink()  # as if interrupted: the others are kept, the missing one is made again
    (out / "DONE").unlink()
    long_videos.main(_args(out))
    assert f"{len(videos)} videos ({len(videos) - 1} kept" in capsys.readouterr().out
    kept = {p.name: p.stat().st_mtime_ns for p in videos[1:]}
    assert kept == {name: t for name, t in mtimes.items() if name != videos[0].name}
    assert videos[0].is_file() and (out / "qa.jsonl").read_bytes() == qa

    long_videos.main(_args(out, per=1))  # fewer videos asked for: the rest are removed
    assert sorted(p.name for p in (out / "videos").glob("*.mp4")) == [f"long_{d:04d}s_00.mp4" for d in DURATIONS]
    long_videos.main(_args(out, seed=5, per=1))  # another seed: nothing is kept
    assert "(0 kept" in capsys.readouterr().out


def test_bad_arguments():
    for bad in (["--durations", "0"], ["--durations", "4", "4"], ["--per-duration", "0"], ["--fps", "0"]):
        with pytest.raises(SystemExit):
            long_videos.main(["--out", "/nonexistent/never", *bad])
