"""The benchmarks as released, read by lwm.eval.video_qa without conversion and scored by their own rules:
Video-MME (the Hugging Face parquet with its columns and types, the GitHub JSON), LongVideoBench
(lvb_val.json with option0..option4 and "N/A", its parquet, its JSON subtitles), MLVU (a task's JSON and
the json/ folder). Small generated videos, laid out as each release lays them out; the model is a stub
that answers each question as told, so the numbers are known. Video-MME's result file is scored by a
re-implementation of its scorer's published rules (`videomme_scorer`, written here from the rules) and
must agree with the harness's own table. Also: the answer-matching defects, an unknown format refused
before any model loads, bad rows recorded with their metadata.

Longer than most test files: one subject's tests kept together, beside the helpers they share.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from char_tokenizer import Tok  # the character tokenizer the stubs read prompts back with
from tables import squeeze
from video_samples import write_video

from lwm.data.vocab import Vocab
from lwm.eval import video_qa as vqa
from lwm.eval.video_qa.benchmarks.videomme import results as videomme_results
from lwm.eval.video_qa.files import FormatError, read_items
from lwm.eval.video_qa.items import ItemError, answer_index, parse_options
from lwm.eval.video_qa.report import markdown, write_outputs
from lwm.eval.video_qa.videos import VideoSource
from lwm.paths import REPO

ROOT = REPO
VQGAN = ROOT / "data" / "checkpoints" / "vqgan_tiny.safetensors"


class Scripted:
    """Answers each question with the reply given for it (found by the question's text in the prompt), and
    keeps the prompts it saw."""

    group = None

    def __init__(self, replies: dict[str, str]):
        self.tok, self.replies, self.prompts = Tok(), replies, []

    def _reply(self, text):
        return next(r for q, r in self.replies.items() if q in text)

    def generate(self, prompt, config):
        text = self.tok.decode(prompt)
        self.prompts.append(prompt)
        return self.tok.encode(self._reply(text))

    def score(self, prompt, continuations):
        return [-float(i) for i in range(len(continuations))]


def run(items, replies, source, methods=("ll", "letter")):
    gen = Scripted(replies)
    result = vqa.run_video_qa(gen, gen.tok, Vocab(Tok.vocab_size), items, source, methods=methods, progress=False)
    return result, gen


def source(**kw):
    return VideoSource(None, VQGAN, fps=kw.pop("fps", 1.0), **kw)


# ------------------------------------------------------------------------------------ answer matching


def test_answer_matching_defects():
    """Each of these failed before: a letter answer matched against option texts first (options whose texts
    are letters picked the wrong one), a lowercase letter refused, options differing by an article refused."""
    shuffled = parse_options(["A. C.", "B. A.", "C. B.", "D. D."])
    assert shuffled == ["C.", "A.", "B.", "D."]
    assert answer_index("C", shuffled) == 2 and answer_index("(A)", shuffled) == 0 and answer_index("D.", shuffled) == 3
    assert answer_index("c", ["Red", "Blue", "Green"]) == 2 and answer_index("b.", ["Red", "Blue"]) == 1
    dogs = parse_options(["a dog", "the dog", "two dogs"])
    assert answer_index("the dog", dogs) == 1 and answer_index("A dog", dogs) == 0
    with pytest.raises(ItemError, match="ambiguous"):
        answer_index("dog", dogs)  # only the loosest match finds it, and there it names two options
    with pytest.raises(ItemError, match="not distinct"):
        parse_options(["Red", "red."])
    # MLVU's answers are texts: a candidate that is itself a letter is matched as text
    assert answer_index("B", ["A", "B", "C"], letters=False) == 1 and answer_index("A", ["B", "A"], letters=False) == 1


# ------------------------------------------------------------------------------------ Video-MME

MME_VIDEOS = [  # video_id, videoID, duration, domain, sub_category, extension
    ("001", "yt_short01", "short", "Knowledge", "Humanity & History", ".mp4"),
    ("301", "yt_medium1", "medium", "Film & Television", "Movie & TV Show", ".MP4"),
    ("601", "yt_long_001", "long", "Knowledge", "Astronomy", ".mkv"),
    ("602", "yt_gone_002", "long", "Sports Competition", "Football", ".mp4"),  # no file: missing
]
TASKS = ["Counting Problem", "Object Recognition", "Temporal Reasoning"]
# Replies in the forms models give, with the letter Video-MME's scorer reads from each (None: none).
REPLIES = [
    ("B", "B"),
    ("The best answer is C.", "C"),
    ("Best answer: D", "B"),  # the scorer's phrase list runs "Best answer:" into the next entry: B of "Best"
    ("I am not sure", None),
    ("(A) the first", "A"),
    ("answer: d", None),
    ("The answer is A", "A"),
    ("D. Four.", "D"),
    ("Option C", "C"),
    ("the video shows a person who walks to the left and then stops near the door", None),
    ("A", "A"),
    ("b", None),
]


def mme_rows():
    rows, k = [], 0
    for vid, youtube, duration, domain, sub, _ in MME_VIDEOS:
        for q in range(3):
            answer = "ABCD"[(k * 3) % 4]
            rows.append(
                {
                    "video_id": vid,
                    "duration": duration,
                    "domain": domain,
                    "sub_category": sub,
                    "url": f"https://www.youtube.com/watch?v={youtube}",
                    "videoID": youtube,
                    "question_id": f"{vid}-{q + 1}",
                    "task_type": TASKS[q],
                    "question": f"Question {vid}-{q + 1}: how many?",
                    "options": ["A. One.", "B. Two.", "C. Three.", "D. Four."],
                    "answer": answer,
                }
            )
            k += 1
    return rows


def write_videomme(root: Path) -> Path:
    """Video-MME as downloaded: videomme/test-00000-of-00001.parquet, data/<videoID>.mp4, subtitle/<videoID>.srt."""
    (root / "videomme").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "subtitle").mkdir()
    for _, youtube, *_, ext in MME_VIDEOS[:3]:
        write_video(root / "data" / f"{youtube}{ext}", width=64, height=64, frames=30, fps=10)  # 3 s
    srt = (
        '1\n00:00:00,000 --> 00:00:00,800\n<font color="white" size=".72c">Hello there.</font>\n\n'
        '2\n00:00:01,200 --> 00:00:01,900\n<font color="white" size=".72c">Never on a frame.</font>\n\n'
        '3\n00:00:01,950 --> 00:00:02,500\n<font color="white" size=".72c">Second line,</font>\n'
        '<font color="white" size=".72c">two rows.</font>\n'
    )
    (root / "subtitle" / "yt_short01.srt").write_text(srt)
    schema = pa.schema(
        [(c, pa.string()) for c in ("video_id", "duration", "domain", "sub_category", "url", "videoID")]
        + [(c, pa.string()) for c in ("question_id", "task_type", "question")]
        + [("options", pa.list_(pa.string())), ("answer", pa.string())]
    )
    path = root / "videomme" / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(mme_rows(), schema=schema), path)
    return path


PHRASES = [  # Video-MME's scorer's list of answer phrases, entries as they run together in the published list
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option isThe correct option is",
    "Best answer:Best option:",
]


# The video keys of each form of Video-MME's results file: (duration, domain, sub-category). The template
# its maintainers ask for (evaluation/output_test_template.json) and the last published scorer
# (evaluation/eval_your_results.py) name them differently.
FORMS = {
    "template": ("duration", "domain", "sub_category"),
    "published scorer": ("duration_category", "video_category", "video_subcategory"),
}


def videomme_scorer(results: list[dict], durations: list[str], form: str = "published scorer") -> dict:
    """Video-MME's scoring rules, written from its published description and script, reading the keys of
    `form`: for each chosen duration, its videos (those marked missing skipped), each question's response
    stripped, the phrases deleted, the first capital A-D that remains is the answer; a question with none is
    not answered; accuracy = correct / answered, per duration, video category, video subcategory, task type,
    and over all."""
    duration, domain, sub = FORMS[form]
    tally = defaultdict(lambda: [0, 0])  # (key, value) -> [correct, answered]
    for video in results:
        if video[duration] not in durations or video.get("missing"):
            continue
        for q in video["questions"]:
            s = q["response"].strip()
            for phrase in PHRASES:
                s = s.replace(phrase, "")
            m = re.search("[ABCD]", s)
            if m is None:
                continue
            keys = [("duration", video[duration]), ("domain", video[domain]),
                    ("sub_category", video[sub]), ("task_type", q["task_type"]), ("all", "all")]  # fmt: skip
            for key in keys:
                tally[key][0] += m.group(0) == q["answer"]
                tally[key][1] += 1
    return {k: c / n for k, (c, n) in tally.items() if n}


def test_videomme_parquet_scored_as_its_scorer_does(tmp_path):
    path = write_videomme(tmp_path / "Video-MME")
    data = tmp_path / "Video-MME" / "data"
    items = read_items(path, video_dir=data)
    assert len(items) == 12 and all(it.benchmark == "videomme" for it in items)
    first = items[0]
    assert first.id == "001-1" and first.video == str(data / "yt_short01.mp4") and first.duration == "short"
    assert first.options == ["One.", "Two.", "Three.", "Four."] and first.answer_index == 0
    assert first.groups == {"duration": "short", "domain": "Knowledge", "sub_category": "Humanity & History",
                            "task_type": "Counting Problem"}  # fmt: skip
    assert items[3].video == str(data / "yt_medium1.MP4") and items[6].video == str(data / "yt_long_001.mkv")
    replies = {it.question: reply for it, (reply, _) in zip(items, REPLIES)}
    src = source()
    encodes = []
    encode = src.codes.vqgan().encode
    src.codes.vqgan().encode = lambda *a, **kw: encodes.append(1) or encode(*a, **kw)
    result, gen = run(items, replies, src)
    assert len(encodes) == 3  # a video's 3 questions come together: it is read and encoded once
    s, recs = result["summary"], result["records"]
    assert s["errors"] == {"total": 3, "by_kind": {"video_missing": 3}}
    for rec, (_, letter) in zip(recs, REPLIES):
        if rec["error"] is None:
            assert rec["letter"]["predicted"] == letter, rec["letter"]["output"]
    # The prompt is Video-MME's, in the model's chat form, before the video.
    text = gen.tok.decode(gen.prompts[0])
    assert (
        "USER: Select the best answer to the following multiple-choice question based on the video. Respond with "
        "only the letter (A, B, C, or D) of the correct option.\nQuestion 001-1: how many?\nA. One.\nB. Two.\n"
        "C. Three.\nD. Four.\nThe best answer is:ASSISTANT:" in text
    )
    # The missing video's questions are bad rows that keep their metadata; the run went on.
    gone = [r for r in recs if r["error"]]
    assert {r["meta"]["videoID"] for r in gone} == {"yt_gone_002"} and gone[0]["groups"][
        "domain"
    ] == "Sports Competition"

    mme = s["benchmarks"]["videomme"]
    assert mme["unparsed"] == "skip" and mme["method"] == "accuracy_letter"
    written = write_outputs({**result, "config": {"methods": ["ll", "letter"]}}, tmp_path / "out")
    results = json.loads((tmp_path / "out" / "videomme_results.json").read_text())
    assert written[-1].name == "videomme_results.json" and results == videomme_results(recs)
    assert [v["video_id"] for v in results] == ["001", "301", "601", "602"] and results[3]["missing"] is True
    assert results[0]["questions"][2]["response"] == "Best answer: D" and results[3]["questions"][0]["response"] == ""
    # Both forms of the file in one: the template's keys and the published scorer's, equal values.
    for video in results:
        assert (video["duration"], video["domain"], video["sub_category"]) == (
            video["duration_category"], video["video_category"], video["video_subcategory"])  # fmt: skip
        assert all(q["options"] == q["choices"] and len(q["options"]) == 4 for q in video["questions"])
    # Video-MME's scorer, re-implemented from its rules, gives the harness's numbers, key by key, in either form.
    scored = videomme_scorer(results, ["short", "medium", "long"])
    assert videomme_scorer(results, ["short", "medium", "long"], "template") == scored
    assert scored["all", "all"] == pytest.approx(mme["overall"])
    for key, groups in mme["breakdowns"].items():
        for value, st in groups.items():
            if st["letter_counted"]:
                assert scored[key, value] == pytest.approx(st["accuracy_letter"]), (key, value)
            else:
                assert (key, value) not in scored
    # and the numbers are the ones the replies make: the letter each reply holds for the scorer, against the answer
    expected = {}
    for it, (_, letter) in zip(items[:9], REPLIES):
        if letter is not None:
            expected.setdefault(it.groups["duration"], []).append(letter == it.answer)
    for d, hits in expected.items():
        assert mme["breakdowns"]["duration"][d]["accuracy_letter"] == pytest.approx(np.mean(hits))
    md = markdown({**result, "config": {"methods": ["ll", "letter"]}})
    assert "## Video-MME" in md and "| sub_category | n | counted | accuracy |" in squeeze(md) and "not counted" in md


def test_videomme_github_json_and_subtitles(tmp_path):
    """The GitHub JSON form (videos with questions, `choices`, duration_category, video_sub_category, the
    YouTube id only in the url): read as released; the duration is the category given, not the video's length.
    With subtitles, the lines on screen at the sampled frames come before the question, font tags stripped."""
    root = tmp_path / "Video-MME"
    write_videomme(root)
    videos = []
    for vid, youtube, duration, domain, sub, _ in MME_VIDEOS[:2]:
        questions = [
            {k: r[k] for k in ("question_id", "task_type", "question", "answer")} | {"choices": r["options"]}
            for r in mme_rows()
            if r["video_id"] == vid
        ]
        videos.append({"video_id": vid, "duration_category": duration, "video_category": domain,
                       "video_sub_category": sub, "url": f"https://www.youtube.com/watch?v={youtube}",
                       "questions": questions})  # fmt: skip
    data = tmp_path / "videomme.json"
    data.write_text(json.dumps(videos, indent=2))
    items = read_items(data, video_dir=root / "data", subtitles=root / "subtitle")
    assert len(items) == 6 and items[0].video_key == "yt_short01" and items[0].options[3] == "Four."
    assert items[3].groups["duration"] == "medium" and items[3].groups["sub_category"] == "Movie & TV Show"
    result, gen = run(items, {it.question: "A" for it in items}, source())
    recs = result["records"]
    assert recs[0]["bucket"] == "short" and recs[3]["bucket"] == "medium"  # 3 s long, "medium" as released
    assert recs[0]["frames"] == 3 and recs[0]["subtitle_lines"] == 2  # frames at 0, 1, 2 s: not on 1.2-1.9 s
    text = gen.tok.decode(gen.prompts[0])
    assert (
        "USER: This video's subtitles are listed below:\nHello there.\nSecond line, two rows.\nSelect the best" in text
    )
    no_subs = gen.tok.decode(gen.prompts[3])  # yt_medium1 has no subtitle file
    assert "listed below:\nNo subtitles available\nSelect" in no_subs
    assert "Hello there." in gen.tok.decode(gen.prompts[0]) and "<font" not in text
    assert result["summary"]["benchmarks"]["videomme"]["all"]["n"] == 6


# ------------------------------------------------------------------------------------ LongVideoBench


def lvb_rows():
    base = {"video_id": "vidA", "video_path": "vidA.mp4", "subtitle_path": "vidA_en.json", "duration": 3.0,
            "starting_timestamp_for_subtitles": 10.0, "topic_category": "NP-News-Programs"}  # fmt: skip
    rows = []
    for k, (group, cat, n_opts, choice) in enumerate(
        [(15, "S2E", 5, 4), (15, "T3O", 4, 1), (60, "S2E", 3, 0), (60, "E2O", 2, 1)]
    ):
        opts = [f"choice {i}" for i in range(n_opts)] + ["N/A"] * (5 - n_opts)
        rows.append({**base, "id": f"q{k}", "question": f"Question {k}?", "correct_choice": choice,
                     "duration_group": group, "question_category": cat, **{f"option{i}": o for i, o in enumerate(opts)}})  # fmt: skip
    rows.append({**base, "id": "q-bad", "question": "Bad?", "correct_choice": 3, "duration_group": 60,
                 "question_category": "T3O", "option0": "x", "option1": "y", "option2": "N/A", "option3": "N/A",
                 "option4": "N/A"})  # fmt: skip
    return rows


def write_lvb(root: Path):
    (root / "videos").mkdir(parents=True)
    (root / "subtitles").mkdir()
    write_video(root / "videos" / "vidA.mp4", width=64, height=64, frames=30, fps=10)
    subs = [
        {"timestamp": [10.0, 10.6], "text": "At the start."},  # middle 0.3 s
        {"timestamp": [11.2, 11.4], "text": "Short, widened."},  # middle 1.3 s, widened to 0.8-1.8: frame 1.0
        {"start": "00:00:12.300", "end": "00:00:12.900", "line": "Between frames only."},  # 2.3-2.9: no frame inside
        {"timestamp": [11.9, 12.6], "text": "Third."},  # middle 2.25 s: after the last frame
        # no end: the loader takes the video's duration (3 s) and subtracts the offset from it too: left out
        {"timestamp": [12.9, None], "text": "To the end."},
    ]
    (root / "subtitles" / "vidA_en.json").write_text(json.dumps(subs))
    (root / "lvb_val.json").write_text(json.dumps(lvb_rows(), indent=2))


def test_longvideobench_json_and_parquet(tmp_path):
    root = tmp_path / "LongVideoBench"
    write_lvb(root)
    items = read_items(root / "lvb_val.json", subtitles=root / "subtitles")
    assert [len(it.options or []) for it in items] == [5, 4, 3, 2, 2]
    assert items[0].video == str(root / "videos" / "vidA.mp4") and items[0].answer_index == 4
    assert items[0].groups == {"duration_group": "15", "question_category": "S2E"}
    bad = items[4]
    assert bad.error_kind == "answer" and "correct_choice 3" in bad.error and bad.meta["video_path"] == "vidA.mp4"
    # The same rows as the Hugging Face parquet, with its types (ints and floats)
    schema = pa.schema([("video_id", pa.string()), ("id", pa.string()), ("video_path", pa.string()),
                        ("subtitle_path", pa.string()), ("correct_choice", pa.int64()), ("question", pa.string())]
                       + [(f"option{i}", pa.string()) for i in range(5)]
                       + [("duration", pa.float64()), ("duration_group", pa.int64()), ("question_category", pa.string()),
                          ("topic_category", pa.string()), ("starting_timestamp_for_subtitles", pa.float64())])  # fmt: skip
    pq.write_table(pa.Table.from_pylist(lvb_rows(), schema=schema), root / "validation-00000-of-00001.parquet")
    again = read_items(root / "validation-00000-of-00001.parquet", subtitles=root / "subtitles")
    assert [(it.id, it.options, it.answer_index, it.groups) for it in again] == [
        (it.id, it.options, it.answer_index, it.groups) for it in items
    ]
    replies = {
        "Question 0?": "E",
        "Question 1?": "The best answer is B",
        "Question 2?": "none of them",
        "Question 3?": "a",
    }
    result, gen = run(items, replies, source())
    recs = result["records"]
    assert [r["letter"]["predicted"] for r in recs[:4]] == ["E", "B", None, None]
    assert recs[2]["letter"]["random"] and recs[2]["letter"]["scored"] in "ABC"  # no letter: a random option
    again_result, _ = run(items, replies, source())
    assert [r["letter"]["scored"] for r in again_result["records"][:4]] == [r["letter"]["scored"] for r in recs[:4]]
    # Interleaved subtitles: after the frames up to each line's middle, only lines a sampled frame falls within.
    text = gen.tok.decode(gen.prompts[0])
    assert "USER: Question: Question 0?\nA. choice 0\nB. choice 1\nC. choice 2\nD. choice 3\nE. choice 4\n" in text
    assert "Answer with the option's letter from the given choices directly." in text
    prompt = np.asarray(gen.prompts[0])
    frames = np.flatnonzero(prompt >= Tok.vocab_size)
    assert len(frames) == 3 * 257 + 2  # 3 frames (257 ids each) and the <vision> </vision> markers
    pieces = Tok().decode(prompt[frames[0] + 1 : frames[-1]])  # text between the markers
    assert pieces == "At the start.\nShort, widened.\nThird.\n" and recs[0]["subtitle_lines"] == 3
    first_code = frames[1]
    assert Tok().decode(prompt[first_code : first_code + 257]) == ""  # frame 0 first, then its line
    assert Tok().decode(prompt[first_code + 257 : first_code + 257 + 14]) == "At the start.\n"
    lvb = result["summary"]["benchmarks"]["longvideobench"]
    assert lvb["unparsed"] == "random" and set(lvb["breakdowns"]) == {"duration_group", "question_category"}
    assert set(lvb["breakdowns"]["duration_group"]) == {"15", "60"} and lvb["all"]["errors"] == 1
    hits = [r["letter"]["correct"] for r in recs[:4]]
    assert lvb["overall"] == pytest.approx(np.mean(hits)) and hits[:2] == [True, True]


# ------------------------------------------------------------------------------------ MLVU


def test_mlvu_task_files_and_folder(tmp_path):
    """MLVU as downloaded: json/<n>_<task>.json, video/<n>_<task>/<video>; answers are texts; the open tasks
    are skipped (GPT-4 scores them); M-Avg is the mean of the tasks' accuracies."""
    root = tmp_path / "MLVU"
    for task in ("1_plotQA", "2_needle"):
        (root / "video" / task).mkdir(parents=True)
    (root / "json").mkdir()
    write_video(root / "video" / "1_plotQA" / "movie1.mp4", width=64, height=64, frames=20, fps=10)
    write_video(root / "video" / "2_needle" / "needle1.mp4", width=64, height=64, frames=20, fps=10)
    plot = [
        {"video": "movie1.mp4", "duration": 246, "question": "What color is the hat?",
         "candidates": ["Yellow", "Red", "Green", "Blue"], "answer": "Red", "question_type": "plotQA"},
        {"video": "movie1.mp4", "duration": 246, "question": "Who enters first?",
         "candidates": ["A", "B", "C"], "answer": "A", "question_type": "plotQA"},
        {"video": "movie1.mp4", "duration": 246, "question": "Which is it?",
         "candidates": ["x", "y"], "answer": "z", "question_type": "plotQA"},
    ]  # fmt: skip
    needle = [
        {"video": "needle1.mp4", "duration": 467.98, "question": "What does the hand do?",
         "candidates": ["Waves", "Points"], "answer": "Points", "question_type": "findNeedle"},
    ]  # fmt: skip
    summary = [
        {"video": "movie1.mp4", "duration": 246, "question": "Summarize.", "answer": "...", "question_type": "summary"}
    ]
    for name, rows in (("1_plotQA", plot), ("2_needle", needle), ("9_summary", summary)):
        (root / "json" / f"{name}.json").write_text(json.dumps(rows, indent=2))
    items = read_items(root / "json")
    assert len(items) == 4 and items[0].video == str(root / "video" / "1_plotQA" / "movie1.mp4")
    assert items[0].answer_index == 1 and items[1].answer_index == 0 and items[3].groups == {"task": "findNeedle"}
    assert items[2].error_kind == "answer" and items[2].groups == {"task": "plotQA"}
    replies = {"hat?": "B) Red", "first?": "(A", "hand do?": "B"}
    result, gen = run(items, replies, source())
    recs = result["records"]
    assert [r["letter"]["predicted"] for r in recs if r["error"] is None] == ["B", None, "B"]
    text = gen.tok.decode(gen.prompts[0])
    assert text.endswith(
        "USER: Carefully watch this video and pay attention to every detail. Based on your observations, select the best "
        "option that accurately addresses the question.\nQuestion: What color is the hat?\nOptions:\n(A) Yellow\n(B) Red\n"
        "(C) Green\n(D) Blue\nOnly give the best option.ASSISTANT: Best option:("
    )
    mlvu = result["summary"]["benchmarks"]["mlvu"]
    assert mlvu["breakdowns"]["task"]["plotQA"]["accuracy_letter"] == 0.5
    assert mlvu["breakdowns"]["task"]["findNeedle"]["accuracy_letter"] == 1.0
    assert mlvu["overall"] == pytest.approx(0.75) and result["summary"]["all"]["accuracy_letter"] == pytest.approx(
        2 / 3
    )


# ------------------------------------------------------------------------------------ the command


def test_unknown_format_refused_before_the_model_loads(tmp_path, capsys):
    """--model is an empty folder: had the data been accepted, loading it would have failed instead."""
    model = tmp_path / "model"
    model.mkdir()
    csv = tmp_path / "qa.csv"
    csv.write_text("video,question,answer\na.mp4,Q?,A\n")
    blob = tmp_path / "test.parquet"
    blob.write_bytes(b"\x00\x01not parquet at all\xff")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"version": 2, "rows": []}))
    binary = tmp_path / "qa.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    for path in (csv, blob, other, binary):
        with pytest.raises(FormatError):
            read_items(path)
        with pytest.raises(SystemExit) as exc:
            vqa.main(["--model", str(model), "--data", str(path), "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and str(path) in err and "Video-MME" in err and "LongVideoBench" in err, err
        assert "MLVU" in err and "JSON lines" in err


def test_a_question_id_given_twice_is_refused_before_any_work(tmp_path, capsys):
    """A Video-MME question_id given twice was scored twice and written twice into the result files. Every
    benchmark's items are read in one place (reader.Reader), which refuses an id given twice, naming it and
    where it appears; the command exits 2 before the model loads (--model is an empty folder)."""
    from lwm.eval.video_qa.items import DuplicateIdError
    from lwm.eval.video_qa.report import RecordLog

    mme = mme_rows()
    mme[4]["question_id"] = mme[2]["question_id"]
    (tmp_path / "mme.json").write_text(json.dumps(mme))
    github = [{"video_id": "001", "url": "https://www.youtube.com/watch?v=x1", "duration_category": "short",
               "questions": [{k: r[k] for k in ("question_id", "task_type", "question", "options", "answer")}
                             for r in mme_rows()[:2]] * 2}]  # fmt: skip
    (tmp_path / "github.json").write_text(json.dumps(github))
    lvb = lvb_rows()
    lvb[3]["id"] = "q1"
    (tmp_path / "lvb_val.json").write_text(json.dumps(lvb))
    (tmp_path / "json").mkdir()
    for name in ("1_plotQA", "2_needle"):
        row = {"question_id": "m1", "video": "v.mp4", "question": "Q?", "candidates": ["x", "y"], "answer": "x"}
        (tmp_path / "json" / f"{name}.json").write_text(json.dumps([row]))
    cases = {
        "mme.json": rf"'{mme[2]['question_id']}' at mme.json:3, mme.json:5",
        "github.json": r"2 question id\(s\) given more than once: '001-1' at github.json:1.1, github.json:1.3; "
        r"'001-2' at github.json:1.2, github.json:1.4",
        "lvb_val.json": "'q1' at lvb_val.json:2, lvb_val.json:4",
        "json": "'m1' at 1_plotQA.json:1, 2_needle.json:1",
    }
    model = tmp_path / "model"
    model.mkdir()
    for name, where in cases.items():
        with pytest.raises(DuplicateIdError, match=where):
            read_items(tmp_path / name)
        with pytest.raises(SystemExit) as exc:
            vqa.main(["--model", str(model), "--data", str(tmp_path / name), "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and re.search(where, err) and "each question must have its own id" in err, err

    # Items handed to the loop directly are checked there too, before any is scored.
    rows = [
        {"id": "same", "video": "a.mp4", "question": f"Q{k}?", "options": ["x", "y"], "answer": "x"} for k in (1, 2)
    ]
    gen = Scripted({})
    with pytest.raises(DuplicateIdError, match="'same' at item 1, item 2"):
        vqa.run_video_qa(gen, gen.tok, Vocab(Tok.vocab_size), rows, source(), progress=False)
    assert gen.prompts == []

    # A rerun into the same --out starts its records afresh: an id already written is not written again.
    log_path = tmp_path / "o" / "video_qa.records.jsonl"
    for _ in range(2):
        log = RecordLog(log_path)
        log({"id": "q0"})
        log.close()
    assert log_path.read_text().count('"q0"') == 1


def test_max_duration_reads_named_durations(tmp_path, capsys):
    """--max-duration with Video-MME's named durations: the file's length decides (from its header)."""
    from lwm.eval.video_qa.cli import VideoQAConfig, validate
    from lwm.infer.runtime import ModelOptions

    path = write_videomme(tmp_path / "Video-MME")
    config = VideoQAConfig(load=ModelOptions(model=str(tmp_path)), data=str(path), max_duration=2.5,
                           video_dir=str(tmp_path / "Video-MME" / "data"), out=str(tmp_path / "o"))  # fmt: skip
    kept = validate(config).items
    assert [it.video_key for it in kept] == ["yt_gone_002"] * 3  # the 3 s videos skipped; a missing one is kept
    assert "skipping 9 items longer than --max-duration 2.5 s" in capsys.readouterr().err


def test_cli_videomme_parquet_end_to_end(tmp_path, capsys):
    """python -m lwm.eval.video_qa on the parquet as downloaded, with its subtitles, on a random-weight debug
    model: the missing video's questions recorded (exit 1), the result file the scorer reads written, and the
    scorer's numbers (re-implemented) the harness's."""
    import torch

    from lwm.data.text_tokenizer import TextTokenizer
    from lwm.interop.hf import to_hf
    from lwm.model import ModelConfig, Transformer

    spm = ROOT / "data" / "sample" / "tokenizer.model"
    torch.manual_seed(0)
    to_hf(Transformer(ModelConfig.from_preset("debug", vocab_size=Vocab(TextTokenizer(spm).vocab_size).size)),
          tmp_path / "hf", tokenizer_model=spm)  # fmt: skip
    root = tmp_path / "Video-MME"
    path = write_videomme(root)
    out = tmp_path / "out"
    args = ["--model", str(tmp_path / "hf"), "--data", str(path), "--video-dir", str(root / "data"),
            "--subtitles", str(root / "subtitle"), "--vqgan", str(VQGAN), "--out", str(out), "--no-progress",
            "--methods", "letter", "--letter-tokens", "3"]  # fmt: skip
    assert vqa.main(args) == 1
    result = json.loads((out / "video_qa.json").read_text())
    mme = result["summary"]["benchmarks"]["videomme"]
    assert result["summary"]["errors"]["by_kind"] == {"video_missing": 3} and mme["all"]["n"] == 9
    assert result["records"][0]["subtitle_lines"] == 2 and result["config"]["subtitles"] == str(root / "subtitle")
    results = json.loads((out / "videomme_results.json").read_text())
    assert len(results) == 4 and sum(len(v["questions"]) for v in results) == 12
    scored = videomme_scorer(results, ["short", "medium", "long"])
    if mme["all"]["letter_counted"]:
        assert scored["all", "all"] == pytest.approx(mme["overall"])
    else:
        assert ("all", "all") not in scored and mme["overall"] is None
    printed = capsys.readouterr().out
    assert "## Video-MME" in printed and "videomme_results.json" in printed
