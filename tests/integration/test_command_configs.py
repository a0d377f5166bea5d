"""Commands as a typed config plus run(config): the needle grid, V-NIAH and make_retrieval build their
parsers from their config dataclasses. Every field is an option with the command's old default, and
a config written back as a command line (what training prints before its evaluation) parses to
itself; run_in_child runs a command's run(config) in a process of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lwm.arg_types import from_args, to_argv
from lwm.child import run_in_child
from lwm.eval import needle, vniah
from lwm.eval.needle import NeedleConfig, NeedleGrid
from lwm.eval.vniah import VniahConfig
from lwm.infer.runtime import ModelOptions
from lwm.parallel.launch import single_process_env
from lwm.synth import make_retrieval
from lwm.synth.make_retrieval import RetrievalConfig

MODEL = ModelOptions(model="m", tokenizer="t.model", device="cpu", dtype="float32", layout="zigzag", prefill_chunk=64)

# every field away from its default
NEEDLE = NeedleConfig(
    model=MODEL,
    grid=NeedleGrid(
        lengths=[128, 300],
        depths=[10.0, 90.5],
        trials=3,
        needles=4,
        ask=2,
        haystack="h.txt",
        max_new_tokens=5,
        seed=9,
        digits=2,
        instruction=False,
    ),
    out="o",
)
VNIAH = VniahConfig(
    model=MODEL,
    vqgan="v.safetensors",
    frames=[1, 5],
    depths=[50.0],
    trials=2,
    methods=["ll"],
    pool=3,
    max_new_tokens=2,
    seed=4,
    out="o",
)
RETRIEVAL = RetrievalConfig(
    out=Path("o"),
    n=7,
    heldout=3,
    needles=3,
    ask=1,
    digits=2,
    filler=4,
    haystack=Path("h.txt"),
    form="chat",
    lengths=[90, 200],
    tokenizer=Path("t.model"),
    numberless=True,
    instruction=False,
)


@pytest.mark.parametrize(
    "module, config",
    [(needle, NEEDLE), (vniah, VNIAH), (make_retrieval, RETRIEVAL)],
    ids=["needle", "vniah", "make_retrieval"],
)
def test_every_field_is_an_option_and_the_command_line_gives_the_config_back(module, config):
    parser, argv = module.build_parser(), to_argv(config)
    assert from_args(type(config), parser.parse_args(argv)) == config
    flags = {a.option_strings[0] for a in parser._actions if a.dest != "help"}
    assert flags == {w for w in argv if w.startswith("--")}  # each field away from its default, named


def test_defaults_are_the_commands():
    grid = from_args(NeedleConfig, needle.build_parser().parse_args(["--model", "m"])).grid
    assert (grid.lengths, grid.depths, grid.trials, grid.needles, grid.ask) == (
        [1024, 2048],
        [0, 25, 50, 75, 100],
        2,
        1,
        None,
    )
    assert (grid.haystack, grid.max_new_tokens, grid.seed, grid.digits, grid.instruction) == (None, 16, 0, 7, True)
    v = from_args(VniahConfig, vniah.build_parser().parse_args(["--model", "m"]))
    assert (v.frames, v.depths, v.trials, v.methods, v.pool, v.max_new_tokens, v.seed, v.out) == (
        [2, 4, 6],
        [0, 25, 50, 75, 100],
        4,
        ["generated", "ll"],
        20,
        4,
        0,
        "results/vniah",
    )
    r = from_args(RetrievalConfig, make_retrieval.build_parser().parse_args(["--out", "o"]))
    assert (r.n, r.heldout, r.needles, r.ask, r.digits, r.filler, r.form, r.lengths) == (
        4000,
        200,
        4,
        2,
        1,
        6,
        "plain",
        [128, 512],
    )
    assert not r.numberless and r.instruction and to_argv(r) == ["--out", "o"]


def test_retrieval_fields_take_effect(tmp_path):
    """digits, filler and haystack (the others: tests/integration/test_needle.py, tests/integration/test_learning.py)."""
    hay = tmp_path / "hay.txt"
    hay.write_text("alpha beta gamma delta epsilon zeta eta theta iota kappa")
    config = RetrievalConfig(out=tmp_path / "r", n=40, heldout=1, needles=2, ask=1, digits=3, filler=2, haystack=hay)
    assert make_retrieval.run(config) == 0
    rows = [json.loads(line) for line in open(tmp_path / "r" / "train.jsonl")]
    assert all(100 <= int(r["a0"][:-1]) <= 999 for r in rows)
    filler = [w for r in rows for w in r["context"].split() if w.islower() and w in hay.read_text().split()]
    assert (
        filler
        and max(len(chunk.split()) for r in rows for chunk in r["context"].split(".") if "magic" not in chunk) <= 2
    )
    with pytest.raises(ValueError, match="--filler 20"):
        make_retrieval.run(RetrievalConfig(out=tmp_path / "x", filler=20, haystack=hay))


def test_a_command_runs_in_a_child_given_its_config(tmp_path):
    hay = tmp_path / "hay.txt"  # its own haystack: the sample's text.jsonl is made by other tests
    hay.write_text("alpha beta gamma delta epsilon zeta eta theta iota kappa")
    config = RetrievalConfig(out=tmp_path / "r", n=3, heldout=2, needles=1, ask=1, haystack=hay)
    assert run_in_child(make_retrieval.run, config, env=single_process_env()) == 0
    assert len((tmp_path / "r" / "train.jsonl").read_text().splitlines()) == 3
    assert run_in_child(make_retrieval.run, RetrievalConfig(out=tmp_path / "bad", n=0)) == 1  # a ValueError


def test_the_child_reads_json_and_runs_only_lwms_own_functions(monkeypatch):
    """Nothing crosses to the child pickled: the message is JSON, and a name outside lwm is refused."""
    import io
    import json

    from lwm import child

    given = []
    monkeypatch.setattr(
        child.subprocess, "run", lambda cmd, input, env, stderr: given.append(input) or type("P", (), {"returncode": 0})
    )
    config = RetrievalConfig(out="unused", n=3)
    assert run_in_child(make_retrieval.run, config) == 0
    message = json.loads(given[0])
    assert message["run"] == "lwm.synth.make_retrieval:run" and message["values"]["n"] == 3
    for name in ("os:system", "builtins:eval", "lwm.synth.make_retrieval:run.__globals__"):
        bad = json.dumps({**message, "run": name}).encode()
        monkeypatch.setattr(child.sys, "stdin", type("S", (), {"buffer": io.BytesIO(bad)}))
        with pytest.raises(ValueError, match="lwm's own module-level functions"):
            child.main()
