"""The code is formatted and linted as pyproject.toml's [tool.ruff] says: `ruff format` and
`ruff check` find nothing to change, so CI (which runs the test suite) fails on a style slip."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lwm.paths import REPO

ROOT = REPO


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]])
def test_ruff_finds_nothing(command):
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"ruff {' '.join(command)} .:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
