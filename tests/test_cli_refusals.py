"""Command-line options that name a device or a count are refused by argparse (exit 2, the option
named) before any model loads."""

from __future__ import annotations

import pytest

from lwm.infer.cli import parse_args


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--device", "cpux"], "argument --device: expected cpu, cuda or cuda:N, got 'cpux'"),
        (["--device", "cuda:99"], "argument --device: 'cuda:99': this machine has"),
        (["--max-frames", "-2"], "argument --max-frames: expected a positive integer, got '-2'"),
    ],
)
def test_lwm_generate_refuses_bad_options(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--model", str(tmp_path), "--prompt", "x", *extra])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
