"""Command-line options that name a device, a count or a sampling setting are refused by argparse (exit 2,
the option named) before any model loads: nan, inf and values out of range among them."""

from __future__ import annotations

import pytest

from lwm.infer.cli import parse_args


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--device", "cpux"], "argument --device: expected cpu, cuda or cuda:N, got 'cpux'"),
        (["--device", "cuda:99"], "argument --device: 'cuda:99': this machine has"),
        (["--max-frames", "-2"], "argument --max-frames: expected a positive integer, got '-2'"),
        (["--temperature", "nan"], "argument --temperature: expected a finite number >= 0, got 'nan'"),
        (["--temperature", "inf"], "argument --temperature: expected a finite number >= 0, got 'inf'"),
        (["--temperature", "-0.5"], "argument --temperature: expected a finite number >= 0, got '-0.5'"),
        (["--top-k", "0"], "argument --top-k: expected a positive integer, got '0'"),
        (["--max-new-tokens", "-1"], "argument --max-new-tokens: expected a positive integer, got '-1'"),
        (["--fps", "nan"], "argument --fps: expected a positive number, got 'nan'"),
        (["--seed", str(2**64)], "argument --seed: expected an integer in [-2**63, 2**64)"),
        (["--prefill-chunk", "0"], "argument --prefill-chunk: expected a positive integer, got '0'"),
    ],
)
def test_lwm_generate_refuses_bad_options(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--model", str(tmp_path), "--prompt", "x", *extra])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
