"""lwm.eval.t2v's parts that need no model: bad input refused before anything loads (exit 2 naming it), the
scoring of what the checker read, and the sheet of frames. The command itself, after a training run, is
tests/integration/test_t2v_learning.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from lwm.arg_types import from_args
from lwm.eval import t2v
from lwm.eval.scene_check import Reading
from lwm.synth.scene import DIRECTIONS

PROMPT = {"caption": "a red circle moving left", "color": "red", "shape": "circle", "motion": "left"}


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "heldout.jsonl"
    path.write_text(json.dumps(PROMPT) + "\n")
    return path


def refused(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        t2v.main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, line, message",
    [
        ([], None, None),
        (["--frames", "0"], None, "--frames must be >= 1, got 0"),
        (["--samples", "0"], None, "--samples must be >= 1, got 0"),
        (["--cfg-scale", "nan"], None, "cfg_scale must be a finite number"),
        (["--temperature", "-1"], None, "temperature must be >= 0"),
        ([], '{"caption": "a red circle", "color": "red", "shape": "circle"}', "line 1 lacks motion"),
        ([], "not json", "line 1 is not JSON"),
        ([], json.dumps({**PROMPT, "cells": 0}), "line 1: cells must be a whole number >= 1, got 0"),
        ([], "", "holds no prompts"),
    ],
)
def test_bad_input_exits_2_naming_it(tmp_path, prompts, capsys, extra, line, message):
    """Each refused before the model loads (--model is an empty folder: loading it would fail otherwise)."""
    if line is not None:
        prompts.write_text(line + "\n")
    argv = ["--model", str(tmp_path), "--prompts", str(prompts), "--out", str(tmp_path / "out"), *extra]
    if message is None:  # the good arguments pass the checks, and the empty model folder is what fails
        assert t2v.check(from_args(t2v.T2VConfig, t2v.build_parser().parse_args(argv))) == [{**PROMPT, "cells": 1}]
        return
    assert message in refused(capsys, argv)
    assert not (tmp_path / "out").exists()


def test_missing_files_are_named(tmp_path, prompts, capsys):
    err = refused(capsys, ["--model", str(tmp_path / "nope"), "--prompts", str(prompts)])
    assert f"--model {tmp_path / 'nope'} does not exist" in err
    err = refused(capsys, ["--model", str(tmp_path), "--prompts", str(tmp_path / "none.jsonl")])
    assert "--prompts" in err and "does not exist" in err
    err = refused(capsys, ["--model", str(tmp_path), "--prompts", str(prompts), "--vqgan", str(tmp_path / "v.st")])
    assert "--vqgan" in err


def test_scoring_and_rates():
    right = t2v.scored(Reading("red", "circle", "left"), PROMPT)
    assert right == {
        "reading": {"color": "red", "shape": "circle", "motion": "left"},
        "right": dict.fromkeys(t2v.ATTRIBUTES, True),
        "all": True,
    }
    wrong_way = t2v.scored(Reading("red", "circle", "right"), PROMPT)
    assert wrong_way["right"] == {"color": True, "shape": True, "motion": False} and not wrong_way["all"]
    nothing = t2v.scored(None, PROMPT)  # no shape in some frame: every attribute wrong
    assert nothing["reading"] is None and not any(nothing["right"].values())
    failed = {"error": "RuntimeError: out of memory"}
    rates = t2v.rates([{**right, "error": None}, {**wrong_way, "error": None}, failed])
    assert rates == {"color": 1.0, "shape": 1.0, "motion": 0.5, "all": 0.5}  # the failed video is not counted
    assert t2v.rates([failed]) == dict.fromkeys((*t2v.ATTRIBUTES, "all"), None)


def test_the_sheet_holds_each_prompt_generated_then_real(tmp_path):
    generated = np.full((4, 64, 64, 3), 200, np.uint8)
    real = np.zeros((4, 64, 64, 3), np.uint8)
    path = t2v.frames_sheet([("one", generated, real), ("two", generated, real)], tmp_path / "sheet.png")
    sheet = np.asarray(Image.open(path))
    assert sheet.shape == (2 * (64 + 14), 8 * 64 + 12, 3)
    assert (sheet[14:78, :256] == 200).all() and (sheet[14:78, 256 + 12 :] == 0).all()
    assert (sheet[14:78, 256 : 256 + 12] == 255).all()  # the gap between generated and real


def test_codes_kept_by_the_move():
    rng = np.random.default_rng(0)
    first = rng.integers(0, 8192, (16, 16))
    for motion, (dx, dy) in DIRECTIONS.items():
        clip = np.stack([np.roll(first, (t * dy, t * dx), axis=(0, 1)) for t in range(4)]).reshape(4, 256)
        assert t2v.shift_kept(clip, motion) == 1.0  # codes that move with the shape
        other = "right" if motion == "left" else "left"
        assert t2v.shift_kept(clip, other) < 0.01  # moved the other way, random codes rarely agree
    moved = np.stack([first, np.roll(first, -1, axis=1)]).reshape(2, 256)
    moved[1, :64] = (moved[1, :64] + 1) % 8192  # a quarter of the second frame's codes changed
    assert t2v.shift_kept(moved, "left") == 0.75
    assert t2v.shift_kept(first.reshape(1, 256), "left") is None  # one frame: nothing moved
    two = np.stack([np.roll(first, 2 * t, axis=1) for t in range(4)]).reshape(4, 256)  # two cells a frame, right
    assert t2v.shift_kept(two, "right", cells=2) == 1.0 and t2v.shift_kept(two, "right") < 0.01
