"""lwm/eval/video_qa/ (the package): reading plain and Video-MME items, duration buckets,
answer normalization, scoring with stub generators (an oracle gets 100%), bad items recorded while
good ones are scored, and the command line end to end on a random-weight debug model (one process
and torchrun with 2).

Longer than most test files: one subject's tests kept together, beside the helpers they share.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from char_tokenizer import Tok  # the tests' helper: tests/char_tokenizer.py
from tables import squeeze
from train_runs import forked_command
from video_qa_stubs import Oracle, StubSource, mc_items, write_jsonl
from video_samples import write_video  # noqa: E402

from lwm.data.chat import chat_prompt  # noqa: E402
from lwm.eval import video_qa as vqa  # noqa: E402
from lwm.eval.video_qa.files import read_items  # noqa: E402
from lwm.eval.video_qa.items import ItemError, answer_index, parse_options  # noqa: E402
from lwm.eval.video_qa.report import markdown  # noqa: E402
from lwm.eval.video_qa.summary import Buckets  # noqa: E402
from lwm.eval.video_qa.text import (  # noqa: E402
    bare_question,
    first_letter,
    letter_question,
    normalize,
)
from lwm.paths import REPO  # noqa: E402

ROOT = REPO
from lwm.eval.video_qa.videos import VideoSource  # noqa: E402

SPM = ROOT / "data" / "sample" / "tokenizer.model"
VQGAN = ROOT / "data" / "checkpoints" / "vqgan_tiny.safetensors"


def test_read_plain_and_videomme(tmp_path):
    data = write_jsonl(
        tmp_path / "qa.jsonl",
        [
            {
                "video": "clips/a.mp4",
                "question": "What color is the circle?",
                "options": ["Red", "Cyan.", "Green", "White"],
                "answer": "cyan",
                "duration": 95,
            },
            {
                "id": "q-open",
                "video": "/abs/b.mp4",
                "question": "How does it move?",
                "answer": "Up and down.",
                "duration": "900",
            },
            {
                "videoID": "fFjv93ACGo8",
                "question_id": "001-1",
                "question": "Which?",
                "duration": "long",
                "options": ["A. Apples.", "B. Pears.", "C. Plums.", "D. Figs."],
                "answer": "C",
            },
            {
                "video_id": "002",
                "videoID": "xyz",
                "duration": "short",
                "questions": [
                    {
                        "question_id": "002-1",
                        "question": "One?",
                        "options": ["A. x", "B. y", "C. z", "D. w"],
                        "answer": "B",
                    },
                    {
                        "question_id": "002-2",
                        "question": "Two?",
                        "options": ["A. x", "B. y", "C. z", "D. w"],
                        "answer": "E",
                    },
                    {"question_id": "002-3", "question": "Three?", "options": ["A. x", "B. y"], "answer": "B"},
                ],
            },
            "{not json",
            {"video": "c.mp4", "answer": "Yes."},
            {"video": "c.mp4", "question": "Q?", "options": ["Red", "Blue"], "answer": "Green"},
            {"question": "Q?", "answer": "Yes."},
            {"video": "c.mp4", "question": "Q?", "answer": "Yes.", "duration": -3},
            [1, 2],
        ],
    )
    items = read_items(data, video_dir=tmp_path / "vids")
    by_id = {it.id: it for it in items}
    assert len(items) == 12

    a = items[0]
    assert a.id == "qa.jsonl:1" and a.error is None
    assert a.video == str(tmp_path / "clips" / "a.mp4") and a.video_key is None
    assert a.options == ["Red", "Cyan.", "Green", "White"] and a.answer_index == 1 and a.duration == 95.0
    b = by_id["q-open"]
    assert b.options is None and b.video == "/abs/b.mp4" and b.duration == 900.0
    m = by_id["001-1"]
    assert m.options == ["Apples.", "Pears.", "Plums.", "Figs."] and m.answer_index == 2 and m.duration == "long"
    assert m.video_key == "fFjv93ACGo8" and m.video == str(tmp_path / "vids" / "fFjv93ACGo8.mp4")
    assert by_id["002-1"].answer_index == 1 and by_id["002-1"].duration == "short" and by_id["002-1"].video_key == "xyz"
    assert by_id["002-2"].error_kind == "answer" and "'E' is not an option letter A-D" in by_id["002-2"].error
    # A video with its questions is Video-MME's form: 4 options each; another count is a bad row that keeps its fields
    assert by_id["002-3"].error_kind == "options" and "4 options, got 2" in by_id["002-3"].error
    assert by_id["002-3"].benchmark == "videomme" and by_id["002-3"].groups == {"duration": "short"}

    errors = [(it.id, it.error_kind, it.error) for it in items[6:]]
    assert errors[0][:2] == ("qa.jsonl:5", "malformed") and "not JSON" in errors[0][2]
    assert errors[1][1] == "malformed" and "'question'" in errors[1][2]
    assert errors[2][1] == "answer" and "'Green' is not among the options (A. Red, B. Blue)" in errors[2][2]
    assert errors[3][1] == "malformed" and "no video" in errors[3][2]
    assert errors[4][1] == "malformed" and "duration" in errors[4][2]
    assert errors[5][1] == "malformed" and "JSON object" in errors[5][2]

    # A .json file holding a list; without --video-dir a videoID is only a key for cached codes.
    lst = tmp_path / "mme.json"
    lst.write_text(json.dumps([{"videoID": "v1", "question": "Q?", "options": ["A. a", "B. b"], "answer": "A"}]))
    (only,) = read_items(lst)
    assert only.video is None and only.video_key == "v1" and only.answer_index == 0


def test_options_and_answers():
    assert parse_options({"A": "Red", "B": "Blue"}) == ["Red", "Blue"]
    assert parse_options(["(A) Red", "(B) Blue"]) == ["Red", "Blue"]
    assert parse_options(["A. Red", "C. Blue"]) == ["A. Red", "C. Blue"]  # not A, B, ...: kept as text
    for bad in (["Red"], ["Red", ""], ["Red", "red."], "Red, Blue", {"A": "x", "C": "y"}):
        with pytest.raises(ItemError):
            parse_options(bad)
    opts = ["Red.", "Cyan.", "Green.", "White."]
    assert [answer_index(a, opts) for a in ("Cyan.", "the cyan", "B", "b. cyan", "(C)", "D.")] == [1, 1, 1, 1, 2, 3]
    with pytest.raises(ItemError, match="not among"):
        answer_index("E", opts)
    # The letter prompt is the training form of a multiple-choice question.
    assert letter_question("What color is the circle?", ["Red", "Cyan.", "Green", "White"]) == (
        "What color is the circle? A. Red. B. Cyan. C. Green. D. White. Answer with the letter."
    )
    # one home (lwm.data.choices): the synthetic data's questions are written by the same function
    from lwm.synth.language import QA, multiple_choice

    mc = multiple_choice(QA("What color is the circle?", "Red.", "color"), np.random.default_rng(0))
    assert mc.question == letter_question("What color is the circle?", [o[3:] for o in mc.options])
    with pytest.raises(ValueError, match="27 options: at most 26 have letters"):
        letter_question("?", ["x"] * 27)
    assert first_letter("B.", 4) == 1
    assert first_letter("Answer: C", 4) == 2
    assert first_letter("(D) white", 4) == 3
    assert first_letter("E. none", 4) is None and first_letter("", 4) is None and first_letter("bad", 4) is None


def test_sample_choice_rows_and_tasks(tmp_path):
    """The sample data's multiple-choice rows hold the question in the letter form already: the bare
    question is recovered (for LL, and so that the letter prompt does not list the options twice)."""
    from lwm.data.vocab import Vocab

    row = {
        "vision": "clip_0000",
        "kind": "color",
        "answer": "B.",
        "options": ["A. Yellow.", "B. White.", "C. Magenta.", "D. Orange."],
        "question": "What color is the triangle? A. Yellow. B. White. C. Magenta. D. Orange. Answer with the letter.",
    }
    mme = {
        "videoID": "v",
        "task_type": "Counting Problem",
        "question": "How many?",
        "options": ["A. 1", "B. 2"],
        "answer": "B",
    }
    items = read_items(write_jsonl(tmp_path / "qa.jsonl", [row, mme, {**row, "kind": "motion"}]), video_dir=tmp_path)
    assert (
        items[0].question == "What color is the triangle?" and items[0].answer_index == 1 and items[0].task == "color"
    )
    assert letter_question(items[0].question, items[0].options) == row["question"]
    assert items[0].video == str(tmp_path / "clip_0000.mp4") and items[0].video_key == "clip_0000"
    assert items[1].task == "Counting Problem" and items[1].question == "How many?"
    assert bare_question("Is it red? Answer with the letter.", ["Yes", "No"]) == "Is it red? Answer with the letter."

    tok = Tok()
    gen = Oracle(tok, items[:2])
    result = vqa.run_video_qa(gen, tok, Vocab(Tok.vocab_size), items, StubSource(), progress=False)
    assert result["summary"]["all"]["accuracy_letter"] == 1.0
    assert list(result["summary"]["tasks"]) == ["Counting Problem", "color", "motion"]
    assert result["summary"]["tasks"]["color"]["n"] == 1 and result["records"][2]["task"] == "motion"
    md = squeeze(markdown(result))
    assert "By task:" in md and "| Counting Problem | 1 | 100.0% | 100.0% | 50.0% | 0 |" in md


def test_normalize():
    assert normalize("  The Cyan   circle! ") == "cyan circle"
    assert normalize("Up and down.") == normalize("up and down") == "up and down"
    assert normalize("An apple, a pear") == "apple pear"
    assert normalize("Up-and-down") == "up and down"
    assert normalize("Theory.") == "theory"  # only whole-word articles go
    assert normalize("Two.") != normalize("Three.")


def test_buckets():
    b = Buckets()
    assert b.names == ("short", "medium", "long")
    assert [b.of(d) for d in (0.0, 119.9, 120.0, 899.0, 900.0, 4000.0)] == [
        "short",
        "short",
        "medium",
        "medium",
        "long",
        "long",
    ]
    assert b.of("medium") == "medium" and b.of("Long-ish") == "Long-ish" and b.of(None) == "unknown"
    assert b.order(["unknown", "long", "x", "short"]) == ["short", "long", "x", "unknown"]
    c = Buckets((10, 60, 600))
    assert c.names == ("<10s", "10-60s", "60-600s", ">=600s") and c.of(60) == "60-600s"
    assert Buckets((30,), ("clip", "film")).of(31) == "film"
    for edges, names in (((), None), ((60, 10), None), ((0,), None), ((10,), ("a", "b", "c")), ((10,), ("a", "a"))):
        with pytest.raises(ValueError):
            Buckets(edges, names)


# ------------------------------------------------------------------------------------ scoring with stubs


def test_oracle_scores_gets_everything_right(tmp_path):
    from lwm.data.vocab import Vocab

    tok, vocab = Tok(), Vocab(Tok.vocab_size)
    items = mc_items(tmp_path)
    gen = Oracle(tok, items)
    seen = []
    result = vqa.run_video_qa(gen, tok, vocab, items, StubSource(), on_record=seen.append, progress=False)
    s = result["summary"]
    assert result["complete"] and len(seen) == 4 and s["errors"]["total"] == 0
    assert s["all"]["accuracy_ll"] == 1.0 and s["all"]["accuracy_letter"] == 1.0 and s["all"]["mc"] == 4
    assert s["all"]["chance"] == pytest.approx((1 / 4 + 1 / 3 + 1 / 4 + 1 / 2) / 4)
    assert list(s["buckets"]) == ["short", "medium", "long"]
    assert [s["buckets"][b]["n"] for b in ("short", "medium", "long")] == [1, 1, 2]
    r = result["records"][1]
    assert r["ll"]["predicted"] == "C" and r["letter"]["predicted"] == "C" and r["letter"]["output"] == "C."
    assert r["prompt_tokens"] == len(chat_prompt(tok, vocab, "Which shape?", np.zeros((2, 256), np.int64)))
    assert r["letter"]["prompt_tokens"] > r["prompt_tokens"] and r["frames"] == 2 and r["codes_from"] == "stub"
    assert len(r["ll"]["scores"]) == 3 and r["correct"] is True and r["error"] is None
    assert gen.calls.count(("generate", "text")) == 4 and ("score", 3) in gen.calls

    as_dicts = [
        {"video": "a.mp4", "question": "Which shape?", "options": ["circle", "square"], "answer": "square"},
        {"videoID": "v", "questions": [{"question": "How many?", "options": ["One", "Two"], "answer": "A"}]},
    ]
    res = vqa.run_video_qa(
        Oracle(tok, read_items(write_jsonl(tmp_path / "d.jsonl", as_dicts))),
        tok,
        vocab,
        as_dicts,
        StubSource(),
        progress=False,
    )
    assert [r["ll"]["predicted"] for r in res["records"]] == ["B", "A"] and res["summary"]["all"]["accuracy_ll"] == 1.0

    wrong = vqa.run_video_qa(Oracle(tok, items, wrong=True), tok, vocab, items, StubSource(), progress=False)["summary"]
    assert wrong["all"]["accuracy_ll"] == 0.0 and wrong["all"]["accuracy_letter"] == 0.25  # "A." is right once

    only_letter = vqa.run_video_qa(
        Oracle(tok, items), tok, vocab, items, StubSource(), methods=("letter",), progress=False
    )
    assert (
        only_letter["summary"]["all"]["accuracy_ll"] is None and only_letter["summary"]["all"]["accuracy_letter"] == 1.0
    )
    assert "accuracy (LL)" not in markdown({**only_letter, "config": {"methods": ["letter"]}})


def test_open_answers_exact_match(tmp_path):
    from lwm.data.vocab import Vocab

    tok = Tok()
    items = read_items(
        write_jsonl(
            tmp_path / "o.jsonl",
            [
                {"video": "a.mp4", "question": "How does the triangle move?", "answer": "Up and down."},
                {"video": "a.mp4", "question": "What color?", "answer": "The white one"},
            ],
        )
    )
    res = vqa.run_video_qa(Oracle(tok, items), tok, Vocab(131), items, StubSource(), progress=False)
    assert res["summary"]["all"]["exact_match"] == 1.0 and res["summary"]["all"]["chance"] is None
    assert res["records"][0]["open"]["output"] == "UP AND DOWN.!"
    assert res["records"][0]["duration"] == 42.0 and res["records"][0]["bucket"] == "short"  # from the video
    res = vqa.run_video_qa(Oracle(tok, items, wrong=True), tok, Vocab(131), items, StubSource(), progress=False)
    assert res["summary"]["all"]["exact_match"] == 0.0


def _code_store(root: Path, ids: list[str], high: int = 8192) -> Path:
    """An lwm-tokenize folder of 6-frame videos, each file's sha256 in the manifest as lwm-tokenize writes it."""
    from lwm.data.code_cache import save_codes

    (root / "tokens").mkdir(parents=True)
    rng = np.random.default_rng(0)
    with open(root / "manifest.jsonl", "w") as f:
        for vid in ids:
            with open(root / "tokens" / f"{vid}.npy", "wb") as t:
                sha256 = save_codes(t, rng.integers(0, high, (6, 256)).astype(np.uint16))
            stamps = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
            f.write(json.dumps({"id": vid, "timestamps": stamps, "video": {"duration": 3.0}, "sha256": sha256}) + "\n")
    return root


