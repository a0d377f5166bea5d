"""lwm/synth/make_sample.py: the synthetic sample's files, formats, consistency and determinism."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import av  # noqa: F401  (the generator writes its videos with PyAV)
import numpy as np
import pytest
from deps import needs_decord

from lwm.arg_types import from_args
from lwm.io import read_jsonl
from lwm.synth import language, make_sample
from lwm.synth import scene as scene_lib

N = 4


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """Made through the command line, as users and other scripts do."""
    out = tmp_path_factory.mktemp("sample") / "s"
    run = subprocess.run(
        [sys.executable, "-m", "lwm.synth.make_sample", "--out", str(out), "--n-videos", str(N)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert f"{N} videos" in run.stdout
    return out


@pytest.fixture(scope="module")
def again(tmp_path_factory) -> Path:
    """Made from Python with the typed config: the same files as the command line's."""
    return make_sample.run(make_sample.SampleConfig(out=tmp_path_factory.mktemp("again") / "s", n_videos=N))


@pytest.fixture(scope="module")
def other_seed(tmp_path_factory) -> Path:
    return make_sample.main(["--out", str(tmp_path_factory.mktemp("other") / "s"), "--n-videos", str(N), "--seed", "1"])


def test_files(sample):
    for name in (
        "videos.jsonl",
        "captions.jsonl",
        "qa.jsonl",
        "text.jsonl",
        "tokenizer.model",
        "tokenizer.vocab",
        "DONE",
    ):
        assert (sample / name).is_file(), name
    assert sorted(p.name for p in (sample / "videos").iterdir()) == [f"clip_{i:04d}.mp4" for i in range(N)]
    assert sorted(p.name for p in (sample / "text").iterdir()) == [
        f"doc_{i:03d}.txt" for i in range(make_sample.N_DOCS)
    ]


def test_videosread_jsonl(sample):
    videos = read_jsonl(sample / "videos.jsonl")
    assert [v["id"] for v in videos] == [f"clip_{i:04d}" for i in range(N)]
    for v in videos:
        assert v["path"] == f"videos/{v['id']}.mp4" and (sample / v["path"]).is_file()
        assert v["fps"] == 4 and 8 <= v["duration"] <= 20 and v["frames"] == v["duration"] * v["fps"]
        assert 1 <= len(v["objects"]) <= 3
        assert len({o["shape"] for o in v["objects"]}) == len(v["objects"])  # "the square" is unambiguous
        for o in v["objects"]:
            assert (
                o["shape"] in scene_lib.SHAPES
                and o["color"] in scene_lib.COLORS
                and o["final_color"] in scene_lib.COLORS
            )
            assert o["motion"] in scene_lib.MOTIONS
        assert v["digit"] is None or v["digit"] in range(10)
        times = [e["t"] for e in v["events"]]
        assert v["events"] and times == sorted(set(times)) and all(0 < t < v["duration"] for t in times)
        for e in v["events"]:
            o = v["objects"][e["object"]]
            assert e["kind"] in scene_lib.EVENT_KINDS and o["shape"] in e["text"]
            if e["kind"] == "recolor":
                assert e["text"].endswith(f"turns {e['value']}") and o["final_color"] == e["value"]


@needs_decord
def test_videos_decode(sample):
    import decord

    for v in read_jsonl(sample / "videos.jsonl"):
        reader = decord.VideoReader(str(sample / v["path"]))
        assert len(reader) == v["frames"]
        assert reader.get_avg_fps() == pytest.approx(v["fps"])
        frames = reader.get_batch([0, len(reader) - 1]).asnumpy()
        assert frames.shape == (2, 64, 64, 3) and frames.dtype == np.uint8


def test_captions(sample):
    videos = {v["id"]: v for v in read_jsonl(sample / "videos.jsonl")}
    captions = read_jsonl(sample / "captions.jsonl")
    assert [c["vision"] for c in captions] == list(videos)
    for c in captions:
        assert c["fields"] == ["[vision],caption", "[caption],vision"]
        v = videos[c["vision"]]
        positions = [c["caption"].find(e["text"]) for e in v["events"]]
        assert all(p >= 0 for p in positions) and positions == sorted(positions)  # events, in order
        if v["digit"] is not None:
            assert str(v["digit"]) in c["caption"]


def _open_answer(v: dict, q: str) -> str | None:
    """The answer a sample question must have for video record v (None: not a question the sample asks)."""
    shapes = {o["shape"]: o for o in v["objects"]}
    if q == "Which digit is shown?":
        return f"{v['digit']}."
    if q == "Is a digit shown in the video?":
        return "No." if v["digit"] is None else None
    if q == "How many different shapes are shown in the video?":
        return ["One.", "Two.", "Three."][len(v["objects"]) - 1]
    if m := re.fullmatch(r"What color is the (\w+)( at the start| at the end)?\?", q):
        o = shapes[m.group(1)]
        return (o["final_color"] if m.group(2) == " at the end" else o["color"]).capitalize() + "."
    if m := re.fullmatch(r"What happens at (\d+) seconds\?", q):
        (e,) = [e for e in v["events"] if e["t"] == int(m.group(1))]
        return e["text"][0].upper() + e["text"][1:] + "."
    if q.startswith("When does the "):
        (e,) = [e for e in v["events"] if v["objects"][e["object"]]["shape"] in q]
        return f"At {e['t']} seconds."
    if m := re.fullmatch(r"How does the (\w+) move\?", q):
        return {
            "still": "It does not move.",
            "left": "Left and right.",
            "right": "Left and right.",
            "up": "Up and down.",
            "down": "Up and down.",
        }[shapes[m.group(1)]["motion"]]
    return None


