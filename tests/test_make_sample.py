"""data/make_sample.py: the synthetic sample's files, formats, consistency and determinism."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "make_sample.py"
N = 4
pytest.importorskip("av")  # the generator writes its videos with PyAV


def _load_script():
    spec = importlib.util.spec_from_file_location("make_sample", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # also puts data/ on sys.path, for sample_lib
    return module


make_sample = _load_script()
from sample_lib import scene as scene_lib  # noqa: E402


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """Made through the command line, as users and other scripts do."""
    out = tmp_path_factory.mktemp("sample") / "s"
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--n-videos", str(N)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"{N} videos" in run.stdout
    return out


@pytest.fixture(scope="module")
def again(tmp_path_factory) -> Path:
    return make_sample.main(["--out", str(tmp_path_factory.mktemp("again") / "s"), "--n-videos", str(N)])


@pytest.fixture(scope="module")
def other_seed(tmp_path_factory) -> Path:
    return make_sample.main(["--out", str(tmp_path_factory.mktemp("other") / "s"), "--n-videos", str(N), "--seed", "1"])


def test_files(sample):
    for name in ("videos.jsonl", "captions.jsonl", "qa.jsonl", "text.jsonl", "tokenizer.model", "tokenizer.vocab", "DONE"):
        assert (sample / name).is_file(), name
    assert sorted(p.name for p in (sample / "videos").iterdir()) == [f"clip_{i:04d}.mp4" for i in range(N)]
    assert sorted(p.name for p in (sample / "text").iterdir()) == [f"doc_{i:03d}.txt" for i in range(make_sample.N_DOCS)]


def test_videos_jsonl(sample):
    videos = _jsonl(sample / "videos.jsonl")
    assert [v["id"] for v in videos] == [f"clip_{i:04d}" for i in range(N)]
    for v in videos:
        assert v["path"] == f"videos/{v['id']}.mp4" and (sample / v["path"]).is_file()
        assert v["fps"] == 4 and 8 <= v["duration"] <= 20 and v["frames"] == v["duration"] * v["fps"]
        assert 1 <= len(v["objects"]) <= 3
        assert len({o["shape"] for o in v["objects"]}) == len(v["objects"])  # "the square" is unambiguous
        for o in v["objects"]:
            assert o["shape"] in scene_lib.SHAPES and o["color"] in scene_lib.COLORS and o["final_color"] in scene_lib.COLORS
            assert o["motion"] in scene_lib.MOTIONS
        assert v["digit"] is None or v["digit"] in range(10)
        times = [e["t"] for e in v["events"]]
        assert v["events"] and times == sorted(set(times)) and all(0 < t < v["duration"] for t in times)
        for e in v["events"]:
            o = v["objects"][e["object"]]
            assert e["kind"] in scene_lib.EVENT_KINDS and o["shape"] in e["text"]
            if e["kind"] == "recolor":
                assert e["text"].endswith(f"turns {e['value']}") and o["final_color"] == e["value"]


def test_videos_decode(sample):
    decord = pytest.importorskip("decord")
    for v in _jsonl(sample / "videos.jsonl"):
        reader = decord.VideoReader(str(sample / v["path"]))
        assert len(reader) == v["frames"]
        assert reader.get_avg_fps() == pytest.approx(v["fps"])
        frames = reader.get_batch([0, len(reader) - 1]).asnumpy()
        assert frames.shape == (2, 64, 64, 3) and frames.dtype == np.uint8


def test_captions(sample):
    videos = {v["id"]: v for v in _jsonl(sample / "videos.jsonl")}
    captions = _jsonl(sample / "captions.jsonl")
    assert [c["vision"] for c in captions] == list(videos)
    for c in captions:
        assert c["fields"] == ["[vision],caption", "[caption],vision"]
        v = videos[c["vision"]]
        positions = [c["caption"].find(e["text"]) for e in v["events"]]
        assert all(p >= 0 for p in positions) and positions == sorted(positions)  # events, in order
        if v["digit"] is not None:
            assert str(v["digit"]) in c["caption"]


def test_qa_answers_follow_metadata(sample):
    videos = {v["id"]: v for v in _jsonl(sample / "videos.jsonl")}
    qa = _jsonl(sample / "qa.jsonl")
    assert {r["vision"] for r in qa} == set(videos)
    kinds = set()
    for r in qa:
        assert r["fields"] == "[vision+question],answer" and r["question"].endswith("?") and r["answer"].endswith(".")
        v, q, a = videos[r["vision"]], r["question"], r["answer"]
        shapes = {o["shape"]: o for o in v["objects"]}
        if q == "Which digit is shown?":
            assert a == f"{v['digit']}."
        elif q == "Is a digit shown in the video?":
            assert v["digit"] is None and a == "No."
        elif q.startswith("How many"):
            assert a == ["One.", "Two.", "Three."][len(v["objects"]) - 1]
        elif m := re.fullmatch(r"What color is the (\w+)( at the start| at the end)?\?", q):
            o = shapes[m.group(1)]
            assert a.lower() == (o["final_color"] if m.group(2) == " at the end" else o["color"]) + "."
        elif m := re.fullmatch(r"What happens at (\d+) seconds\?", q):
            (e,) = [e for e in v["events"] if e["t"] == int(m.group(1))]
            assert a.lower() == e["text"] + "."
        elif q.startswith("When does the "):
            (e,) = [e for e in v["events"] if v["objects"][e["object"]]["shape"] in q]
            assert a == f"At {e['t']} seconds."
        elif m := re.fullmatch(r"How does the (\w+) move\?", q):
            motion = shapes[m.group(1)]["motion"]
            assert a == {"still": "It does not move.", "left": "Left and right.", "right": "Left and right.",
                         "up": "Up and down.", "down": "Up and down."}[motion]
        else:
            pytest.fail(f"unexpected question {q!r}")
        kinds.add(q.split()[0] + " " + q.split()[1])
    assert {"How many", "What color", "How does", "What happens", "When does"} <= kinds


def test_text(sample):
    rows = _jsonl(sample / "text.jsonl")
    assert len(rows) == make_sample.N_DOCS
    for i, row in enumerate(rows):
        assert row["fields"] == "text"
        assert row["text"] == (sample / "text" / f"doc_{i:03d}.txt").read_text(encoding="utf-8")
        assert 20_000 <= len(row["text"]) <= 41_000


def test_tokenizer(sample):
    import sentencepiece as spm

    model = sample / "tokenizer.model"
    assert model.stat().st_size < 1_000_000
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert (sp.get_piece_size(), sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (4096, 0, 1, 2, -1)
    assert len((sample / "tokenizer.vocab").read_text(encoding="utf-8").splitlines()) == 4096
    caption = _jsonl(sample / "captions.jsonl")[0]["caption"]
    ids = sp.encode(caption)
    assert sp.decode(ids) == caption and len(ids) < len(caption) / 3  # words of the corpus are whole pieces
    assert sp.decode(sp.encode("Zürich ☃ 12345")) == "Zürich ☃ 12345"  # byte fallback: nothing is unknown


def test_deterministic(sample, again, other_seed):
    decord = pytest.importorskip("decord")
    names = ["videos.jsonl", "captions.jsonl", "qa.jsonl", "text.jsonl", "tokenizer.model", "tokenizer.vocab",
             "text/doc_000.txt"]
    for name in names:
        assert (sample / name).read_bytes() == (again / name).read_bytes(), name
    for name in names:
        assert (sample / name).read_bytes() != (other_seed / name).read_bytes(), name
    for i in range(N):
        a, b = (decord.VideoReader(str(d / "videos" / f"clip_{i:04d}.mp4")) for d in (sample, again))
        np.testing.assert_array_equal(a.get_batch(range(len(a))).asnumpy(), b.get_batch(range(len(b))).asnumpy())


def test_complete_folder_is_kept(again, capsys):
    done = again / "DONE"
    before = (done.stat().st_mtime_ns, (again / "tokenizer.model").stat().st_mtime_ns)
    make_sample.main(["--out", str(again), "--n-videos", str(N)])
    assert "is complete" in capsys.readouterr().out
    assert (done.stat().st_mtime_ns, (again / "tokenizer.model").stat().st_mtime_ns) == before
    assert not make_sample.is_complete(again, seed=0, n_videos=N + 1)  # other arguments: remade


def test_render_follows_events():
    """Each shape's color is on screen exactly while color_at says so (palette colors are unique per video,
    and drawing larger shapes first means none is ever hidden completely)."""
    for i in range(40):
        scene = scene_lib.random_scene(np.random.default_rng([7, i]), f"clip_{i:04d}")
        frames = scene_lib.render(scene)  # (T, 64, 64, 3)
        assert frames.shape == (scene.frames, 64, 64, 3)
        for color in scene_lib.COLORS:
            on_screen = (frames == np.array(scene_lib.PALETTE[color], np.uint8)).all(-1).any((1, 2))  # (T,)
            expected = [any(scene_lib.color_at(scene, k, f / scene_lib.FPS) == color for k in range(len(scene.objects)))
                        for f in range(scene.frames)]
            assert on_screen.tolist() == expected, (scene, color)


def test_start_event_sets_the_shape_moving():
    for i in range(40):
        scene = scene_lib.random_scene(np.random.default_rng([8, i]), "x")
        for e in (e for e in scene.events if e.kind == "start"):
            o = scene.objects[e.object]  # alone, so that no other shape covers part of it
            alone = scene_lib.Scene("x", scene.seconds, scene.background, [o], None, [scene_lib.Event(e.t, e.kind, 0, e.value)])
            mask = (scene_lib.render(alone) == np.array(scene_lib.PALETTE[o.color], np.uint8)).all(-1)  # (T, 64, 64)
            center = np.array([[np.nonzero(m)[1].mean(), np.nonzero(m)[0].mean()] for m in mask])  # (T, 2) x, y
            f = e.t * scene_lib.FPS
            assert (center[: f + 1] == center[0]).all()  # still until the event
            step = center[f + 2] - center[f]
            assert step @ np.array(scene_lib.DIRECTIONS[e.value]) > 0  # then moving the named way