def test_changed_or_out_of_range_cached_codes_are_recorded_naming_the_file(tmp_path):
    """A codes file changed after lwm-tokenize wrote it was evaluated with no message, and codes outside the
    vocabulary were the "model"'s error naming no file: each is now the item's "codes" error naming the
    file, and the run goes on."""
    from lwm.data.vocab import Vocab

    codes = _code_store(tmp_path / "codes", ["good", "changed"])
    _code_store(tmp_path / "wide", ["wide"], high=9000)  # a VQGAN with more codes than the vocabulary
    (codes / "tokens" / "wide.npy").write_bytes((tmp_path / "wide" / "tokens" / "wide.npy").read_bytes())
    with open(codes / "manifest.jsonl", "a") as f:
        f.write((tmp_path / "wide" / "manifest.jsonl").read_text())
    changed = codes / "tokens" / "changed.npy"
    data = bytearray(changed.read_bytes())
    data[-7] ^= 0x04  # a whole .npy still, its codes in range
    changed.write_bytes(bytes(data))
    rows = [
        {"videoID": v, "question": f"Q {v}?", "options": ["Red", "Blue"], "answer": "A"}
        for v in ("good", "changed", "wide")
    ]
    items = read_items(write_jsonl(tmp_path / "qa.jsonl", rows))
    tok, vocab = Tok(), Vocab(Tok.vocab_size)
    source = VideoSource(codes, VQGAN, fps=2.0, max_frames=4, n_codes=vocab.n_vision_codes)
    recs = {
        r["video"]: r
        for r in vqa.run_video_qa(Oracle(tok, items), tok, vocab, items, source, progress=False)["records"]
    }
    assert recs["good"]["error"] is None and recs["good"]["correct"]
    assert (
        recs["changed"]["error_kind"] == "codes"
        and f"cached codes {changed} are not the file" in recs["changed"]["error"]
    )
    wide = codes / "tokens" / "wide.npy"
    assert recs["wide"]["error_kind"] == "codes" and f"cached codes {wide} hold codes in [" in recs["wide"]["error"]