def _check_choice(row: dict) -> tuple[str, str]:
    """A multiple-choice row is well formed; returns (the open question, the right option's text)."""
    options, letter = row["options"], row["letter"]
    assert [o[:3] for o in options] == ["A. ", "B. ", "C. ", "D. "] and len({o[3:] for o in options}) == 4, options
    assert letter in "ABCD" and row["answer"] == f"{letter}."
    suffix = " " + " ".join(options) + " Answer with the letter."
    assert row["question"].endswith(suffix), row["question"]
    texts = [o[3:] for o in options]
    assert set(texts) <= set(language.CHOICES[row["kind"]])  # distractors from the same answer set
    return row["question"][: -len(suffix)], texts["ABCD".index(letter)]


def test_qa_answers_follow_metadata(sample):
    from lwm.data.chat import CHAT_SPEC, chat_fields

    videos = {v["id"]: v for v in read_jsonl(sample / "videos.jsonl")}
    qa = read_jsonl(sample / "qa.jsonl")
    assert {r["vision"] for r in qa} == set(videos)
    kinds, choice_kinds = set(), set()
    for k, r in enumerate(qa):
        assert r["fields"] == CHAT_SPEC
        assert {"user": r["user"], "assistant": r["assistant"]} == chat_fields(r["question"])
        assert r["question"].endswith(("?", "Answer with the letter.")) and r["answer"].endswith(".")
        v = videos[r["vision"]]
        if "options" in r:
            question, right = _check_choice(r)
            previous = qa[k - 1]  # the open question it varies
            assert (previous["vision"], previous["question"], previous["answer"], previous["kind"]) == (
                r["vision"],
                question,
                right,
                r["kind"],
            )
            choice_kinds.add(r["kind"])
        else:
            assert _open_answer(v, r["question"]) == r["answer"], r
            assert set(r) == {"vision", "question", "answer", "kind", "user", "assistant", "fields"}
            if r["kind"] in language.CHOICES:  # followed by its multiple-choice variant
                assert qa[k + 1].get("options") and qa[k + 1]["vision"] == r["vision"]
        kinds.add(r["kind"])
    assert {"count", "color", "motion", "event", "when"} <= kinds
    assert {"count", "color", "motion"} <= choice_kinds
    letters = [r["letter"] for r in qa if "letter" in r]
    assert set(letters) == set("ABCD")


def test_chat_rows_encode_to_the_inference_prompt(sample, tmp_path):
    """A qa row's encoding starts with exactly the prompt lwm.data.chat.chat_prompt builds for its question and
    video; then come the answer (the only loss on text) and EOS."""
    from lwm.data.chat import chat_prompt
    from lwm.data.code_cache import CodeStore
    from lwm.data.example import encode_example
    from lwm.data.text_tokenizer import TextTokenizer
    from lwm.data.vocab import Vocab

    tokenizer = TextTokenizer(sample / "tokenizer.model")
    vocab = Vocab(tokenizer.vocab_size)
    (tmp_path / "tokens").mkdir()
    rng = np.random.default_rng(0)
    qa = read_jsonl(sample / "qa.jsonl")
    for video_id in {r["vision"] for r in qa}:
        np.save(tmp_path / "tokens" / f"{video_id}.npy", rng.integers(0, 8192, size=(2, 256), dtype=np.uint16))
    store = CodeStore(tmp_path)
    plain = next(r for r in qa if "options" not in r)
    choice = next(r for r in qa if "options" in r)
    for row in (plain, choice):
        encoded = encode_example(row, vocab, tokenizer, codes=store)
        prompt = chat_prompt(tokenizer, vocab, row["question"], store.load(row["vision"]))
        answer = tokenizer.encode(row["answer"])
        assert encoded.tokens.tolist() == prompt + answer + [tokenizer.eos_id]
        assert not encoded.loss_mask[: len(prompt)].any() and encoded.loss_mask[len(prompt) :].all()
    assert tokenizer.decode(tokenizer.encode(choice["answer"])) == choice["letter"] + "."


