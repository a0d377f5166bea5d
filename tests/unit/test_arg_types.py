"""lwm/arg_types.py: a command's parser built from its config dataclass (option, add_options, from_args)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from lwm.arg_types import add_options, csv_list, from_args, option, positive_int
from lwm.infer.runtime import ModelOptions, add_model_args


@dataclass(kw_only=True)
class Inner:
    size: int = option("a size", 3)


@dataclass(kw_only=True)
class Command:
    inputs: list[str] = option("files", positional=True, nargs="+")
    out: str = option("output folder")
    inner: Inner = field(default_factory=Inner)
    fps: float | None = option("rate", None, type=float, exclusive="rate")
    count: int | None = option("count", None, type=positive_int, exclusive="rate")
    names: list[str] = option("names", default_factory=lambda: ["a", "b"], type=csv_list)
    progress: bool = option("no bar", True, flag="--no-progress", action="store_false")
    kind: str = option("kind", "x", choices=["x", "y"], metavar="K")
    derived: int = 0  # not an option


def parse(argv):
    return from_args(Command, add_options(argparse.ArgumentParser(), Command).parse_args(argv))


def test_fields_become_options_and_back():
    c = parse(["a.mp4", "b.mp4", "--out", "o", "--size", "5", "--count", "4", "--names", "p,q", "--no-progress"])
    assert c == Command(
        inputs=["a.mp4", "b.mp4"], out="o", inner=Inner(size=5), count=4, names=["p", "q"], progress=False, kind="x"
    )
    d = parse(["a", "--out", "o"])
    assert (d.inner.size, d.fps, d.count, d.names, d.progress) == (3, None, None, ["a", "b"], True)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["a"], "the following arguments are required: --out"),
        (["a", "--out", "o", "--fps", "1", "--count", "2"], "argument --count: not allowed with argument --fps"),
        (["a", "--out", "o", "--count", "0"], "argument --count: expected a positive integer, got '0'"),
        (["a", "--out", "o", "--size", "x"], "argument --size: invalid int value: 'x'"),
        (["a", "--out", "o", "--kind", "z"], "argument --kind: invalid choice: 'z'"),
    ],
)
def test_argparse_refuses_as_declared(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_an_option_declared_twice_is_refused():
    @dataclass
    class Twice:
        inner: Inner = field(default_factory=Inner)
        size: int = option("again", 1)

    with pytest.raises(TypeError, match="option 'size' is declared twice"):
        add_options(argparse.ArgumentParser(), Twice)


def test_model_options_are_the_model_args():
    p = argparse.ArgumentParser()
    add_model_args(p)
    loaded = from_args(ModelOptions, p.parse_args(["--model", "m", "--dtype", "float32", "--prefill-chunk", "64"]))
    assert loaded == ModelOptions(model="m", dtype="float32", prefill_chunk=64)
    assert (loaded.tokenizer, loaded.device, loaded.layout) == (None, None, "striped")