def test_bad_items_recorded_good_ones_scored(tmp_path):
    """Missing video, unreadable file, answer not among the options, malformed line, a video that fails to
    load: each recorded with its reason; the cached and on-the-fly videos are scored."""
    from lwm.data.vocab import Vocab
    from lwm.video.tokenize import video_id

    vids = tmp_path / "videos"
    vids.mkdir()
    write_video(vids / "fresh.mp4", width=64, height=64, frames=30, fps=10)
    (vids / "garbage.mp4").write_bytes(b"this is not a video" * 10)
    cached = vids / "cached.mp4"  # not on disk: only its codes are
    codes = _code_store(tmp_path / "codes", [video_id(str(cached), "hashed"), "mme1"])
    opts = ["Red", "Blue"]
    data = write_jsonl(
        tmp_path / "qa.jsonl",
        [
            {"video": "videos/cached.mp4", "question": "Q cached?", "options": opts, "answer": "Red"},
            {"video": "videos/missing.mp4", "question": "Q missing?", "options": opts, "answer": "Red"},
            {"video": "videos/garbage.mp4", "question": "Q garbage?", "options": opts, "answer": "Red"},
            {"video": "videos/fresh.mp4", "question": "Q bad answer?", "options": opts, "answer": "Green"},
            "{oops",
            {"video": "videos/fresh.mp4", "question": "Q fresh?", "options": opts, "answer": "B", "duration": "short"},
            {
                "videoID": "mme1",
                "question": "Q mme?",
                "options": ["A. Red", "B. Blue"],
                "answer": "B",
                "duration": "long",
            },
            {"videoID": "nowhere", "question": "Q nowhere?", "options": opts, "answer": "A"},
        ],
    )
    items = read_items(data)
    tok, vocab = Tok(), Vocab(Tok.vocab_size)
    source = VideoSource(codes, VQGAN, fps=2.0, max_frames=4)
    result = vqa.run_video_qa(Oracle(tok, items), tok, vocab, items, source, progress=False)
    recs = {r["question"] or r["id"]: r for r in result["records"]}
    s = result["summary"]
    assert (
        s["items"] == 8 and s["scored"] == 3 and s["all"]["accuracy_ll"] == 1.0 and s["all"]["accuracy_letter"] == 1.0
    )
    assert s["errors"] == {
        "total": 5,
        "by_kind": {"video_missing": 2, "video_unreadable": 1, "answer": 1, "malformed": 1},
    }
    assert recs["Q cached?"]["codes_from"] == "cache" and recs["Q cached?"]["frames"] == 4
    assert recs["Q cached?"]["duration"] == 3.0 and recs["Q cached?"]["bucket"] == "short"
    assert (
        recs["Q mme?"]["codes_from"] == "cache"
        and recs["Q mme?"]["cache_id"] == "mme1"
        and recs["Q mme?"]["bucket"] == "long"
    )
    assert recs["Q fresh?"]["codes_from"] == "video" and recs["Q fresh?"]["frames"] == 4  # 3 s at 2 fps, at most 4
    assert recs["Q fresh?"]["prompt_tokens"] == len(chat_prompt(tok, vocab, "Q fresh?", np.zeros((4, 256), np.int64)))
    assert "missing.mp4: no such file" in recs["Q missing?"]["error"]
    assert "garbage.mp4" in recs["Q garbage?"]["error"] and recs["Q garbage?"]["error_kind"] == "video_unreadable"
    assert "'Green' is not among the options" in recs["Q bad answer?"]["error"]
    assert recs["Q nowhere?"]["error_kind"] == "video_missing" and "--video-dir" in recs["Q nowhere?"]["error"]
    assert recs["qa.jsonl:5"]["error_kind"] == "malformed"
    assert all(r["correct"] is None for r in result["records"] if r["error"])
    md = squeeze(markdown(result))
    assert "| **all** | 3 | 100.0% | 100.0% | 50.0% | 5 |" in md and "video_missing 2" in md

    # A model that fails on one prompt: recorded, and the others still scored.
    class Flaky(Oracle):
        def score(self, prompt, continuations):
            if "Q fresh?" in self.tok.decode(prompt):
                raise ValueError("prompt too long")
            return super().score(prompt, continuations)

    result = vqa.run_video_qa(Flaky(tok, items), tok, vocab, items, source, progress=False)
    assert result["summary"]["scored"] == 2 and result["summary"]["errors"]["by_kind"]["model"] == 1