def test_multiple_choice_variants():
    """Four distinct options from the kind's answer set; the letter points at the answer; every letter is used."""
    letters = []
    for i in range(40):
        scene = scene_lib.random_scene(np.random.default_rng([9, i]), "x")
        rng = np.random.default_rng([9, i, 1])
        for q in language.questions(scene):
            mc = language.multiple_choice(q, rng)
            if q.kind not in language.CHOICES:
                assert mc is None
                continue
            options = [o[3:] for o in mc.options]
            assert mc.options == [f"{x}. {t}" for x, t in zip("ABCD", options)] and len(set(options)) == 4
            assert set(options) <= set(language.CHOICES[q.kind]) and options["ABCD".index(mc.letter)] == q.answer
            assert mc.question == f"{q.question} {' '.join(mc.options)} Answer with the letter."
            letters.append(mc.letter)
    counts = [letters.count(x) for x in "ABCD"]
    assert min(counts) > len(letters) / 8, counts  # the answer's position is drawn, not fixed


def test_text(sample):
    rows = read_jsonl(sample / "text.jsonl")
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
    caption = read_jsonl(sample / "captions.jsonl")[0]["caption"]
    ids = sp.encode(caption)
    assert sp.decode(ids) == caption and len(ids) < len(caption) / 3  # words of the corpus are whole pieces
    assert sp.decode(sp.encode("Zürich ☃ 12345")) == "Zürich ☃ 12345"  # byte fallback: nothing is unknown


@needs_decord
def test_deterministic(sample, again, other_seed):
    import decord

    names = [
        "videos.jsonl",
        "captions.jsonl",
        "qa.jsonl",
        "text.jsonl",
        "tokenizer.model",
        "tokenizer.vocab",
        "text/doc_000.txt",
    ]
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


def test_ensure_sample_runs_the_config_not_a_command_line(again, monkeypatch, capsys):
    monkeypatch.setattr(make_sample, "main", lambda argv=None: pytest.fail("ensure_sample built an argv"))
    assert make_sample.ensure_sample(again, n_videos=N) == again
    assert "is complete" in capsys.readouterr().out


def test_two_makers_at_once_make_the_sample_once(tmp_path, capsys):
    """Two runs starting together on a fresh clone (train.py and a needle command, say): the second
    waits for the first and finds the sample complete, instead of remaking it under the first."""
    import threading

    out = tmp_path / "s"
    makers = [threading.Thread(target=make_sample.ensure_sample, args=(out,), kwargs={"n_videos": N}) for _ in "ab"]
    for t in makers:
        t.start()
    for t in makers:
        t.join(120)
    said = capsys.readouterr().out
    assert said.count(f"wrote {out}") == 1 and said.count("is complete") == 1, said
    assert make_sample.is_complete(out, seed=0, n_videos=N)


def test_the_parser_is_built_from_the_config():
    parse = make_sample.build_parser().parse_args
    args = ["--out", "x", "--seed", "3", "--n-videos", "2", "--force"]
    assert from_args(make_sample.SampleConfig, parse(args)) == make_sample.SampleConfig(
        out=Path("x"), seed=3, n_videos=2, force=True
    )
    assert from_args(make_sample.SampleConfig, parse([])) == make_sample.SampleConfig()
    with pytest.raises(ValueError, match="--n-videos must be at least 1"):
        make_sample.run(make_sample.SampleConfig(n_videos=0))


def test_render_follows_events():
    """Each shape's color is on screen exactly while color_at says so (palette colors are unique per video,
    and drawing larger shapes first means none is ever hidden completely)."""
    for i in range(40):
        scene = scene_lib.random_scene(np.random.default_rng([7, i]), f"clip_{i:04d}")
        frames = scene_lib.render(scene)  # (T, 64, 64, 3)
        assert frames.shape == (scene.frames, 64, 64, 3)
        for color in scene_lib.COLORS:
            on_screen = (frames == np.array(scene_lib.PALETTE[color], np.uint8)).all(-1).any((1, 2))  # (T,)
            expected = [
                any(scene_lib.color_at(scene, k, f / scene_lib.FPS) == color for k in range(len(scene.objects)))
                for f in range(scene.frames)
            ]
            assert on_screen.tolist() == expected, (scene, color)


def test_start_event_sets_the_shape_moving():
    for i in range(40):
        scene = scene_lib.random_scene(np.random.default_rng([8, i]), "x")
        for e in (e for e in scene.events if e.kind == "start"):
            o = scene.objects[e.object]  # alone, so that no other shape covers part of it
            alone = scene_lib.Scene(
                "x", scene.seconds, scene.background, [o], None, [scene_lib.Event(e.t, e.kind, 0, e.value)]
            )
            mask = (scene_lib.render(alone) == np.array(scene_lib.PALETTE[o.color], np.uint8)).all(-1)  # (T, 64, 64)
            center = np.array([[np.nonzero(m)[1].mean(), np.nonzero(m)[0].mean()] for m in mask])  # (T, 2) x, y
            f = e.t * scene_lib.FPS
            assert (center[: f + 1] == center[0]).all()  # still until the event
            step = center[f + 2] - center[f]
            assert step @ np.array(scene_lib.DIRECTIONS[e.value]) > 0  # then moving the named way