# ------------------------------------------------------------------------------------ command line


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """A random-weight debug model as a Hugging Face folder, 3 tiny videos (one of them also cached), and
    questions: multiple choice in two buckets, an open one, a missing video."""
    from lwm.data.text_tokenizer import TextTokenizer
    from lwm.data.vocab import Vocab
    from lwm.interop.hf import to_hf
    from lwm.model import ModelConfig, Transformer
    from lwm.video.tokenize import video_id

    root = tmp_path_factory.mktemp("vqa")
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug", vocab_size=Vocab(TextTokenizer(SPM).vocab_size).size))
    to_hf(model, root / "hf", tokenizer_model=SPM)
    (root / "videos").mkdir()
    for i in range(3):
        write_video(root / "videos" / f"clip{i}.mp4", width=64, height=64, frames=20 + 10 * i, fps=10)
    codes = _code_store(root / "codes", [video_id(str(root / "videos" / "clip2.mp4"), "stem")])
    opts = ["Red.", "Cyan.", "Green.", "White."]
    data = write_jsonl(
        root / "qa.jsonl",
        [
            {
                "id": "c0",
                "video": "videos/clip0.mp4",
                "question": "What color is the circle?",
                "options": opts,
                "answer": "Cyan.",
                "duration": 20,
            },
            {
                "id": "c1",
                "video": "videos/clip1.mp4",
                "question": "What color is the square?",
                "options": opts,
                "answer": "D",
                "duration": 1000,
            },
            {"id": "c2", "video": "videos/clip2.mp4", "question": "How many shapes are shown?", "answer": "Two."},
            {"id": "gone", "video": "videos/nope.mp4", "question": "What color?", "options": opts, "answer": "Red."},
        ],
    )
    return {"root": root, "hf": root / "hf", "data": data, "codes": codes}


def _args(e2e, out, *extra):
    return [
        "--model",
        str(e2e["hf"]),
        "--data",
        str(e2e["data"]),
        "--codes",
        str(e2e["codes"]),
        "--vqgan",
        str(VQGAN),
        "--out",
        str(out),
        "--no-progress",
        "--letter-tokens",
        "4",
        "--max-new-tokens",
        "6",
        *extra,
    ]


def test_cli_end_to_end(e2e, tmp_path, capsys):
    out = tmp_path / "out"
    assert vqa.main(_args(e2e, out)) == 1  # one item has no video
    result = json.loads((out / "video_qa.json").read_text())
    md = squeeze((out / "video_qa.md").read_text())
    lines = (out / "video_qa.records.jsonl").read_text().splitlines()
    assert len(lines) == 4 and [json.loads(x)["id"] for x in lines] == ["c0", "c1", "c2", "gone"]
    s, recs = result["summary"], {r["id"]: r for r in result["records"]}
    assert result["complete"] and result["config"]["fps"] == 1.0 and result["config"]["world_size"] == 1
    assert s["items"] == 4 and s["scored"] == 3 and s["errors"] == {"total": 1, "by_kind": {"video_missing": 1}}
    assert recs["c0"]["bucket"] == "short" and recs["c1"]["bucket"] == "long" and recs["c0"]["codes_from"] == "video"
    assert recs["c0"]["frames"] == 2 and recs["c1"]["frames"] == 3  # 2 s and 3 s at 1 fps
    assert recs["c0"]["prompt_tokens"] > 2 * 257 and recs["c1"]["prompt_tokens"] > 3 * 257
    assert (
        recs["c2"]["codes_from"] == "cache" and recs["c2"]["frames"] == 3 and recs["c2"]["bucket"] == "short"
    )  # 6 at 2/s -> 1 fps
    assert isinstance(recs["c2"]["open"]["output"], str)
    for r in (recs["c0"], recs["c1"]):
        assert len(r["ll"]["scores"]) == 4 and all(x < 0 for x in r["ll"]["scores"])
        assert r["ll"]["predicted"] in "ABCD" and r["letter"]["predicted"] in (None, "A", "B", "C", "D")
    assert "| bucket | n | accuracy (LL) | accuracy (letter) | chance | exact match (open) | errors |" in md
    assert "By task:" not in md
    assert "| short | 2 |" in md and "| long | 1 |" in md and "25.0%" in md
    assert "| unknown | 0 | — | — | — | — | 1 |" in md  # the missing video has no duration
    assert "video_qa.md" in capsys.readouterr().out


def test_run_takes_the_config_the_command_line_gives(e2e, tmp_path, capsys):
    """run(VideoQAConfig) in-process, the config built in code, writes what main writes for the same options."""
    from lwm.arg_types import from_args
    from lwm.eval.video_qa.cli import UsageError, VideoQAConfig, build_parser, run
    from lwm.infer.runtime import ModelOptions

    a, b = tmp_path / "a", tmp_path / "b"
    parsed = from_args(VideoQAConfig, build_parser().parse_args(_args(e2e, a, "--limit", "2")))
    config = VideoQAConfig(
        load=ModelOptions(model=str(e2e["hf"])), data=str(e2e["data"]), codes=str(e2e["codes"]), vqgan=str(VQGAN),
        out=str(b), progress=False, letter_tokens=4, max_new_tokens=6, limit=2,
    )  # fmt: skip
    assert parsed == VideoQAConfig(**{**vars(config), "out": str(a), "load": parsed.load})
    assert vqa.main(_args(e2e, a, "--limit", "2")) == 0 and run(config) == 0
    one, two = (json.loads((d / "video_qa.json").read_text()) for d in (a, b))
    assert [r.pop("seconds", None) for r in (one["config"], two["config"])] and one["records"] == two["records"]
    with pytest.raises(UsageError, match="--data .*: no such file"):
        run(VideoQAConfig(load=config.load, data=str(tmp_path / "none.jsonl")))


def test_cli_usage_errors(e2e, tmp_path, capsys):
    for args, message in (
        (["--model", str(tmp_path / "none"), "--data", str(e2e["data"])], "--model"),
        (["--model", str(e2e["hf"]), "--data", str(tmp_path / "none.jsonl")], "--data"),
        (["--model", str(e2e["hf"]), "--data", str(e2e["data"]), "--methods", "ll,vibes"], "--methods"),
        (["--model", str(e2e["hf"]), "--data", str(e2e["data"]), "--bucket-edges", "900,120"], "bucket"),
        (["--model", str(e2e["hf"]), "--data", str(e2e["data"]), "--fps", "0"], "--fps"),
    ):
        with pytest.raises(SystemExit) as exc:
            vqa.main(args + ["--out", str(tmp_path / "o")])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
    mme = write_jsonl(tmp_path / "mme.jsonl", [{"videoID": "v", "question": "Q?", "answer": "A"}])
    with pytest.raises(SystemExit) as exc:
        vqa.main(["--model", str(e2e["hf"]), "--data", str(mme)])
    assert exc.value.code == 2 and "--video-dir" in capsys.readouterr().err


def test_torchrun_two_ranks_match_one(e2e, tmp_path):
    """Context parallelism over the 2 CPU ranks torchrun starts (forked, under the NCCL contract): the same
    predictions and scores as one process; only rank 0 writes."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert vqa.main(_args(e2e, one, "--limit", "2")) == 0
    proc = forked_command("lwm.eval.video_qa", _args(e2e, two, "--limit", "2"), 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = json.loads((one / "video_qa.json").read_text())
    b = json.loads((two / "video_qa.json").read_text())
    assert b["config"]["world_size"] == 2 and proc.stdout.count("wrote ") == 1
    for ra, rb in zip(a["records"], b["records"]):
        assert rb["prompt_tokens"] == ra["prompt_tokens"] and rb["letter"]["output"] == ra["letter"]["output"]
        torch.testing.assert_close(rb["ll"]["scores"], ra["ll"]["scores"], rtol=1e-4, atol=1e-4)


def test_usage_names_the_command_as_it_is_run():
    from lwm.eval.video_qa.cli import build_parser

    assert build_parser().format_usage().startswith("usage: python -m lwm.eval.video_qa ")


def test_an_items_image_is_a_one_frame_video(tmp_path):
    """A QA item whose file is an image: its codes are one frame, the tiny VQGAN's encoding of the picture as
    lwm-tokenize makes it, with no duration to record."""
    from PIL import Image

    from lwm.eval.video_qa.items import Item
    from lwm.eval.video_qa.videos import VideoSource
    from lwm.interop.vqgan_sources import load_vqgan
    from lwm.paths import TINY_VQGAN
    from lwm.video.image import encode_image

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 64, 3), dtype=np.uint8)).save(tmp_path / "p.jpg")
    codes, info = VideoSource(None, TINY_VQGAN).load(Item(id="q1", video=str(tmp_path / "p.jpg"), video_key="p"))
    want = encode_image(tmp_path / "p.jpg", load_vqgan(TINY_VQGAN, preset="tiny"))[0]
    np.testing.assert_array_equal(codes, want)
    assert info["frames"] == 1 and info["codes_from"] == "video" and info["timestamps"].tolist() == [0.0]
